package limiter_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"github.com/redis/go-redis/v9"

	"github.com/redline-dev/redline/internal/limiter"
)

// peekLimit is a day-long limit of 5 (a burst of 5 for TokenBucket).
func peekLimit(alg limiter.Algorithm) limiter.Limit {
	return limiter.Limit{Algorithm: alg, Requests: 5, Window: 24 * time.Hour, Replicas: 1}
}

// peekClockMS is Redis's clock in ms, waiting out the last two minutes of a day-long window so
// that no test window rolls while it runs.
func peekClockMS(t *testing.T, c redis.UniversalClient) int64 {
	t.Helper()
	day := (24 * time.Hour).Milliseconds()
	for {
		now, err := c.Time(context.Background()).Result()
		if err != nil {
			t.Fatalf("TIME: %v", err)
		}
		ms := now.UnixMilli()
		if day-ms%day > (2 * time.Minute).Milliseconds() {
			return ms
		}
		time.Sleep(time.Second) // the day's end: wait for the next window, polled
	}
}

// sameAnswer checks a dry run against the decision made right after it: the same verdict and
// remaining, and retry and reset apart by no more than the time between the two.
func sameAnswer(g Gomega, peek, got limiter.Result, between time.Duration, what string) {
	g.Expect(peek.Allowed).To(Equal(got.Allowed), what)
	g.Expect(peek.OverLimit).To(Equal(got.OverLimit), what)
	g.Expect(peek.Remaining).To(Equal(got.Remaining), what)
	slack := between + 2*time.Millisecond
	if got.RetryAfter < 0 {
		g.Expect(peek.RetryAfter).To(Equal(got.RetryAfter), what)
	} else {
		g.Expect(peek.RetryAfter).To(BeNumerically("~", got.RetryAfter, slack), what)
	}
	g.Expect(peek.ResetAfter).To(BeNumerically("~", got.ResetAfter, slack), what)
}

// stateOf is every key of a limit's state, dumped with its absolute expiry: what a dry run
// must leave byte for byte as it found it.
func stateOf(t *testing.T, c redis.UniversalClient, key string) map[string]string {
	t.Helper()
	ctx := context.Background()
	keys, err := c.Keys(ctx, key+"*").Result()
	if err != nil {
		t.Fatalf("KEYS: %v", err)
	}
	out := map[string]string{}
	for _, k := range keys {
		dump, err := c.Dump(ctx, k).Result()
		if err != nil {
			t.Fatalf("DUMP %s: %v", k, err)
		}
		exp, err := c.PExpireTime(ctx, k).Result()
		if err != nil {
			t.Fatalf("PEXPIRETIME %s: %v", k, err)
		}
		out[k] = fmt.Sprintf("%x@%d", dump, exp)
	}
	return out
}

// At every point of a window, a dry run answers what the next decision gets, for each
// algorithm: from an empty key through the limit and past it, with costs that fit and that do
// not, and with a cost the limit can never admit.
func TestPeekIsTheNextDecision(t *testing.T) {
	allAlgorithms(t, func(t *testing.T, alg limiter.Algorithm) {
		g := NewWithT(t)
		c := newClient(t, shared.URL())
		l := newLimiter(t, c, limiter.TestOptions{PrecheckSize: -1})
		key, lim := uniqueKey(t), peekLimit(alg)
		peekClockMS(t, c)
		for i, cost := range []int64{1, 2, 6, 1, 3, 1, 1, 2, 1, 1} {
			start := time.Now()
			peek, err := l.Peek(context.Background(), key, lim, cost)
			g.Expect(err).NotTo(HaveOccurred())
			got, err := l.Allow(context.Background(), key, lim, cost)
			g.Expect(err).NotTo(HaveOccurred())
			sameAnswer(g, peek, got, time.Since(start), fmt.Sprintf("step %d, cost %d: dry run %+v, decision %+v", i, cost, peek, got))
		}
	})
}

// The state a decision finds beyond its own window: SlidingWindowCounter's weighted previous
// window, FixedWindow's debt carried from it, and a log with expired members the decision
// trims and the dry run does not.
func TestPeekSeesWhatTheDecisionSees(t *testing.T) {
	ctx := context.Background()
	day := (24 * time.Hour).Milliseconds()
	for _, tc := range []struct {
		name string
		alg  limiter.Algorithm
		seed func(c redis.UniversalClient, sk string, now int64)
	}{
		{"SlidingWindowCounter after a busy window", limiter.SlidingWindowCounter, func(c redis.UniversalClient, sk string, now int64) {
			c.HSet(ctx, sk+":swc", "s", now-now%day-day, "c", 4)
			c.PExpire(ctx, sk+":swc", time.Hour)
		}},
		{"FixedWindow after a debt", limiter.FixedWindow, func(c redis.UniversalClient, sk string, now int64) {
			c.HSet(ctx, sk+":swc", "s", now-now%day-day, "c", 8)
			c.PExpire(ctx, sk+":swc", time.Hour)
		}},
		{"SlidingWindowLog with expired members", limiter.SlidingWindowLog, func(c redis.UniversalClient, sk string, now int64) {
			for i, score := range []int64{now - 3*day, now - 2*day, now - day - 10, now - 1000, now - 500} {
				c.ZAdd(ctx, sk+":swl", redis.Z{Score: float64(score), Member: fmt.Sprintf("%017d", i+1)})
			}
			c.PExpire(ctx, sk+":swl", time.Hour)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			c := newClient(t, shared.URL())
			l := newLimiter(t, c, limiter.TestOptions{PrecheckSize: -1})
			key, lim := uniqueKey(t), peekLimit(tc.alg)
			tc.seed(c, key, peekClockMS(t, c))
			for i, cost := range []int64{1, 1, 2, 1, 1, 1} {
				start := time.Now()
				peek, err := l.Peek(ctx, key, lim, cost)
				g.Expect(err).NotTo(HaveOccurred())
				got, err := l.Allow(ctx, key, lim, cost)
				g.Expect(err).NotTo(HaveOccurred())
				sameAnswer(g, peek, got, time.Since(start), fmt.Sprintf("step %d, cost %d: dry run %+v, decision %+v", i, cost, peek, got))
			}
		})
	}
}

// Dry runs count nothing: any number of them leave every key of the state byte for byte as it
// was, TTLs included, create no key where there is none, and the next decision is unchanged.
func TestPeekWritesNothing(t *testing.T) {
	allAlgorithms(t, func(t *testing.T, alg limiter.Algorithm) {
		g := NewWithT(t)
		ctx := context.Background()
		c := newClient(t, shared.URL())
		l := newLimiter(t, c, limiter.TestOptions{PrecheckSize: -1})
		lim := peekLimit(alg)
		peekClockMS(t, c)

		fresh := uniqueKey(t)
		for range 20 {
			_, err := l.Peek(ctx, fresh, lim, 1)
			g.Expect(err).NotTo(HaveOccurred())
		}
		g.Expect(stateOf(t, c, fresh)).To(BeEmpty(), "a dry run creates no key")

		key := uniqueKey(t)
		admitted, _ := allowN(t, l, key, lim, 1, 3)
		g.Expect(admitted).To(Equal(3))
		before := stateOf(t, c, key)
		g.Expect(before).NotTo(BeEmpty())
		for i := range 100 {
			_, err := l.Peek(ctx, key, lim, int64(1+i%7))
			g.Expect(err).NotTo(HaveOccurred())
		}
		g.Expect(stateOf(t, c, key)).To(Equal(before), "100 dry runs changed the state")
		admitted, _ = allowN(t, l, key, lim, 1, 5)
		g.Expect(admitted).To(Equal(2), "the limit's 2 left are still there")
	})
}

// A lease this limiter holds is what its next decision admits from: the dry run says so,
// and takes nothing from it.
func TestPeekSeesTheLease(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	c := newClient(t, shared.URL())
	l := newLimiter(t, c, limiter.TestOptions{PrecheckSize: -1, LeaseHorizon: time.Hour})
	lim := limiter.Limit{Algorithm: limiter.FixedWindow, Requests: 1000, Window: 24 * time.Hour, Replicas: 1}
	key := uniqueKey(t)
	peekClockMS(t, c)
	var leased bool
	for range 50 {
		r, err := l.Allow(ctx, key, lim, 1)
		g.Expect(err).NotTo(HaveOccurred())
		if r.Source == limiter.SourceLease {
			leased = true
			break
		}
	}
	g.Expect(leased).To(BeTrue(), "the limiter leases under steady demand")
	before := stateOf(t, c, key)
	peek, err := l.Peek(ctx, key, lim, 1)
	g.Expect(err).NotTo(HaveOccurred())
	got, err := l.Allow(ctx, key, lim, 1)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(peek.Source).To(Equal(limiter.SourceLease))
	g.Expect(got.Source).To(Equal(limiter.SourceLease))
	g.Expect(peek.Remaining).To(Equal(got.Remaining))
	g.Expect(stateOf(t, c, key)).To(Equal(before), "admitting from a lease writes nothing either")
}
