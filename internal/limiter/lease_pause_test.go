package limiter_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/redline-dev/redline/internal/limiter"
	"github.com/redline-dev/redline/internal/redisconn"
	"github.com/redline-dev/redline/internal/testutil/redistest"
)

// Redis paused while grants are in flight, with the sidecar's timeouts: calls the limiter gave
// up on reach Redis when it resumes after their deadline and count nothing, so the window still
// admits its whole limit: once it refuses a call, it has admitted all but what the lease in
// hand holds. Leases are kept to 1% of the limit, so that what a lease holds cannot hide
// units stranded by the pause.
func TestGrantsTimedOutWhileRedisIsPausedCountNothing(t *testing.T) {
	for _, alg := range leasing {
		t.Run(string(alg), func(t *testing.T) {
			g := NewWithT(t)
			srv, err := redistest.Start()
			g.Expect(err).NotTo(HaveOccurred())
			t.Cleanup(func() { _ = srv.Close() })
			o := testClientOptions
			o.ReadTimeout, o.WriteTimeout = 50*time.Millisecond, 50*time.Millisecond
			c, err := redisconn.NewClient(srv.URL(), o)
			g.Expect(err).NotTo(HaveOccurred())
			t.Cleanup(func() { _ = c.Close() })
			const maxLease = 20
			l := newLimiter(t, c, limiter.TestOptions{LeaseHorizon: 2 * time.Second, CallDeadline: 37 * time.Millisecond, MaxLease: maxLease})
			const w = 8 * time.Second
			lim := limiter.Limit{Algorithm: alg, Requests: 2000, Window: w, Replicas: 1, FailureMode: limiter.FailureModeClosed}
			key := uniqueKey(t)
			start := untilWindowStart(w) // 5ms into the window
			s0 := windowStart(start, w)
			end := time.UnixMilli(s0 + w.Milliseconds())
			var mu sync.Mutex
			run := saturated{refused: map[int64]time.Time{}}
			var outside, failed atomic.Int64
			var stop, paced atomic.Bool
			paced.Store(true)
			var wg sync.WaitGroup
			for range 16 {
				wg.Go(func() {
					for !stop.Load() {
						before := time.Now()
						r, err := l.Allow(context.Background(), key, lim, 1)
						after := time.Now()
						degraded := err != nil || r.Source == limiter.SourceFailClosed
						mu.Lock()
						switch {
						case degraded:
							failed.Add(1) // Redis paused: the failure mode refused it
						case !before.Before(end) || !after.Before(end):
							outside.Add(1) // may have been decided in the next window
						case r.Allowed:
							run.adm = append(run.adm, admission{before, after})
						case before.After(run.refused[s0]):
							run.refused[s0] = before
						}
						mu.Unlock()
						if paced.Load() || degraded {
							time.Sleep(32 * time.Millisecond) // 16 callers: about 2x the limit over the window
						}
					}
				})
			}
			time.Sleep(time.Until(start.Add(time.Second)))
			g.Expect(srv.Pause()).To(Succeed())
			time.Sleep(2 * time.Second)
			g.Expect(srv.Resume()).To(Succeed())
			// Then demand far above what is left (paced only while the failure mode answers), so
			// that the window fills however slowly this machine runs the callers; a window they
			// did not fill is checked for exactness only.
			paced.Store(false)
			time.Sleep(time.Until(start.Add(w - 300*time.Millisecond)))
			stop.Store(true)
			wg.Wait()
			admitted := int64(len(run.adm))
			_, refused := run.refused[s0]
			t.Logf("%s, limit 2000 per 8s, Redis paused 2s: %d admitted, a call refused by the limit: %v, %d refused by the failure mode, %d ended past the window, %d stale calls",
				alg, admitted, refused, failed.Load(), outside.Load(), l.Stats().StaleCalls)
			g.Expect(admitted).To(BeNumerically("<=", lim.Requests))
			// Every call began in the window, and those counted here ended in it. The lease in
			// hand holds a grant's units less the cost of the call it answered.
			checkNoStrandedRefusal(g, run, lim, maxLease-1, s0, s0)
		})
	}
}
