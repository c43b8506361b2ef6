package limiter_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redline-dev/redline/internal/calendar"
	"github.com/redline-dev/redline/internal/keyscheme"
	"github.com/redline-dev/redline/internal/limiter"
	"github.com/redline-dev/redline/internal/limiter/scripts"
	"github.com/redline-dev/redline/internal/redisconn"
)

// roundTrips counts what a client sends to Redis: one per command, one per pipeline.
type roundTrips struct{ n atomic.Int64 }

func (h *roundTrips) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *roundTrips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { h.n.Add(1); return next(ctx, cmd) }
}
func (h *roundTrips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error { h.n.Add(1); return next(ctx, cmds) }
}

// concurrently runs b.N calls of fn spread over callers goroutines.
func concurrently(b *testing.B, callers int, fn func(i int64) error) {
	var next atomic.Int64
	var failed atomic.Value
	var wg sync.WaitGroup
	b.ResetTimer()
	for range callers {
		wg.Go(func() {
			for {
				i := next.Add(1)
				if i > int64(b.N) {
					return
				}
				if err := fn(i); err != nil {
					failed.Store(err)
					return
				}
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	if err := failed.Load(); err != nil {
		b.Fatal(err)
	}
}

const benchKeys = 1024

func benchKeyNames(prefix string) []string {
	keys := make([]string, benchKeys)
	for i := range keys {
		keys[i] = keyscheme.Key("bench", prefix, "rule", fmt.Sprint(i))
	}
	return keys
}

// bigLimit admits everything, so every decision runs the script's full write path.
var bigLimit = limiter.Limit{Algorithm: limiter.FixedWindow, Requests: 1 << 40, Window: time.Hour}

func benchClient(b *testing.B) (redis.UniversalClient, *roundTrips) {
	c, err := redisconn.NewClient(shared.URL(), redisconn.Options{PoolSize: 64, ReadTimeout: 5 * time.Second,
		WriteTimeout: 5 * time.Second, PoolTimeout: 5 * time.Second})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = c.Close() })
	if _, err := scripts.Load(context.Background(), c); err != nil {
		b.Fatal(err)
	}
	h := &roundTrips{}
	c.AddHook(h)
	return c, h
}

func report(b *testing.B, h *roundTrips) {
	b.ReportMetric(float64(h.n.Load())/float64(b.N), "roundtrips/op")
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "decisions/s")
}

var callerCounts = []int{1, 16, 256}

// BenchmarkNaiveIncrExpire is the racy two-call baseline: INCR, then EXPIRE.
func BenchmarkNaiveIncrExpire(b *testing.B) {
	for _, n := range callerCounts {
		b.Run(fmt.Sprintf("callers=%d", n), func(b *testing.B) {
			c, h := benchClient(b)
			keys := benchKeyNames("naive")
			b.ReportAllocs()
			concurrently(b, n, func(i int64) error {
				k := keys[i%benchKeys]
				if err := c.Incr(context.Background(), k).Err(); err != nil {
					return err
				}
				return c.Expire(context.Background(), k, time.Hour).Err()
			})
			report(b, h)
		})
	}
}

// BenchmarkEvalSha is one unbatched EVALSHA of the fixed-window script per decision.
func BenchmarkEvalSha(b *testing.B) {
	sha := scripts.SHAs()[string(limiter.FixedWindow)]
	for _, n := range callerCounts {
		b.Run(fmt.Sprintf("callers=%d", n), func(b *testing.B) {
			c, h := benchClient(b)
			keys := benchKeyNames("evalsha")
			b.ReportAllocs()
			concurrently(b, n, func(i int64) error {
				return c.EvalSha(context.Background(), sha, []string{keys[i%benchKeys] + ":swc"},
					bigLimit.Requests, bigLimit.Window.Milliseconds(), 1, 0).Err()
			})
			report(b, h)
		})
	}
}

// BenchmarkLimiter is this engine: batched EVALSHA with pre-check.
func BenchmarkLimiter(b *testing.B) {
	for _, n := range callerCounts {
		b.Run(fmt.Sprintf("callers=%d", n), func(b *testing.B) {
			c, h := benchClient(b)
			l, err := limiter.NewWith(c, limiter.TestOptions{})
			if err != nil {
				b.Fatal(err)
			}
			defer l.Close()
			keys := benchKeyNames("engine")
			b.ReportAllocs()
			concurrently(b, n, func(i int64) error {
				r, err := l.Allow(context.Background(), keys[i%benchKeys], bigLimit, 1)
				if err == nil && r.Source != limiter.SourceRedis {
					err = fmt.Errorf("decision from %s: %w", r.Source, r.Err)
				}
				return err
			})
			report(b, h)
		})
	}
}

// BenchmarkCalendarLimiter is BenchmarkLimiter on a calendar day (UTC): three candidate periods
// computed per decision, one key per period, no lease.
func BenchmarkCalendarLimiter(b *testing.B) {
	cal, err := calendar.New(calendar.Spec{Unit: calendar.Day})
	if err != nil {
		b.Fatal(err)
	}
	lim := limiter.Limit{Algorithm: limiter.FixedWindow, Requests: bigLimit.Requests, Window: cal.MaxLength(), Calendar: cal}
	for _, n := range callerCounts {
		b.Run(fmt.Sprintf("callers=%d", n), func(b *testing.B) {
			c, h := benchClient(b)
			l, err := limiter.NewWith(c, limiter.TestOptions{})
			if err != nil {
				b.Fatal(err)
			}
			defer l.Close()
			keys := benchKeyNames("calendar")
			b.ReportAllocs()
			concurrently(b, n, func(i int64) error {
				r, err := l.Allow(context.Background(), keys[i%benchKeys], lim, 1)
				if err == nil && r.Source != limiter.SourceRedis {
					err = fmt.Errorf("decision from %s: %w", r.Source, r.Err)
				}
				return err
			})
			report(b, h)
		})
	}
}
