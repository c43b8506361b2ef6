package limiter_test

import (
	"context"
	"math"
	"strconv"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"github.com/redis/go-redis/v9"

	"github.com/redline-dev/redline/internal/limiter"
)

// longWindow never rolls during a test: windows are aligned to multiples of the window on
// Redis's clock, and this one's next boundary is decades away.
const longWindow = 50 * 365 * 24 * time.Hour

func holdLimit(alg limiter.Algorithm, requests int64) limiter.Limit {
	return limiter.Limit{Algorithm: alg, Requests: requests, Window: longWindow, FailureMode: limiter.FailureModeClosed}
}

var holdAlgorithms = []limiter.Algorithm{limiter.FixedWindow, limiter.SlidingWindowCounter, limiter.TokenBucket, limiter.SlidingWindowLog}

// counted is what Redis counts of key now: c of the window state, the tokens a TokenBucket
// has taken (how far its TAT runs ahead of now, in intervals: the tests' windows refill
// nothing in their time), or a SlidingWindowLog's window cost (its newest running total less
// the newest one that left the window) plus what its open holds hold.
func counted(t *testing.T, c redis.UniversalClient, key string, lim limiter.Limit) int64 {
	t.Helper()
	ctx := context.Background()
	if lim.Algorithm == limiter.SlidingWindowLog {
		return logCost(t, c, key+":swl", lim.Window) + intOrZero(t, c.Get(ctx, key+":swl:held"))
	}
	if lim.Algorithm == limiter.TokenBucket {
		tat, err := c.Get(ctx, key+":tb").Float64()
		if err == redis.Nil {
			return 0
		}
		if err != nil {
			t.Fatal(err)
		}
		now := float64(redisNowMS(t, c)) * 1000
		interval := float64(lim.Window.Microseconds()) / float64(lim.Requests)
		return int64(math.Round(max(tat-now, 0) / interval))
	}
	n, err := c.HGet(ctx, key+":swc", "c").Int64()
	if err != nil && err != redis.Nil {
		t.Fatal(err)
	}
	return n
}

// logCost is the cost a sliding window log counts in the window ending now on Redis's clock.
func logCost(t *testing.T, c redis.UniversalClient, log string, window time.Duration) int64 {
	t.Helper()
	ctx := context.Background()
	newest, err := c.ZRange(ctx, log, -1, -1).Result()
	if err != nil || len(newest) == 0 {
		return 0
	}
	cutoff := strconv.FormatInt(redisNowMS(t, c)-window.Milliseconds(), 10)
	var base int64
	if left, err := c.ZRevRangeByScore(ctx, log, &redis.ZRangeBy{Min: "-inf", Max: cutoff, Count: 1}).Result(); err == nil && len(left) == 1 {
		base, _ = strconv.ParseInt(left[0], 10, 64)
	}
	total, err := strconv.ParseInt(newest[0], 10, 64)
	if err != nil {
		t.Fatalf("log %s: newest member %q: %v", log, newest[0], err)
	}
	return total - base
}

func intOrZero(t *testing.T, cmd *redis.StringCmd) int64 {
	t.Helper()
	n, err := cmd.Int64()
	if err != nil && err != redis.Nil {
		t.Fatal(err)
	}
	return n
}

func holdAll(t *testing.T, fn func(t *testing.T, alg limiter.Algorithm)) {
	for _, alg := range holdAlgorithms {
		t.Run(string(alg), func(t *testing.T) { fn(t, alg) })
	}
}

// A hold counts at once what it reserved, between the least and the most asked for; a settle
// gives the unused part back, once, however often it is called.
func TestHoldReserveSettle(t *testing.T) {
	holdAll(t, func(t *testing.T, alg limiter.Algorithm) {
		g := NewWithT(t)
		c := newClient(t, shared.URL())
		l := newLimiter(t, c, limiter.TestOptions{ReplicaID: limiter.NewReplicaID()})
		ctx, key, lim := context.Background(), uniqueKey(t), holdLimit(alg, 100)

		r, h, err := l.Reserve(ctx, key, lim, 10, 60, time.Minute)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(r.Allowed).To(BeTrue())
		g.Expect(h.Units).To(Equal(int64(60)))
		g.Expect(h.Degraded).To(BeFalse())
		g.Expect(h.Deadline).To(BeTemporally("~", time.Now().Add(time.Minute), 5*time.Second))

		// 40 left: the next hold gets what fits, at least its least.
		_, h2, err := l.Reserve(ctx, key, lim, 10, 60, time.Minute)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(h2.Units).To(Equal(int64(40)))
		r, h3, err := l.Reserve(ctx, key, lim, 1, 1, time.Minute)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(h3).To(BeNil())
		g.Expect(r.Allowed).To(BeFalse())
		g.Expect(r.RetryAfter).To(BeNumerically(">", 0))

		s, err := l.Settle(ctx, h, 25)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(s).To(Equal(limiter.Settled{Returned: 35}))
		again, err := l.Settle(ctx, h, 0)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(again).To(Equal(s), "a second settle changes nothing")
		g.Expect(counted(t, c, key, lim)).To(Equal(int64(65)))

		s, err = l.Settle(ctx, h2, 40)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(s).To(Equal(limiter.Settled{}))
		st := l.TestStats()
		g.Expect(st.HoldsReserved).To(Equal(uint64(2)))
		g.Expect(st.HoldsSettled).To(Equal(uint64(2)))
		g.Expect(st.HoldReturnedUnits).To(Equal(uint64(35)))
		g.Expect(st.HoldsOpen).To(BeZero())
	})
}

// What Reserve refuses to try.
func TestHoldInvalid(t *testing.T) {
	g := NewWithT(t)
	l := newLimiter(t, newClient(t, shared.URL()), limiter.TestOptions{})
	ctx, key := context.Background(), uniqueKey(t)
	_, _, err := l.Reserve(ctx, key, holdLimit(limiter.FixedWindow, 10), 0, 2, time.Second)
	g.Expect(err).To(MatchError(limiter.ErrInvalidLimit))
	_, _, err = l.Reserve(ctx, key, holdLimit(limiter.FixedWindow, 10), 3, 2, time.Second)
	g.Expect(err).To(MatchError(limiter.ErrInvalidLimit))
	_, _, err = l.Reserve(ctx, key, holdLimit(limiter.FixedWindow, 10), 1, 2, 0)
	g.Expect(err).To(MatchError(limiter.ErrInvalidLimit))
	r, h, err := l.Reserve(ctx, key, holdLimit(limiter.FixedWindow, 10), 11, 20, time.Second)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(h).To(BeNil())
	g.Expect(r.RetryAfter).To(Equal(time.Duration(-1)))
	_, err = l.Settle(ctx, nil, 1)
	g.Expect(err).To(HaveOccurred())
}

// A request that used more than its hold leaves a debt: reported in full, counted past the
// limit, so the key is refused until it is repaid. The window state counts it whole; the
// TokenBucket runs its TAT at most one window past the tolerance, and the log appends at most
// the hold plus one limit: either refuses the key as long as more would.
func TestHoldDebt(t *testing.T) {
	holdAll(t, func(t *testing.T, alg limiter.Algorithm) {
		g := NewWithT(t)
		c := newClient(t, shared.URL())
		l := newLimiter(t, c, limiter.TestOptions{ReplicaID: limiter.NewReplicaID()})
		ctx, key, lim := context.Background(), uniqueKey(t), holdLimit(alg, 10)
		_, h, err := l.Reserve(ctx, key, lim, 1, 10, time.Minute)
		g.Expect(err).NotTo(HaveOccurred())
		s, err := l.Settle(ctx, h, 1000)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(s).To(Equal(limiter.Settled{Debt: 990}), "the whole excess is debt")
		g.Expect(l.TestStats().DebtUnits).To(Equal(uint64(990)))
		r, err := l.Allow(ctx, key, lim, 1)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(r.Allowed).To(BeFalse())
		g.Expect(r.Remaining).To(BeZero())
		want := map[limiter.Algorithm]int64{limiter.FixedWindow: 1000, limiter.SlidingWindowCounter: 1000, limiter.TokenBucket: 20, limiter.SlidingWindowLog: 20}
		g.Expect(counted(t, c, key, lim)).To(Equal(want[alg]))
	})
}

// FixedWindow carries a debt over its roll: the next window starts with what the last counted
// past the limit. TokenBucket repays it as it refills.
func TestHoldDebtRepaid(t *testing.T) {
	t.Run("FixedWindow", func(t *testing.T) {
		g := NewWithT(t)
		c := newClient(t, shared.URL())
		l := newLimiter(t, c, limiter.TestOptions{ReplicaID: limiter.NewReplicaID()})
		ctx, key := context.Background(), uniqueKey(t)
		lim := limiter.Limit{Algorithm: limiter.FixedWindow, Requests: 10, Window: 2 * time.Second, FailureMode: limiter.FailureModeClosed}
		start := freshWindow(t, c, lim.Window)
		_, h, err := l.Reserve(ctx, key, lim, 1, 10, time.Minute)
		g.Expect(err).NotTo(HaveOccurred())
		s, err := l.Settle(ctx, h, 14)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(s.Debt).To(Equal(int64(4)))
		g.Expect(redisNowMS(t, c)).To(BeNumerically("<", start+lim.Window.Milliseconds()), "reserve and settle in one window")
		waitRedisMS(t, c, start+lim.Window.Milliseconds())
		r, err := l.Allow(ctx, key, lim, 7)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(r.Allowed).To(BeFalse(), "the debt of 4 carried over: 6 left")
		r, err = l.Allow(ctx, key, lim, 6)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(r.Allowed).To(BeTrue())
		g.Expect(r.Remaining).To(BeZero())
	})
	t.Run("TokenBucket", func(t *testing.T) {
		g := NewWithT(t)
		c := newClient(t, shared.URL())
		l := newLimiter(t, c, limiter.TestOptions{})
		ctx, key := context.Background(), uniqueKey(t)
		lim := limiter.Limit{Algorithm: limiter.TokenBucket, Requests: 10, Window: time.Hour, FailureMode: limiter.FailureModeClosed}
		_, h, err := l.Reserve(ctx, key, lim, 1, 10, time.Minute)
		g.Expect(err).NotTo(HaveOccurred())
		_, err = l.Settle(ctx, h, 15)
		g.Expect(err).NotTo(HaveOccurred())
		r, err := l.Allow(ctx, key, lim, 1)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(r.Allowed).To(BeFalse())
		// Five tokens of debt, then one to take: six intervals of 6 minutes.
		g.Expect(r.RetryAfter).To(BeNumerically("~", 36*time.Minute, time.Minute))
	})
	t.Run("SlidingWindowLog", func(t *testing.T) {
		// The use is appended to the log at the settle, debt and all: refused until it has
		// left the window, a window after the settle.
		g := NewWithT(t)
		c := newClient(t, shared.URL())
		l := newLimiter(t, c, limiter.TestOptions{})
		ctx, key := context.Background(), uniqueKey(t)
		lim := limiter.Limit{Algorithm: limiter.SlidingWindowLog, Requests: 10, Window: time.Second, FailureMode: limiter.FailureModeClosed}
		_, h, err := l.Reserve(ctx, key, lim, 1, 10, time.Minute)
		g.Expect(err).NotTo(HaveOccurred())
		s, err := l.Settle(ctx, h, 14)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(s).To(Equal(limiter.Settled{Debt: 4}))
		settled := redisNowMS(t, c)
		r, err := l.Allow(ctx, key, lim, 1)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(r.Allowed).To(BeFalse(), "14 counted of 10")
		g.Expect(r.RetryAfter).To(BeNumerically("<=", lim.Window))
		waitRedisMS(t, c, settled+lim.Window.Milliseconds()+1)
		r, err = l.Allow(ctx, key, lim, 10)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(r.Allowed).To(BeTrue(), "the settle's member left the window")
	})
}

func redisNowMS(t *testing.T, c redis.UniversalClient) int64 {
	t.Helper()
	now, err := c.Time(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	return now.UnixMilli()
}

// freshWindow waits for a window of w that has at least most of it left, and returns its start.
func freshWindow(t *testing.T, c redis.UniversalClient, w time.Duration) int64 {
	t.Helper()
	ms := w.Milliseconds()
	now := redisNowMS(t, c)
	if now%ms > ms/4 {
		waitRedisMS(t, c, now-now%ms+ms)
		now = redisNowMS(t, c)
	}
	return now - now%ms
}

// waitRedisMS waits until Redis's clock has reached ms.
func waitRedisMS(t *testing.T, c redis.UniversalClient, ms int64) {
	t.Helper()
	for {
		now := redisNowMS(t, c)
		if now >= ms {
			return
		}
		time.Sleep(time.Duration(ms-now+1) * time.Millisecond)
	}
}

// Where the rule leases and the key's lease holds enough, a hold comes from it without a call;
// its unused units go back into the lease, and an excess to Redis as debt.
func TestHoldFromLease(t *testing.T) {
	g := NewWithT(t)
	c := newClient(t, shared.URL())
	calls := &evalCounter{}
	c.AddHook(calls)
	l := newLimiter(t, c, limiter.TestOptions{ReplicaID: limiter.NewReplicaID(), LeaseHorizon: time.Minute, MaxLease: 16})
	ctx, key := context.Background(), uniqueKey(t)
	lim := holdLimit(limiter.FixedWindow, 1_000_000)
	lim.Replicas = 1
	for range 2 { // a cold key asks for one unit, then for a warm lease
		r, err := l.Allow(ctx, key, lim, 1)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(r.Allowed).To(BeTrue())
	}
	g.Expect(counted(t, c, key, lim)).To(Equal(int64(17)), "one, then a lease of 16")
	before := calls.n.Load()

	r, h, err := l.Reserve(ctx, key, lim, 1, 10, time.Minute)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(r.Source).To(Equal(limiter.SourceLease))
	g.Expect(h.Units).To(Equal(int64(10)))
	s, err := l.Settle(ctx, h, 3)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(s).To(Equal(limiter.Settled{Returned: 7}))
	// 15 - 10 + 7 = 12 units left in the lease: twelve decisions without a call.
	for range 12 {
		r, err := l.Allow(ctx, key, lim, 1)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(r.Source).To(Equal(limiter.SourceLease))
	}
	g.Expect(calls.n.Load()).To(Equal(before), "no Redis call")
	g.Expect(counted(t, c, key, lim)).To(Equal(int64(17)))

	// A hold larger than the lease asks Redis; one that uses more than it held leaves a debt.
	_, h, err = l.Reserve(ctx, key, lim, 1, 100, time.Minute)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(h.Units).To(Equal(int64(100)))
	g.Expect(counted(t, c, key, lim)).To(Equal(int64(117)))
	g.Expect(l.Settle(ctx, h, 100)).To(Equal(limiter.Settled{}))
	for range 3 {
		_, err = l.Allow(ctx, key, lim, 1)
		g.Expect(err).NotTo(HaveOccurred())
	}
	c0 := counted(t, c, key, lim)
	r, h, err = l.Reserve(ctx, key, lim, 1, 2, time.Minute)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(r.Source).To(Equal(limiter.SourceLease), "the lease granted after the big hold holds 13")
	s, err = l.Settle(ctx, h, 9)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(s).To(Equal(limiter.Settled{Debt: 7}))
	g.Expect(counted(t, c, key, lim)).To(Equal(c0 + 7))
	g.Expect(l.TestStats().RestoredUnits).To(BeZero())
}
