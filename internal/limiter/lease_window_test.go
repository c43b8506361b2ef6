package limiter_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/redline-dev/redline/internal/limiter"
	"github.com/redline-dev/redline/internal/testutil/redistest"
)

// admission is one admitted decision: the local times before the call and after it. Redis runs
// on this machine, so its clock is this one: the decision was made, on Redis's clock, between
// the two.
type admission struct{ before, after time.Time }

// windowCounts counts, by window start (windows aligned to w), the admissions that certainly
// fell in each window (both times inside it), and every admission once, in the window of the
// middle of its call.
func windowCounts(adm []admission, w time.Duration) (certain, middle map[int64]int64) {
	certain, middle = map[int64]int64{}, map[int64]int64{}
	ms := w.Milliseconds()
	start := func(t time.Time) int64 { return t.UnixMilli() - t.UnixMilli()%ms }
	for _, a := range adm {
		if s := start(a.before); s == start(a.after) {
			certain[s]++
		}
		middle[start(a.before.Add(a.after.Sub(a.before)/2))]++
	}
	return certain, middle
}

// densest is the most admissions in any interval of length w, by the time each call began.
func densest(adm []admission, w time.Duration) int {
	ts := make([]time.Time, len(adm))
	for i, a := range adm {
		ts[i] = a.before
	}
	slices.SortFunc(ts, func(a, b time.Time) int { return a.Compare(b) })
	best, j := 0, 0
	for i := range ts {
		for ts[i].Sub(ts[j]) >= w {
			j++
		}
		best = max(best, i-j+1)
	}
	return best
}

// saturated is what saturate saw: every admission, and, by window start (windows aligned to
// the limit's), the latest time a call began that was refused certainly inside that window.
type saturated struct {
	adm     []admission
	refused map[int64]time.Time
}

// saturate runs callers goroutines per limiter on key until the given end, far above any
// limit, and returns every admission and the last refusal of each window.
func saturate(t *testing.T, ls []*limiter.Limiter, key string, lim func() limiter.Limit, callers int, end time.Time) saturated {
	t.Helper()
	var mu sync.Mutex
	out := saturated{refused: map[int64]time.Time{}}
	var bad atomic.Value
	var wg sync.WaitGroup
	for _, l := range ls {
		for range callers {
			wg.Go(func() {
				var mine []admission
				refused := map[int64]time.Time{}
				for time.Now().Before(end) {
					before := time.Now()
					lm := lim()
					r, err := l.Allow(context.Background(), key, lm, 1)
					if err != nil {
						bad.Store(err.Error())
						return
					}
					if r.Source != limiter.SourceRedis && r.Source != limiter.SourceLease && r.Source != limiter.SourcePrecheck {
						bad.Store(fmt.Sprintf("decision from %s: %v", r.Source, r.Err))
						return
					}
					after := time.Now()
					if r.Allowed {
						mine = append(mine, admission{before, after})
					} else if s := windowStart(before, lm.Window); s == windowStart(after, lm.Window) && before.After(refused[s]) {
						refused[s] = before
					}
				}
				mu.Lock()
				out.adm = append(out.adm, mine...)
				for s, b := range refused {
					if b.After(out.refused[s]) {
						out.refused[s] = b
					}
				}
				mu.Unlock()
			})
		}
	}
	wg.Wait()
	if b := bad.Load(); b != nil {
		t.Fatalf("a decision failed: %s", b)
	}
	return out
}

// windowStart is the start (Unix ms) of the window aligned to w that t falls in.
func windowStart(t time.Time, w time.Duration) int64 {
	return t.UnixMilli() - t.UnixMilli()%w.Milliseconds()
}

// overlapping counts the admissions whose call overlaps the window starting at s: every
// admission the limiter decided inside it is one of them, however long the call took.
func overlapping(adm []admission, s int64, w time.Duration) int64 {
	var n int64
	for _, a := range adm {
		if a.before.UnixMilli() < s+w.Milliseconds() && a.after.UnixMilli() >= s {
			n++
		}
	}
	return n
}

// admittedFloor is the least the calls overlapping a window must have admitted, of cost 1
// each, when a call that began at the fraction f of the window was refused inside it.
//
// A refusal says the window's count stood at the limit less the cost then: for a
// SlidingWindowCounter, less the previous window's count weighted by what is left of the
// window (1-f at most, the call having reached Redis after it began). A refusal from the
// pre-check repeats one Redis made, until the retry-after Redis gave, rounded up to the
// millisecond: at most one unit more for these limits. Every unit of the count was admitted by
// a call overlapping the window, or is held unspent in a lease (at most held units, every
// replica together). prev bounds the previous window's count: what overlapped it plus what
// leases held of it, the limit at most.
//
// It asks nothing of a window whose callers were too slow to fill it (no refusal), so it holds
// whatever the scheduler does; a limiter that refuses while units it counted are neither
// admitted nor held (stranded) fails it.
func admittedFloor(lim limiter.Limit, held, prev int64, f float64) float64 {
	floor := float64(lim.Requests - held - 2) // the cost, and one for the pre-check's rounding
	if lim.Algorithm == limiter.SlidingWindowCounter {
		floor -= float64(min(prev+held, lim.Requests)) * (1 - f)
	}
	return floor
}

// checkNoStrandedRefusal checks admittedFloor for every window from first to last (their
// starts), and returns the windows it had a refusal to check.
func checkNoStrandedRefusal(g Gomega, run saturated, lim limiter.Limit, held int64, first, last int64) (checked int) {
	w := lim.Window
	for s := first; s <= last; s += w.Milliseconds() {
		r, ok := run.refused[s]
		if !ok {
			continue
		}
		checked++
		f := float64(r.UnixMilli()-s) / float64(w.Milliseconds())
		floor := admittedFloor(lim, held, overlapping(run.adm, s-w.Milliseconds(), w), f)
		g.Expect(float64(overlapping(run.adm, s, w))).To(BeNumerically(">=", floor),
			"window at %dms: a call was refused at %.0f%% of it, so the count was near the limit; nothing stranded (held by leases: %d at most)",
			s-first, 100*f, held)
	}
	return checked
}

// untilWindowStart sleeps until just after the next start of a window aligned to w.
func untilWindowStart(w time.Duration) time.Time {
	now := time.Now()
	next := now.Truncate(w).Add(w).Add(5 * time.Millisecond)
	time.Sleep(time.Until(next))
	return next
}

// Leases across many short windows (1s and 2s), demand far above the limit, 1 and 3 replicas,
// leases on and off side by side: no window admits more than its limit (a lease ends with the
// window its units were counted in), and no window refuses a call while units it counted are
// neither admitted nor held in a lease (see admittedFloor): whatever the callers manage to send
// on a busy machine, a window the limiter refused in admitted all but what leases hold.
func TestLeasesExactAcrossWindowBoundaries(t *testing.T) {
	for _, w := range []time.Duration{time.Second, 2 * time.Second} {
		for _, n := range []int{1, 3} {
			for _, alg := range leasing {
				t.Run(fmt.Sprintf("%s/%s/%d replicas", alg, w, n), func(t *testing.T) {
					g := NewWithT(t)
					lim := limiter.Limit{Algorithm: alg, Requests: 400 * int64(w/time.Second), Window: w, Replicas: int64(n)}
					const windows = 5
					for _, leases := range []bool{true, false} {
						o := leaseOpts()
						// held: the units all the replicas' leases hold at once, at most (a
						// twentieth of the limit, see lease.go).
						held := int64(n) * (lim.Requests / (20 * int64(n)))
						if !leases {
							o.LeaseHorizon, held = -1, 0
						}
						ls := instances(t, shared.URL(), n, o)
						key := uniqueKey(t)
						first := untilWindowStart(w)
						run := saturate(t, ls, key, func() limiter.Limit { return lim }, 16, first.Add(windows*w-10*time.Millisecond))
						certain, middle := windowCounts(run.adm, w)
						var counts, mids []int64
						for i := range int64(windows) {
							s := windowStart(first.Add(time.Duration(i)*w), w)
							counts = append(counts, certain[s])
							mids = append(mids, middle[s])
						}
						var leased uint64
						for _, l := range ls {
							leased += l.Stats().LeaseDecisions
						}
						// densest is for the record: a SlidingWindowCounter weighs the previous
						// window as if its units were admitted evenly, so the algorithm itself
						// can pass its limit in an interval that straddles two windows, and on a
						// loaded machine the call times that bound an admission blur it. So are
						// the admissions by the middle of their call: how many the callers got
						// depends on how fast this machine let them call.
						t.Logf("%s, window %s, %d replicas, limit %d, leases %v: admitted per window %v (by mid-call %v), densest %s: %d",
							alg, w, n, lim.Requests, leases, counts, mids, w, densest(run.adm, w))
						if leases {
							g.Expect(leased).To(BeNumerically(">", 0), "leases were used")
						}
						for i, c := range counts {
							g.Expect(c).To(BeNumerically("<=", lim.Requests), "window %d admits no more than the limit", i)
						}
						s0 := windowStart(first, w)
						checked := checkNoStrandedRefusal(g, run, lim, held, s0, s0+(windows-1)*w.Milliseconds())
						t.Logf("%d of %d windows refused a call: each admitted all but what leases hold", checked, windows)
					}
				})
			}
		}
	}
}

// A replica that holds a lease and makes no decision across a window boundary (idle, or a
// paused process) finds its lease ended with the window: its next decision asks Redis.
func TestLeaseHeldAcrossABoundaryEndsWithItsWindow(t *testing.T) {
	for _, alg := range leasing {
		t.Run(string(alg), func(t *testing.T) {
			g := NewWithT(t)
			l := newLimiter(t, newClient(t, shared.URL()), limiter.TestOptions{LeaseHorizon: time.Minute})
			lim := limiter.Limit{Algorithm: alg, Requests: 100_000, Window: 2 * time.Second, Replicas: 1}
			key := uniqueKey(t)
			untilWindowStart(lim.Window)
			sources := map[limiter.Source]int{}
			for range 100 {
				r, err := l.Allow(context.Background(), key, lim, 1)
				g.Expect(err).NotTo(HaveOccurred())
				g.Expect(r.Allowed).To(BeTrue())
				sources[r.Source]++
			}
			g.Expect(sources[limiter.SourceLease]).To(BeNumerically(">", 0), "the key holds a lease")
			untilWindowStart(lim.Window)
			r, err := l.Allow(context.Background(), key, lim, 1)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(r.Source).To(Equal(limiter.SourceRedis), "a lease of the last window admits nothing in this one")
		})
	}
}

// A limit whose live replicas are not known yet (no heartbeat answered) never leases: a
// replica that sized leases as if it were alone would hold the whole fleet's share.
func TestNoLeaseBeforeTheReplicasAreKnown(t *testing.T) {
	for _, alg := range leasing {
		t.Run(string(alg), func(t *testing.T) {
			g := NewWithT(t)
			l := newLimiter(t, newClient(t, shared.URL()), leaseOpts())
			lim := exactLimit(alg, 1_000_000)
			lim.Replicas = 0
			key := uniqueKey(t)
			for range 200 {
				r, err := l.Allow(context.Background(), key, lim, 1)
				g.Expect(err).NotTo(HaveOccurred())
				g.Expect(r.Source).To(Equal(limiter.SourceRedis))
			}
			lim.Replicas = 1
			leased := 0
			for range 200 {
				r, err := l.Allow(context.Background(), key, lim, 1)
				g.Expect(err).NotTo(HaveOccurred())
				if r.Source == limiter.SourceLease {
					leased++
				}
			}
			g.Expect(leased).To(BeNumerically(">", 100), "once the replicas are known, the key leases")
		})
	}
}

// reloadDuring runs 3 limiters x 32 callers on one key under from, switches every caller to to
// while Redis is paused (so that grants asked under from are in flight across the switch), and
// returns what was admitted under each.
func reloadDuring(t *testing.T, srv *redistest.Server, from, to limiter.Limit, warm int64) (underFrom, underTo int64) {
	t.Helper()
	g := NewWithT(t)
	var ls []*limiter.Limiter
	for range 3 {
		ls = append(ls, newLimiter(t, newClient(t, srv.URL()), leaseOpts()))
	}
	key := uniqueKey(t)
	from.Replicas, to.Replicas = 3, 3
	var cur atomic.Pointer[limiter.Limit]
	cur.Store(&from)
	var aFrom, aTo atomic.Int64
	var stop atomic.Bool
	var wg sync.WaitGroup
	for _, l := range ls {
		for range 32 {
			wg.Go(func() {
				for !stop.Load() {
					lim := cur.Load()
					r, err := l.Allow(context.Background(), key, *lim, 1)
					if err != nil || (r.Source != limiter.SourceRedis && r.Source != limiter.SourceLease && r.Source != limiter.SourcePrecheck) {
						t.Errorf("decision failed: %v %+v", err, r)
						return
					}
					if r.Allowed && lim == &from {
						aFrom.Add(1)
					} else if r.Allowed {
						aTo.Add(1)
					}
				}
			})
		}
	}
	g.Eventually(aFrom.Load).WithTimeout(30 * time.Second).Should(BeNumerically(">=", warm))
	g.Expect(srv.Pause()).To(Succeed())
	time.Sleep(100 * time.Millisecond) // every caller is now waiting on Redis, or on a grant
	cur.Store(&to)
	time.Sleep(100 * time.Millisecond)
	g.Expect(srv.Resume()).To(Succeed())
	// Units given back go to Redis within a quarter horizon; the pre-check repeats refusals for
	// a horizon at most: then they are admitted again.
	time.Sleep(3500 * time.Millisecond)
	stop.Store(true)
	wg.Wait()
	return aFrom.Load(), aTo.Load()
}

// A reload while grants are in flight: a grant answers the limit it was asked under, or goes
// back. Lowered below what is counted, the new limit admits nothing; raised, or with the
// algorithm changed between FixedWindow and SlidingWindowCounter, the window admits exactly
// the limit in force, counted once across both.
func TestReloadWhileGrantsAreInFlight(t *testing.T) {
	srv, err := redistest.Start()
	NewWithT(t).Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { _ = srv.Close() })
	for _, alg := range leasing {
		t.Run(string(alg)+"/lowered", func(t *testing.T) {
			from, to := exactLimit(alg, 1000), exactLimit(alg, 150)
			a, b := reloadDuring(t, srv, from, to, 300)
			t.Logf("%s 1000 -> 150 after %d admitted: %d admitted under 150", alg, a, b)
			NewWithT(t).Expect(b).To(BeZero(), "the counter is past 150: nothing more is admitted")
		})
		t.Run(string(alg)+"/raised", func(t *testing.T) {
			from, to := exactLimit(alg, 300), exactLimit(alg, 600)
			a, b := reloadDuring(t, srv, from, to, 200)
			t.Logf("%s 300 -> 600: %d admitted under 300, %d under 600", alg, a, b)
			NewWithT(t).Expect(a + b).To(Equal(int64(600)))
		})
	}
	for _, pair := range [][2]limiter.Algorithm{{limiter.FixedWindow, limiter.SlidingWindowCounter}, {limiter.SlidingWindowCounter, limiter.FixedWindow}} {
		t.Run(fmt.Sprintf("%s to %s", pair[0], pair[1]), func(t *testing.T) {
			from, to := exactLimit(pair[0], 1000), exactLimit(pair[1], 1000)
			a, b := reloadDuring(t, srv, from, to, 400)
			t.Logf("%s -> %s, limit 1000: %d admitted before, %d after", pair[0], pair[1], a, b)
			NewWithT(t).Expect(a+b).To(Equal(int64(1000)), "one count across the change")
		})
	}
}

// While a reload reaches the replicas one by one, some decide a rule as FixedWindow and others
// as SlidingWindowCounter at once: they count the same window.
func TestMixedAlgorithmsCountOneWindow(t *testing.T) {
	g := NewWithT(t)
	fw := instances(t, shared.URL(), 2, leaseOpts())
	swc := instances(t, shared.URL(), 2, leaseOpts())
	key := uniqueKey(t)
	var a, b []int64
	var wg sync.WaitGroup
	wg.Go(func() { a, _ = flood(t, fw, []string{key}, exactLimit(limiter.FixedWindow, 1000), 16, 100) })
	wg.Go(func() { b, _ = flood(t, swc, []string{key}, exactLimit(limiter.SlidingWindowCounter, 1000), 16, 100) })
	wg.Wait()
	t.Logf("FixedWindow replicas admitted %d, SlidingWindowCounter replicas %d, of 1000", a[0], b[0])
	g.Expect(a[0] + b[0]).To(Equal(int64(1000)))
}

// More hot keys than the lease table holds, in short windows: the table never evicts a key in
// use, the keys beyond it ask Redis per decision, no key-window admits more than its limit, and
// every key-window that refused a call admitted all but what leases hold (see admittedFloor).
func TestMoreHotKeysThanTheLeaseTable(t *testing.T) {
	g := NewWithT(t)
	opts := leaseOpts()
	opts.LeaseSize = 8
	ls := instances(t, shared.URL(), 3, opts)
	const w = 2 * time.Second
	lim := limiter.Limit{Algorithm: limiter.FixedWindow, Requests: 200, Window: w, Replicas: 3}
	keys := make([]string, 12)
	for i := range keys {
		keys[i] = uniqueKey(t)
	}
	first := untilWindowStart(w)
	runs := make([]saturated, len(keys))
	var wg sync.WaitGroup
	for i, k := range keys {
		wg.Go(func() {
			runs[i] = saturate(t, ls, k, func() limiter.Limit { return lim }, 2, first.Add(3*w-10*time.Millisecond))
		})
	}
	wg.Wait()
	// held: the units the three replicas' leases of a key hold at once, at most (a twentieth
	// of the limit, see lease.go); a key beyond the table holds none.
	held := 3 * (lim.Requests / (20 * 3))
	var total, checked int64
	s0 := windowStart(first, w)
	for i := range keys {
		certain, middle := windowCounts(runs[i].adm, w)
		for _, c := range certain {
			g.Expect(c).To(BeNumerically("<=", lim.Requests))
		}
		total += middle[s0] + middle[s0+w.Milliseconds()]
		checked += int64(checkNoStrandedRefusal(g, runs[i], lim, held, s0, s0+2*w.Milliseconds()))
	}
	// How many the callers got depends on how fast this machine let them call; what the
	// limiter must do with what it was asked does not: a key-window it refused a call in
	// admitted all but what leases hold (see admittedFloor).
	t.Logf("12 hot keys over a lease table of 8, limit 200 per %s: %d of %d admitted over the 24 key-windows before the last, %d of 36 key-windows refused a call",
		w, total, 24*lim.Requests, checked)
}
