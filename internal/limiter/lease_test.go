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
	"github.com/redline-dev/redline/internal/testutil/redistest"
)

var leasing = []limiter.Algorithm{limiter.FixedWindow, limiter.SlidingWindowCounter}

func leaseOpts() limiter.TestOptions { return limiter.TestOptions{LeaseHorizon: 2 * time.Second} }

// flood makes every limiter's goroutines decide on keys until each has made attempts decisions
// and returns admissions per key and the decisions that came from leases.
func flood(t *testing.T, ls []*limiter.Limiter, keys []string, lim limiter.Limit, goroutines, attempts int) (admitted []int64, leased int64) {
	t.Helper()
	counts := make([]atomic.Int64, len(keys))
	var fromLease atomic.Int64
	var bad atomic.Value
	var wg sync.WaitGroup
	for _, l := range ls {
		for g := range goroutines {
			wg.Go(func() {
				for a := range attempts {
					k := (g*attempts + a) % len(keys)
					r, err := l.Allow(context.Background(), keys[k], lim, 1)
					if err != nil {
						bad.Store(err.Error())
						return
					}
					switch r.Source {
					case limiter.SourceLease:
						fromLease.Add(1)
					case limiter.SourceRedis, limiter.SourcePrecheck:
					default:
						bad.Store(fmt.Sprintf("decision from %s: %v", r.Source, r.Err))
						return
					}
					if r.Allowed {
						counts[k].Add(1)
					}
				}
			})
		}
	}
	wg.Wait()
	if b := bad.Load(); b != nil {
		t.Fatalf("a decision failed: %s", b)
	}
	admitted = make([]int64, len(keys))
	for i := range counts {
		admitted[i] = counts[i].Load()
	}
	return admitted, fromLease.Load()
}

// However leases are spread over replicas, no key admits more than its limit, and when demand
// exceeds it the replicas together admit at least 95% of it.
func TestLeasesNeverOverAdmit(t *testing.T) {
	for _, n := range []int{3, 10} {
		t.Run(fmt.Sprintf("%d instances", n), func(t *testing.T) {
			ls := instances(t, shared.URL(), n, leaseOpts())
			for _, alg := range leasing {
				t.Run(string(alg)+"/one hot key", func(t *testing.T) {
					g := NewWithT(t)
					lim := exactLimit(alg, 2000)
					lim.Replicas = int64(n)
					got, leased := flood(t, ls, []string{uniqueKey(t)}, lim, 64, 80)
					t.Logf("%d instances: admitted %d of %d, %d decisions from leases", n, got[0], lim.Requests, leased)
					g.Expect(got[0]).To(BeNumerically("<=", lim.Requests))
					g.Expect(got[0]).To(BeNumerically(">=", lim.Requests*95/100))
					g.Expect(leased).To(BeNumerically(">", 0), "leases were used")
				})
				t.Run(string(alg)+"/1000 keys", func(t *testing.T) {
					g := NewWithT(t)
					lim := exactLimit(alg, 20)
					lim.Replicas = int64(n)
					keys := make([]string, 1000)
					for i := range keys {
						keys[i] = uniqueKey(t)
					}
					// Twice the limit of every key: goroutine g of each instance walks its own
					// stretch of keys, and the stretches wrap around all of them.
					got, _ := flood(t, ls, keys, lim, 64, int(2*1000*lim.Requests)/(64*n)+1)
					var sum int64
					for _, a := range got {
						g.Expect(a).To(BeNumerically("<=", lim.Requests))
						sum += a
					}
					t.Logf("%d instances: admitted %d of %d over 1000 keys", n, sum, 1000*lim.Requests)
					g.Expect(sum).To(BeNumerically(">=", 1000*lim.Requests*95/100))
				})
			}
		})
	}
}

// A warm key under its limit is decided mostly from leases: few script calls per decision.
func TestLeasesTakeRedisOffTheHotPath(t *testing.T) {
	for _, alg := range leasing {
		t.Run(string(alg), func(t *testing.T) {
			g := NewWithT(t)
			l := newLimiter(t, newClient(t, shared.URL()), leaseOpts())
			lim := exactLimit(alg, 1_000_000)
			key := uniqueKey(t)
			const decisions = 5000
			var wg sync.WaitGroup
			for range 16 {
				wg.Go(func() {
					for range decisions / 16 {
						r, err := l.Allow(context.Background(), key, lim, 1)
						if err != nil || !r.Allowed {
							t.Errorf("decision refused or failed: %+v %v", r, err)
							return
						}
					}
				})
			}
			wg.Wait()
			st := l.Stats()
			perDecision := float64(st.RedisDecisions) / float64(st.RedisDecisions+st.LeaseDecisions)
			t.Logf("%d Redis decisions, %d from leases: %.3f script calls per decision", st.RedisDecisions, st.LeaseDecisions, perDecision)
			g.Expect(perDecision).To(BeNumerically("<", 0.2))
		})
	}
}

// A rule whose limit changes (a reload) stops admitting from the lease granted under the old
// one: with the new, lower limit already spent, nothing more passes.
func TestLeaseEndsWhenTheLimitChanges(t *testing.T) {
	for _, alg := range leasing {
		t.Run(string(alg), func(t *testing.T) {
			g := NewWithT(t)
			l := newLimiter(t, newClient(t, shared.URL()), leaseOpts())
			key := uniqueKey(t)
			high := exactLimit(alg, 1000)
			for range 200 { // warm: later grants are leases
				r, err := l.Allow(context.Background(), key, high, 1)
				g.Expect(err).NotTo(HaveOccurred())
				g.Expect(r.Allowed).To(BeTrue())
			}
			g.Expect(l.Stats().LeaseDecisions).To(BeNumerically(">", 0))
			low := exactLimit(alg, 150) // already spent: 200 were counted under the old limit
			r, err := l.Allow(context.Background(), key, low, 1)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(r.Allowed).To(BeFalse(), "a lease granted under 1000 is not admitted under 150")
			g.Expect(r.Source).To(Equal(limiter.SourceRedis))
		})
	}
}

// While Redis is down a lease already held keeps admitting (its units were counted); once it is
// spent the failure mode decides; after Redis returns the shared counter does again, and the
// whole never exceeds the limit.
func TestLeaseOutlivesARedisOutage(t *testing.T) {
	for _, alg := range leasing {
		t.Run(string(alg), func(t *testing.T) {
			g := NewWithT(t)
			srv, err := redistest.Start()
			g.Expect(err).NotTo(HaveOccurred())
			t.Cleanup(func() { _ = srv.Close() })
			l := newLimiter(t, newClient(t, srv.URL()), limiter.TestOptions{LeaseHorizon: 10 * time.Second, BreakerFailures: 1})
			lim := exactLimit(alg, 100)
			lim.FailureMode = limiter.FailureModeClosed
			key := uniqueKey(t)
			admitted := 0
			for range 20 {
				r, err := l.Allow(context.Background(), key, lim, 1)
				g.Expect(err).NotTo(HaveOccurred())
				if r.Allowed {
					admitted++
				}
			}
			g.Expect(admitted).To(Equal(20))
			g.Expect(srv.Stop()).To(Succeed())
			fromLease, closed := 0, 0
			for range 200 {
				r, err := l.Allow(context.Background(), key, lim, 1)
				g.Expect(err).NotTo(HaveOccurred())
				switch {
				case r.Source == limiter.SourceLease && r.Allowed:
					fromLease++
				case r.Source == limiter.SourceFailClosed && !r.Allowed:
					closed++
				default:
					t.Fatalf("unexpected decision while Redis is down: %+v", r)
				}
			}
			t.Logf("Redis down: %d admitted from the lease held, %d refused by FailureModeClosed", fromLease, closed)
			g.Expect(fromLease).To(BeNumerically(">", 0), "the lease held keeps admitting")
			g.Expect(closed).To(BeNumerically(">", 0), "then the failure mode decides")
			g.Expect(admitted + fromLease).To(BeNumerically("<=", 100))
		})
	}
}

// Unused units of an idle lease go back to the counter while the window stands, so another
// replica can admit them.
func TestIdleLeaseGoesBack(t *testing.T) {
	for _, alg := range leasing {
		t.Run(string(alg), func(t *testing.T) {
			g := NewWithT(t)
			a := newLimiter(t, newClient(t, shared.URL()), limiter.TestOptions{LeaseHorizon: 300 * time.Millisecond})
			b := newLimiter(t, newClient(t, shared.URL()), limiter.TestOptions{LeaseHorizon: 300 * time.Millisecond})
			lim := exactLimit(alg, 50)
			key := uniqueKey(t)
			// a takes the whole limit, partly as a lease it then leaves unused.
			var spent int64
			for range 30 {
				r, err := a.Allow(context.Background(), key, lim, 1)
				g.Expect(err).NotTo(HaveOccurred())
				if r.Allowed {
					spent++
				}
			}
			// b, after a's lease has gone idle and back, admits the rest: exactly the limit.
			g.Eventually(func() int64 {
				r, err := b.Allow(context.Background(), key, lim, 1)
				g.Expect(err).NotTo(HaveOccurred())
				if r.Allowed {
					spent++
				}
				return spent
			}).WithTimeout(10 * time.Second).WithPolling(20 * time.Millisecond).Should(Equal(lim.Requests))
			r, err := b.Allow(context.Background(), key, lim, 1)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(r.Allowed).To(BeFalse(), "never more than the limit")
		})
	}
}

// A key that leased and then paused past the horizon resumes with a lease at its first decision
// (one Redis call for the next 16 decisions), while a key used once before its pause resumes
// cold, one unit at a time, as a key never seen does.
func TestPausedKeyResumesWarm(t *testing.T) {
	for _, alg := range leasing {
		t.Run(string(alg), func(t *testing.T) {
			g := NewWithT(t)
			evals := &evalCounter{}
			c := newClient(t, shared.URL())
			c.AddHook(evals)
			l := newLimiter(t, c, limiter.TestOptions{LeaseHorizon: 200 * time.Millisecond})
			lim := exactLimit(alg, 1_000_000)
			hot, once := uniqueKey(t), uniqueKey(t)
			decide := func(key string) limiter.Result {
				r, err := l.Allow(context.Background(), key, lim, 1)
				g.Expect(err).NotTo(HaveOccurred())
				g.Expect(r.Allowed).To(BeTrue())
				return r
			}
			for range 40 {
				decide(hot)
			}
			decide(once)
			g.Eventually(func() int { return l.Stats().LeaseKeys }).WithTimeout(10*time.Second).
				Should(BeZero(), "both keys' leases go back once idle for the horizon")

			before := evals.n.Load()
			g.Expect(decide(hot).Source).To(Equal(limiter.SourceRedis))
			for i := range 15 {
				g.Expect(decide(hot).Source).To(Equal(limiter.SourceLease), "decision %d after the pause", i+2)
			}
			g.Expect(evals.n.Load()-before).To(Equal(int64(1)), "the hot key resumes with one call for 16 decisions")

			g.Expect(decide(once).Source).To(Equal(limiter.SourceRedis))
			g.Expect(decide(once).Source).To(Equal(limiter.SourceRedis), "a key used once resumes cold: one unit, then a lease")
			g.Expect(decide(once).Source).To(Equal(limiter.SourceLease))
		})
	}
}
