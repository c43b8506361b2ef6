package limiter_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redline-dev/redline/internal/limiter"
)

// BenchmarkReserveSettle is one hold per op: a reserve and its settle (half its units back),
// two Redis calls, beside BenchmarkLimiter's one decision per op. With shares, as the sidecar
// runs.
func BenchmarkReserveSettle(b *testing.B) {
	for _, alg := range []limiter.Algorithm{limiter.FixedWindow, limiter.TokenBucket, limiter.SlidingWindowLog} {
		for _, n := range []int{1, 16} {
			b.Run(fmt.Sprintf("%s/callers=%d", alg, n), func(b *testing.B) {
				c, h := benchClient(b)
				l, err := limiter.NewWith(c, limiter.TestOptions{ReplicaID: limiter.NewReplicaID()})
				if err != nil {
					b.Fatal(err)
				}
				defer l.Close()
				lim := limiter.Limit{Algorithm: alg, Requests: 1 << 40, Window: time.Hour}
				keys := benchKeyNames("hold" + string(alg))
				b.ReportAllocs()
				concurrently(b, n, func(i int64) error {
					ctx := context.Background()
					_, hd, err := l.Reserve(ctx, keys[i%benchKeys], lim, 10, 100, time.Minute)
					if err != nil {
						return err
					}
					if hd == nil || hd.Degraded {
						return fmt.Errorf("no hold from Redis: %+v", hd)
					}
					_, err = l.Settle(ctx, hd, 50)
					return err
				})
				report(b, h)
			})
		}
	}
}

// What an open hold costs Redis: its record in the key's zset (MEMORY USAGE of the zset over
// the holds it keeps), at 1,000 and 10,000 open holds of one key. The zset is a listpack up to
// 128 members and a skiplist beyond, so the cost per hold grows once, then stays.
func TestHoldMemory(t *testing.T) {
	c := newClient(t, shared.URL())
	l := newLimiter(t, c, limiter.TestOptions{ReplicaID: limiter.NewReplicaID(), MaxHolds: 20000, MaxOpenHolds: 20000})
	ctx, key := context.Background(), uniqueKey(t)
	lim := holdLimit(limiter.FixedWindow, 1<<40)
	var holds []*limiter.Hold
	for _, n := range []int{1000, 10000} {
		for len(holds) < n {
			_, h, err := l.Reserve(ctx, key, lim, 1, 4096, time.Hour)
			if err != nil || h == nil {
				t.Fatalf("reserving: %v", err)
			}
			holds = append(holds, h)
		}
		bytes, err := c.MemoryUsage(ctx, key+":swc:h", 0).Result()
		if err != nil {
			t.Fatal(err)
		}
		per := float64(bytes) / float64(n)
		t.Logf("%d open holds: zset %d bytes, %.1f bytes a hold in Redis", n, bytes, per)
		if per > 200 {
			t.Errorf("%.1f bytes a hold in Redis, want at most 200", per)
		}
	}
	for _, h := range holds {
		if _, err := l.Settle(ctx, h, 1); err != nil {
			t.Fatal(err)
		}
	}
	if n := c.ZCard(ctx, key+":swc:h").Val(); n != 0 {
		t.Errorf("%d records left after every settle", n)
	}
}
