package limiter_test

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"github.com/redis/go-redis/v9"

	"github.com/redline-dev/redline/internal/limiter"
	"github.com/redline-dev/redline/internal/redisconn"
	"github.com/redline-dev/redline/internal/testutil/redistest"
)

// sentinelClient is a client of grp with timeouts short enough that a stalled master trips the
// breaker within a test, as the shares' failover tests use (a killed one refuses at once).
func sentinelClient(t *testing.T, grp *redistest.Sentinel) redis.UniversalClient {
	return sentinelClientWith(t, grp, 200*time.Millisecond)
}

// sentinelClientWith is sentinelClient with timeout for reads, writes and dials.
func sentinelClientWith(t *testing.T, grp *redistest.Sentinel, timeout time.Duration) redis.UniversalClient {
	t.Helper()
	c, err := redisconn.NewClient(grp.URL(), redisconn.Options{PoolSize: 8, DialTimeout: timeout,
		ReadTimeout: timeout, WriteTimeout: timeout, PoolTimeout: 500 * time.Millisecond})
	if err != nil {
		t.Fatalf("creating client for %s: %v", grp.URL(), err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// reserveFromRedis reserves until Redis decides (not the failure mode: the client may take a
// few calls to follow a new master), within a generous bound.
func reserveFromRedis(t *testing.T, l *limiter.Limiter, key string, lim limiter.Limit, least, want int64) (limiter.Result, *limiter.Hold) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		r, h, err := l.Reserve(context.Background(), key, lim, least, want, time.Hour)
		if err != nil {
			t.Fatalf("reserving: %v", err)
		}
		if r.Source == limiter.SourceRedis {
			return r, h
		}
		if time.Now().After(deadline) {
			t.Fatalf("no decision from Redis within 30s: %+v", r)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A settle sent to a master that died answers an error, and may or may not have run: Redis
// then counts what the request used of the hold (it ran) or the whole hold until its deadline
// (it did not). The replica's share keeps the former until the deadline, so the promoted
// replica, which never saw the hold (it was cut off), is restored to count what the request
// used, and the window does not admit it a second time.
func TestHoldSettleFailedOnADeadMasterKeepsItsUse(t *testing.T) {
	g := NewWithT(t)
	grp, err := redistest.StartSentinel()
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { _ = grp.Close() })
	l := newLimiter(t, sentinelClient(t, grp), limiter.TestOptions{ReplicaID: limiter.NewReplicaID(),
		BreakerOpenFor: 100 * time.Millisecond})
	ctx := context.Background()
	algs := []limiter.Algorithm{limiter.FixedWindow, limiter.SlidingWindowCounter}
	keys := map[limiter.Algorithm]string{}
	holds := map[limiter.Algorithm]*limiter.Hold{}

	g.Expect(grp.CutReplica(ctx)).To(Succeed())
	for _, alg := range algs {
		keys[alg] = uniqueKey(t)
		_, h, err := l.Reserve(ctx, keys[alg], holdLimit(alg, 100), 1, 100, time.Hour)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(h).NotTo(BeNil())
		g.Expect(h.Units).To(Equal(int64(100)))
		holds[alg] = h
	}
	g.Expect(grp.Master().Stop()).To(Succeed())
	for _, alg := range algs {
		_, err := l.Settle(ctx, holds[alg], 60)
		g.Expect(err).To(HaveOccurred(), "the master is dead")
		g.Expect(err).NotTo(MatchError(limiter.ErrCircuitOpen), "this settle was sent: it may have run")
		_, again := l.Settle(ctx, holds[alg], 60)
		g.Expect(again).To(MatchError(err), "a settle that may have run is final")
	}
	g.Expect(grp.WaitMaster(ctx, grp.Replica())).To(Succeed())

	for _, alg := range algs {
		lim := holdLimit(alg, 100)
		r, h := reserveFromRedis(t, l, keys[alg], lim, 1, 100)
		g.Expect(r.Allowed).To(BeTrue())
		g.Expect(h.Units).To(Equal(int64(40)), "the 60 the request used stay counted on the promoted replica")
		g.Expect(counted(t, sentinelClient(t, grp), keys[alg], lim)).To(Equal(int64(100)))
	}
	g.Expect(l.TestStats().RestoredUnits).To(Equal(uint64(120)))
}

// holdFleet is callers looping reserve -> settle on one key through several limiters, as
// sidecars serving requests whose cost is known after them, and what they know of it. Each
// settles once, as the sidecar does (decide.Holds.Settle): a settle that failed is not retried.
type holdFleet struct {
	key string
	lim limiter.Limit
	// target pauses the callers once served reaches it; cut and killed say the replica was
	// cut off and the master killed; promoted says the new master answers, after which
	// redisRefused[i] records that limiter i was refused by Redis.
	target       atomic.Int64
	cut, killed  atomic.Bool
	promoted     atomic.Bool
	redisRefused []atomic.Bool
	quit         chan struct{}
	wg           sync.WaitGroup

	mu sync.Mutex
	// served is what every request that got a hold used, settled or not; settledUsed and debt
	// are of the settles that answered; keptUsed is what the requests used, within their holds,
	// of those whose settle failed and whose hold lasts the window (it never goes back in it);
	// lagged is what the old master alone counted: the use of the holds reserved after the cut
	// and settled before the kill, which the promoted replica never saw.
	served, settledUsed, debt, keptUsed, lagged                 int64
	holds, expired, failedSent, failedOpen, failClosed, refused int64
	// short are the holds of short deadline whose settle failed: they go back by themselves.
	short []*limiter.Hold
}

// holdTTLs alternate: a hold of the window's length (its deadline is its window's end, so it is
// counted for the whole test), and one whose deadline passes within the test.
var holdTTLs = [2]time.Duration{24 * time.Hour, 2 * time.Second}

func startHoldFleet(t *testing.T, ls []*limiter.Limiter, key string, lim limiter.Limit, perLimiter int) *holdFleet {
	f := &holdFleet{key: key, lim: lim, redisRefused: make([]atomic.Bool, len(ls)), quit: make(chan struct{})}
	for i, l := range ls {
		for j := range perLimiter {
			rng := rand.New(rand.NewPCG(uint64(i), uint64(j)))
			f.wg.Go(func() { f.call(t, i, l, rng) })
		}
	}
	return f
}

func (f *holdFleet) call(t *testing.T, i int, l *limiter.Limiter, rng *rand.Rand) {
	ctx := context.Background()
	for n := 0; ; n++ {
		select {
		case <-f.quit:
			return
		default:
		}
		f.mu.Lock()
		paused := f.served >= f.target.Load()
		f.mu.Unlock()
		if paused {
			time.Sleep(time.Millisecond)
			continue
		}
		long := n%2 == 0
		afterCut := f.cut.Load()
		r, h, err := l.Reserve(ctx, f.key, f.lim, 10, 100, holdTTLs[n%2])
		if err != nil {
			t.Errorf("reserve: %v", err)
			return
		}
		if h == nil {
			f.refusal(t, i, r)
			time.Sleep(time.Millisecond)
			continue
		}
		if h.Degraded || !r.Allowed {
			t.Errorf("a limit that fails closed held %+v with %+v", h, r)
			return
		}
		used := rng.Int64N(h.Units + 1)
		if rng.IntN(10) == 0 {
			used = h.Units + 1 + rng.Int64N(20) // a response past its cap: debt
		}
		s, err := l.Settle(ctx, h, used)
		if err != nil && !errors.Is(err, limiter.ErrCircuitOpen) {
			// It may have run: final, and the same answer again.
			if _, again := l.Settle(ctx, h, used); again == nil || again.Error() != err.Error() {
				t.Errorf("a settle that failed with %v answered %v the second time", err, again)
			}
		}
		f.settled(h, used, long, afterCut && !f.killed.Load(), s, err)
	}
}

// refusal records a reserve refused: by the failure mode, which must refuse (Closed), or by Redis.
func (f *holdFleet) refusal(t *testing.T, i int, r limiter.Result) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.refused++
	switch r.Source {
	case limiter.SourceFailClosed:
		f.failClosed++
		if r.Allowed || r.Err == nil {
			t.Errorf("the failure mode decided %+v", r)
		}
	case limiter.SourceRedis:
		if f.promoted.Load() {
			f.redisRefused[i].Store(true)
		}
	}
}

// settled records a settle; onlyOld says its hold was reserved after the cut and the settle
// answered before the kill, so only the old master counted it.
func (f *holdFleet) settled(h *limiter.Hold, used int64, long, onlyOld bool, s limiter.Settled, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.holds++
	f.served += used
	switch {
	case err == nil:
		f.settledUsed += used
		f.debt += s.Debt
		if onlyOld {
			f.lagged += used
		}
		if s.Expired {
			f.expired++
		}
		return
	case errors.Is(err, limiter.ErrCircuitOpen):
		f.failedOpen++
	default:
		f.failedSent++
	}
	if long {
		f.keptUsed += min(used, h.Units)
	} else {
		f.short = append(f.short, h)
	}
}

// until lets the callers serve pauseAt more than they have, and returns once they served n
// more (n < pauseAt), the callers still going: what comes next (a cut, a kill) happens under
// demand, and a slow return cannot let them spend the budget before it. It returns what they
// had served when it was called. Relative, not absolute: the callers may have reached the last
// pause point while the step before (a cut) was under way, and they serve n more all the same.
func (f *holdFleet) until(t *testing.T, n, pauseAt int64) int64 {
	t.Helper()
	f.mu.Lock()
	from := f.served
	f.target.Store(from + pauseAt)
	f.mu.Unlock()
	deadline := time.Now().Add(60 * time.Second)
	for {
		f.mu.Lock()
		served := f.served
		f.mu.Unlock()
		if served >= from+n {
			return from
		}
		if time.Now().After(deadline) {
			t.Fatalf("served %d of %d within 60s", served, from+n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// untilRefusedByRedis lets the callers go on until every limiter was refused by the new master.
func (f *holdFleet) untilRefusedByRedis(t *testing.T) {
	t.Helper()
	f.target.Store(math.MaxInt64)
	f.promoted.Store(true)
	deadline := time.Now().Add(60 * time.Second)
	for i := range f.redisRefused {
		for !f.redisRefused[i].Load() {
			if time.Now().After(deadline) {
				t.Fatalf("limiter %d was not refused by the new master within 60s", i)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
}

func (f *holdFleet) stop() {
	close(f.quit)
	f.wg.Wait()
}

// Three replicas reserve and settle one key through a Sentinel group, each request using a
// random part of its hold and sometimes more (debt); the replica is cut off (it lags), then the
// master killed, and the replicas go on through the promotion until the new master refuses
// them. The held units are counts like any grant: the shares restore what the promoted replica
// lacked, held units included, so no count lost in the failover is admitted again. While no
// master answers, the failure mode (Closed) refuses every reserve; a settle that failed says so,
// is final, and leaves its hold counted (spent past its deadline).
func TestHoldsSurviveASentinelFailover(t *testing.T) {
	for _, alg := range []limiter.Algorithm{limiter.FixedWindow, limiter.SlidingWindowCounter} {
		t.Run(string(alg), func(t *testing.T) {
			g := NewWithT(t)
			grp, err := redistest.StartSentinel()
			g.Expect(err).NotTo(HaveOccurred())
			t.Cleanup(func() { _ = grp.Close() })
			const limit, perLimiter, want = 20000, 4, 100
			// A day's window, and 5 minutes left of it (more than this test's waits add up to):
			// its decisions all fall in one window.
			lim := limiter.Limit{Algorithm: alg, Requests: limit, Window: 24 * time.Hour, Replicas: 3,
				FailureMode: limiter.FailureModeClosed}
			var ls []*limiter.Limiter
			fleet := &heartbeats{}
			for range 3 {
				// A second to answer: a timeout on a live master leaves a hold or a settle
				// counted and unknown, which this test would count as used budget.
				l := newLimiter(t, sentinelClientWith(t, grp, time.Second), limiter.TestOptions{LeaseHorizon: -1,
					BreakerOpenFor: 100 * time.Millisecond, ReplicaID: limiter.NewReplicaID(),
					RestoreHold: 2 * time.Second, OnRestore: fleet.tell})
				ls = append(ls, l)
				fleet.mu.Lock()
				fleet.ls = append(fleet.ls, l)
				fleet.mu.Unlock()
			}
			ctx := context.Background()
			c := sentinelClient(t, grp)
			exactWindow(t, c, lim.Window, 5*time.Minute)
			key := uniqueKey(t)
			f := startHoldFleet(t, ls, key, lim, perLimiter)
			// A quarter before the cut and at least a quarter after it, whenever the cut takes
			// effect (it waits for the replica to see its link down, under the callers' load,
			// while they may reach the pause point): at most 3/8 + 3/8 of the limit, with the
			// holds in flight, is served before the kill.
			f.until(t, limit/4, limit*3/8)
			g.Expect(grp.CutReplica(ctx)).To(Succeed())
			f.cut.Store(true)
			atCut := f.until(t, limit/4, limit*3/8)
			f.killed.Store(true)
			g.Expect(grp.Master().Stop()).To(Succeed())
			killed := time.Now()
			wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
			defer cancel()
			g.Expect(grp.WaitMaster(wctx, grp.Replica())).To(Succeed())
			switched := time.Since(killed)
			f.untilRefusedByRedis(t)
			f.stop()

			var restored, held, lapsed uint64
			open := 0
			for _, l := range ls {
				st := l.TestStats()
				restored += st.RestoredUnits
				held += st.HeldCalls
				lapsed += st.HoldsLapsed
				open += st.HoldsOpen
			}
			count := counted(t, c, key, lim)
			t.Logf("served %d of %d (settled %d, debt %d, kept by failed settles %d) in %d holds, %d expired; "+
				"settles failed: %d sent, %d unsent (breaker open); %d reserves refused, %d by the failure mode "+
				"(%d held for the restore); %d served when the cut was done, %d used of holds only the old master "+
				"counted; %d units restored; the new master counts %d; Sentinel switched in %s",
				f.served, limit, f.settledUsed, f.debt, f.keptUsed, f.holds, f.expired, f.failedSent, f.failedOpen,
				f.refused, f.failClosed, held, atCut, f.lagged, restored, count, switched.Round(10*time.Millisecond))

			// No overshoot from lost counts: what the settles charged, and what the requests
			// whose settle failed used of holds that last the window, fit the limit and the
			// debts recorded. (Those whose settle failed and whose hold went back by itself at
			// its deadline are the failure mode's price: their units were admitted again.)
			g.Expect(f.settledUsed).To(BeNumerically("<=", limit+f.debt))
			g.Expect(f.settledUsed + f.keptUsed).To(BeNumerically("<=", limit+f.debt))
			// The promoted replica lacked what was held and used after the cut (the precondition,
			// which the fleet's serving after the cut makes sure of), and the shares restored it.
			// (It lacked at least lagged, less what the holds in flight at the cut, one a caller,
			// gave back on the old master alone: at most want each.)
			g.Expect(f.lagged).To(BeNumerically(">", 3*perLimiter*want), "too little was served after the cut to be missed")
			g.Expect(restored).To(BeNumerically(">", 0), "the promoted replica lacked what was held and used after the cut")
			g.Expect(f.failClosed).To(BeNumerically(">", 0), "reserves while the master was down were refused")
			// The budget is spent on use, not lost: every limiter was refused by the new master,
			// which then counted more than limit - least (10). Of that, what nobody used is
			// bounded by the holds in flight when the replica was cut off (settled on the old
			// master only: their returns are lost), when the master died (their settles failed:
			// the rest of the hold stays, or goes back at a deadline that may come after the
			// last refusal) and when the last limiter was refused (their returns came after
			// it), one a caller each, at most want units each: so the settles and the failed
			// settles' kept use are at least limit - 3 x 12 x 100 - 10, 81.9% of it. 80% leaves
			// room for three timeouts on a loaded machine, each costing at most one hold.
			g.Expect(f.settledUsed + f.keptUsed).To(BeNumerically(">=", limit*80/100))

			// A settle that failed leaves its hold to its deadline, when it is swept and stays
			// spent. Each reserve sweeps at most 16 records past their deadline.
			var last time.Time
			for _, h := range f.short {
				if h.Deadline.After(last) {
					last = h.Deadline
				}
			}
			time.Sleep(time.Until(last))
			sweeper := newLimiter(t, c, limiter.TestOptions{ReplicaID: limiter.NewReplicaID(), PrecheckSize: -1})
			hk := holdsKey(key, lim)
			deadline := time.Now().Add(30 * time.Second)
			for {
				// Refused once it swept (least is the whole limit): it holds nothing itself.
				_, h, err := sweeper.Reserve(ctx, key, lim, limit, limit, time.Millisecond)
				g.Expect(err).NotTo(HaveOccurred())
				g.Expect(h).To(BeNil())
				due, err := c.ZCount(ctx, hk, "-inf", strconv.FormatInt(redisNowMS(t, c), 10)).Result()
				g.Expect(err).NotTo(HaveOccurred())
				if due == 0 {
					break
				}
				g.Expect(time.Now().Before(deadline)).To(BeTrue(), "%d holds past their deadline are still counted", due)
				time.Sleep(10 * time.Millisecond)
			}
			left, err := c.ZCard(ctx, hk).Result()
			g.Expect(err).NotTo(HaveOccurred())
			swept := counted(t, c, key, lim)
			t.Logf("%d failed settles of short holds went back by themselves; %d holds left to the window's end on the new master, "+
				"%d in the replicas' tables, %d lapsed there; the new master counts %d",
				len(f.short), left, open, lapsed, swept)
			// Nothing lost stays lost: the new master counts every unit the settles charged, and
			// what the requests used of the holds that last the window and whose settle failed
			// (the shares keep that until their deadline, whether the settle ran or not).
			g.Expect(swept).To(BeNumerically(">=", f.settledUsed+f.keptUsed))
		})
	}
}
