package limiter_test

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"github.com/redis/go-redis/v9"

	"github.com/redline-dev/redline/internal/keyscheme"
	"github.com/redline-dev/redline/internal/limiter"
)

// The largest SlidingWindowLog rule the API admits (v1alpha1.MaxSlidingWindowLogRequests per
// the longest window): the engine must stay cheap and small at it, whatever the cost asked.
var largestLog = limiter.Limit{Algorithm: limiter.SlidingWindowLog, Requests: 10_000, Window: 24 * time.Hour}

// A cost above what a limit can ever admit is refused as never admissible without a Redis
// call, whatever its size; a cost below 1 is an error.
func TestCostAboveCapacityIsRefusedWithoutRedis(t *testing.T) {
	allAlgorithms(t, func(t *testing.T, alg limiter.Algorithm) {
		g := NewWithT(t)
		c := newClient(t, shared.URL())
		evals := &evalCounter{}
		c.AddHook(evals)
		l := newLimiter(t, c, limiter.TestOptions{PrecheckSize: -1})
		lim := limiter.Limit{Algorithm: alg, Requests: 100, Window: time.Minute}
		if alg == limiter.TokenBucket {
			lim.Burst = 50
		}
		for _, cost := range []int64{lim.Capacity() + 1, 20_000_000, math.MaxInt64} {
			r, err := l.Allow(context.Background(), uniqueKey(t), lim, cost)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(r.Allowed).To(BeFalse(), "cost %d", cost)
			g.Expect(r.OverLimit).To(BeTrue(), "cost %d", cost)
			g.Expect(r.RetryAfter).To(Equal(time.Duration(-1)), "cost %d", cost)
			g.Expect(r.Source).To(Equal(limiter.SourceCapacity), "cost %d", cost)
		}
		g.Expect(evals.n.Load()).To(BeZero(), "a never-admissible cost must not reach Redis")

		for _, cost := range []int64{0, -1, math.MinInt64} {
			_, err := l.Allow(context.Background(), uniqueKey(t), lim, cost)
			g.Expect(err).To(MatchError(limiter.ErrInvalidLimit), "cost %d", cost)
		}

		// The capacity itself is admissible and goes to Redis.
		r, err := l.Allow(context.Background(), uniqueKey(t), lim, lim.Capacity())
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(r.Allowed).To(BeTrue())
		g.Expect(r.Source).To(Equal(limiter.SourceRedis))
	})
}

// logMembers returns the number of members and the bytes Redis holds for a SlidingWindowLog key.
func logMembers(t *testing.T, c redis.UniversalClient, key string) (members, bytes int64) {
	t.Helper()
	sk := key + ":swl" // the state key of the log, see stateKey
	members, err := c.ZCard(context.Background(), sk).Result()
	if err != nil {
		t.Fatalf("ZCARD: %v", err)
	}
	bytes, err = c.MemoryUsage(context.Background(), sk).Result()
	if err != nil && err != redis.Nil {
		t.Fatalf("MEMORY USAGE: %v", err)
	}
	return members, bytes
}

// The cost bomb of issue 10: costs in the millions on the largest legal SlidingWindowLog rule.
// Before, one member was stored per unit of cost (253 MB for cost 2,000,000, Redis BUSY for
// seconds at 20,000,000). Now each request is one member whatever its cost, so the log stays
// within the limit's size, and Redis's own SLOWLOG records no script of a second or more (the
// bomb held Redis for seconds; a loaded machine's preemption of a bounded script stays far
// below that: 53 ms seen at a load average of 20).
func TestCostBombOnLargestLogRuleKeepsRedisSmallAndResponsive(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	admin := newClient(t, shared.URL())
	g.Expect(admin.ConfigSet(ctx, "slowlog-log-slower-than", "1000000").Err()).To(Succeed()) // 1 s
	t.Cleanup(func() { _ = admin.ConfigSet(ctx, "slowlog-log-slower-than", "10000").Err() })
	g.Expect(admin.SlowLogReset(ctx).Err()).To(Succeed())

	l := direct(t)
	key := uniqueKey(t)

	// The whole limit in one request is one member.
	r, err := l.Allow(ctx, key, largestLog, largestLog.Requests)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(r.Allowed).To(BeTrue())
	members, bytes := logMembers(t, admin, key)
	g.Expect(members).To(Equal(int64(1)))
	g.Expect(bytes).To(BeNumerically("<", 1024))

	for _, cost := range []int64{2_000_000, 20_000_000, 1_000_000_000} {
		r, err := l.Allow(ctx, key, largestLog, cost)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(r.RetryAfter).To(Equal(time.Duration(-1)), "cost %d", cost)
	}
	r, err = l.Allow(ctx, key, largestLog, 1)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(r.Allowed).To(BeFalse(), "the log is full")
	g.Expect(r.RetryAfter).To(BeNumerically(">", 23*time.Hour))

	// A log filled by requests of cost 1 holds one member per request: memory follows requests.
	key = uniqueKey(t)
	admitted := 0
	for range largestLog.Requests + 10 {
		r, err := l.Allow(ctx, key, largestLog, 1)
		g.Expect(err).NotTo(HaveOccurred())
		if r.Allowed {
			admitted++
		}
	}
	g.Expect(admitted).To(Equal(int(largestLog.Requests)))
	members, bytes = logMembers(t, admin, key)
	g.Expect(members).To(Equal(largestLog.Requests))
	t.Logf("full log of %d requests: %d bytes (%d per request)", members, bytes, bytes/members)
	g.Expect(bytes).To(BeNumerically("<", 2<<20), "a full log of the largest legal limit stays near 1 MB")

	g.Expect(admin.Ping(ctx).Err()).To(Succeed())
	slow, err := admin.SlowLogGet(ctx, 16).Result()
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(slow).To(BeEmpty(), "no command ran for a second or more")
}

// The running totals make the log exact with mixed costs: what leaves the window frees exactly
// its cost, and the retry-after of a refusal is when enough has left.
func TestSlidingWindowLogFreesExactlyTheCostThatLeaves(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	l := direct(t)
	key := uniqueKey(t)
	lim := limiter.Limit{Algorithm: limiter.SlidingWindowLog, Requests: 10, Window: 600 * time.Millisecond}

	_, first := allowN(t, l, key, lim, 3, 1)
	g.Expect(first.Allowed).To(BeTrue())
	time.Sleep(200 * time.Millisecond)
	_, second := allowN(t, l, key, lim, 6, 1)
	g.Expect(second.Allowed).To(BeTrue())
	g.Expect(second.Remaining).To(Equal(int64(1)))

	// 4 needs the first request (3) gone, not the second: retry-after is about 400 ms, not 600.
	r, err := l.Allow(ctx, key, lim, 4)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(r.Allowed).To(BeFalse())
	g.Expect(r.RetryAfter).To(BeNumerically("<=", 400*time.Millisecond))
	g.Expect(r.RetryAfter).To(BeNumerically(">", 0))
	time.Sleep(r.RetryAfter)
	r, err = l.Allow(ctx, key, lim, 4)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(r.Allowed).To(BeTrue(), "after the first request left the window")
	g.Expect(r.Remaining).To(Equal(int64(0)))

	// After a whole window without requests everything is free again, and the members that
	// left were trimmed.
	time.Sleep(lim.Window + 50*time.Millisecond)
	r, err = l.Allow(ctx, key, lim, 10)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(r.Allowed).To(BeTrue())
	members, _ := logMembers(t, newClient(t, shared.URL()), key)
	g.Expect(members).To(BeNumerically("<=", 2), "one anchor of the expired requests and the new one")
}

// BenchmarkSlowestScriptCall measures, with Redis's own SLOWLOG, the slowest script call at the
// largest legal limit and cost of each algorithm, in the states that cost the most: a full
// SlidingWindowLog refusing (binary search over its members) and trimming a full window of
// expired members. The max-µs metric is the slowest call SLOWLOG recorded.
func BenchmarkSlowestScriptCall(b *testing.B) {
	ctx := context.Background()
	c, _ := benchClient(b)
	full := func(b *testing.B, window time.Duration) string {
		b.Helper()
		// Fill a log as the script would, one member per request of cost 1, in one pipeline.
		key := keyscheme.Key("bench", "slowest", b.Name(), strconv.FormatInt(time.Now().UnixNano(), 10))
		now, err := c.Time(ctx).Result()
		if err != nil {
			b.Fatal(err)
		}
		pipe := c.Pipeline()
		ms := now.UnixMilli()
		for i := int64(1); i <= largestLog.Requests; i++ {
			pipe.ZAdd(ctx, key+":swl", redis.Z{Score: float64(ms), Member: fmt.Sprintf("%017d", i)})
		}
		pipe.PExpire(ctx, key+":swl", window)
		if _, err := pipe.Exec(ctx); err != nil {
			b.Fatal(err)
		}
		return key
	}
	cases := []struct {
		name  string
		limit limiter.Limit
		cost  int64
		key   func(b *testing.B) string
	}{
		{"FixedWindow", limiter.Limit{Algorithm: limiter.FixedWindow, Requests: 1e9, Window: 24 * time.Hour}, 1e9, nil},
		{"SlidingWindowCounter", limiter.Limit{Algorithm: limiter.SlidingWindowCounter, Requests: 1e9, Window: 24 * time.Hour}, 1e9, nil},
		{"TokenBucket", limiter.Limit{Algorithm: limiter.TokenBucket, Requests: 1e9, Burst: 1e9, Window: 24 * time.Hour}, 1e9, nil},
		{"SlidingWindowLog/full-refusing", largestLog, 5_000, func(b *testing.B) string { return full(b, largestLog.Window) }},
		{"SlidingWindowLog/full-expired", limiter.Limit{Algorithm: limiter.SlidingWindowLog, Requests: 10_000, Window: time.Second}, 10_000,
			func(b *testing.B) string { return full(b, time.Second) }},
	}
	for _, tc := range cases {
		b.Run(tc.name, func(b *testing.B) {
			l, err := limiter.NewWith(c, limiter.TestOptions{PrecheckSize: -1, MaxBatch: 1})
			if err != nil {
				b.Fatal(err)
			}
			defer l.Close()
			key := keyscheme.Key("bench", "slowest", tc.name)
			if tc.key != nil {
				key = tc.key(b)
				if tc.name == "SlidingWindowLog/full-expired" {
					time.Sleep(time.Second) // every member has left the window
				}
			}
			if err := c.ConfigSet(ctx, "slowlog-log-slower-than", "0").Err(); err != nil {
				b.Fatal(err)
			}
			defer c.ConfigSet(ctx, "slowlog-log-slower-than", "10000")
			if err := c.SlowLogReset(ctx).Err(); err != nil {
				b.Fatal(err)
			}
			var slowest time.Duration
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if _, err := l.Allow(ctx, key, tc.limit, tc.cost); err != nil {
					b.Fatal(err)
				}
				if i%100 == 99 || i == b.N-1 {
					slowest = max(slowest, slowestEval(b, c))
				}
			}
			b.StopTimer()
			b.ReportMetric(float64(slowest.Microseconds()), "max-µs")
		})
	}
}

// slowestEval reads and clears SLOWLOG and returns its slowest EVALSHA.
func slowestEval(b *testing.B, c redis.UniversalClient) time.Duration {
	ctx := context.Background()
	entries, err := c.SlowLogGet(ctx, 128).Result()
	if err != nil {
		b.Fatal(err)
	}
	if err := c.SlowLogReset(ctx).Err(); err != nil {
		b.Fatal(err)
	}
	var slowest time.Duration
	for _, e := range entries {
		if len(e.Args) > 0 && (e.Args[0] == "evalsha" || e.Args[0] == "EVALSHA") {
			slowest = max(slowest, e.Duration)
		}
	}
	return slowest
}
