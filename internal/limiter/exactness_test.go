package limiter_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/redline-dev/redline/internal/limiter"
	"github.com/redline-dev/redline/internal/limiter/scripts"
)

// exactLimit is a limit whose window outlasts any test run, so that "admitted == Requests" is
// the exact expectation for every algorithm.
func exactLimit(alg limiter.Algorithm, requests int64) limiter.Limit {
	// Replicas 1: a lone limiter that has heard its heartbeat (leases wait for one).
	return limiter.Limit{Algorithm: alg, Requests: requests, Window: 24 * time.Hour, Replicas: 1}
}

// hammer runs goroutines per limiter, each making attempts decisions over keys, and returns
// how many each key admitted. Every decision must come from Redis or the pre-check: these
// limiters have leases off.
func hammer(t *testing.T, ls []*limiter.Limiter, keys []string, lim limiter.Limit, goroutines, attempts int) []int64 {
	t.Helper()
	admitted, leased := flood(t, ls, keys, lim, goroutines, attempts)
	if leased > 0 {
		t.Fatalf("%d decisions came from leases, which these limiters do not take", leased)
	}
	return admitted
}

// instances returns n limiters, each with its own client and pool.
func instances(t *testing.T, url string, n int, o limiter.TestOptions) []*limiter.Limiter {
	ls := make([]*limiter.Limiter, n)
	for i := range ls {
		ls[i] = newLimiter(t, newClient(t, url), o)
	}
	return ls
}

func TestExactUnderConcurrency(t *testing.T) {
	for _, n := range []int{3, 10} {
		t.Run(fmt.Sprintf("%d instances", n), func(t *testing.T) {
			ls := instances(t, shared.URL(), n, limiter.TestOptions{})
			allAlgorithms(t, func(t *testing.T, alg limiter.Algorithm) {
				g := NewWithT(t)
				const limit = 150
				key := uniqueKey(t)
				got := hammer(t, ls, []string{key}, exactLimit(alg, limit), 64, 4)
				g.Expect(got[0]).To(Equal(int64(limit)), "%d instances x 64 goroutines on one key", n)
			})
		})
	}
}

// Instances whose local clocks disagree by minutes make the same decisions: only Redis's clock
// enters a decision, and the pre-check only measures durations on the local one.
func TestClockSkewDoesNotChangeDecisions(t *testing.T) {
	skews := []time.Duration{-7 * time.Minute, 0, 90 * time.Second, 3 * time.Hour}
	var ls []*limiter.Limiter
	for _, s := range skews {
		ls = append(ls, newLimiter(t, newClient(t, shared.URL()), limiter.TestOptions{
			Now: func() time.Time { return time.Now().Add(s) },
		}))
	}
	allAlgorithms(t, func(t *testing.T, alg limiter.Algorithm) {
		g := NewWithT(t)
		lim := exactLimit(alg, 10)
		key := uniqueKey(t)
		for i := range 3 * lim.Requests {
			l := ls[int(i)%len(ls)]
			r, err := l.Allow(context.Background(), key, lim, 1)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(r.Allowed).To(Equal(i < lim.Requests), "decision %d by the instance skewed %s", i, skews[int(i)%len(ls)])
			if !r.Allowed {
				g.Expect(r.RetryAfter).To(BeNumerically(">", time.Second), "retry-after from the instance skewed %s", skews[int(i)%len(ls)])
				// A SlidingWindowCounter refused early in a window waits into the next one,
				// until the current count's weight has decayed: up to twice the window.
				most := lim.Window
				if alg == limiter.SlidingWindowCounter {
					most = 2 * lim.Window
				}
				g.Expect(r.RetryAfter).To(BeNumerically("<=", most))
			}
		}
	})
}

// SCRIPT FLUSH while decisions run: every decision still succeeds (NOSCRIPT -> load -> retry
// once), and the limit stays exact.
func TestScriptFlushMidRun(t *testing.T) {
	g := NewWithT(t)
	ls := instances(t, shared.URL(), 3, limiter.TestOptions{})
	admin := newClient(t, shared.URL())
	stop := make(chan struct{})
	var flushes atomic.Int64
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			if err := admin.ScriptFlush(context.Background()).Err(); err == nil {
				flushes.Add(1)
			}
			time.Sleep(3 * time.Millisecond)
		}
	})
	const limit = 300
	var got [][]int64
	allAlgorithms(t, func(t *testing.T, alg limiter.Algorithm) {
		got = append(got, hammer(t, ls, []string{uniqueKey(t), uniqueKey(t)}, exactLimit(alg, limit), 16, 40))
	})
	close(stop)
	wg.Wait()
	for i, counts := range got {
		g.Expect(counts).To(HaveEach(int64(limit)), "algorithm %s", limiter.Algorithms[i])
	}
	g.Expect(flushes.Load()).To(BeNumerically(">", 0))
	var loads uint64
	for _, l := range ls {
		loads += l.Stats().ScriptLoads
	}
	g.Expect(loads).To(BeNumerically(">", 0), "scripts were reloaded after NOSCRIPT")
	for _, alg := range limiter.Algorithms {
		_, err := ls[0].Allow(context.Background(), uniqueKey(t), exactLimit(alg, 1), 1)
		g.Expect(err).NotTo(HaveOccurred())
	}
	g.Expect(scripts.Missing(context.Background(), admin)).To(BeEmpty(), "one decision per algorithm after the last flush reloads every script")
}
