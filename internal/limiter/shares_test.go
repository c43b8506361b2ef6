package limiter_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"github.com/redis/go-redis/v9"

	"github.com/redline-dev/redline/internal/limiter"
	"github.com/redline-dev/redline/internal/limiter/scripts"
	"github.com/redline-dev/redline/internal/redisconn"
	"github.com/redline-dev/redline/internal/testutil/redistest"
)

// The window state and its shares, script by script: what the scripts promise whatever the
// limiter does (shares_open.lua).
func TestSharesScripts(t *testing.T) {
	ctx := context.Background()
	c := newClient(t, shared.URL())
	fw, _ := scripts.For(string(limiter.FixedWindow))
	const window = int64(3_600_000)
	run := func(g Gomega, s scripts.Script, key string, args ...any) []int64 {
		cmds := []redis.Cmder{scripts.EvalSha(ctx, s, []string{key}, args...)}
		scripts.Exec(ctx, c, cmds, []scripts.Script{s})
		n, err := cmds[0].(*redis.Cmd).Int64Slice()
		g.Expect(err).NotTo(HaveOccurred())
		return n
	}
	count := func(g Gomega, key, field string) int64 {
		n, err := c.HGet(ctx, key, field).Int64()
		g.Expect(err).NotTo(HaveOccurred())
		return n
	}
	// grant asks for cost units as replica id, which knows it was granted known in window start.
	grant := func(g Gomega, key string, cost int64, id string, start, known, knownPrev int64) []int64 {
		return run(g, fw, key, 100, window, cost, 0, cost, id, start, known, knownPrev)
	}

	// earlyInAWindow waits until Redis's clock is in the first half of a window of w ms (so
	// that a case has the rest of it) and returns how to read that clock.
	earlyInAWindow := func(g Gomega, w int64) func() int64 {
		redisMS := func() int64 {
			n, err := c.Time(ctx).Result()
			g.Expect(err).NotTo(HaveOccurred())
			return n.UnixMilli()
		}
		g.Eventually(func() int64 { return redisMS() % w }).WithTimeout(5 * time.Second).WithPolling(5 * time.Millisecond).
			Should(BeNumerically("<", w/2))
		return redisMS
	}

	t.Run("a lost window is restored once, however often it is asserted", func(t *testing.T) {
		g := NewWithT(t)
		key := uniqueKey(t) + ":swc"
		r := grant(g, key, 30, "a", 0, 0, 0)
		g.Expect(r[5]).To(BeEquivalentTo(30))
		start := r[4] / 1000 / window * window
		g.Expect(grant(g, key, 20, "b", 0, 0, 0)[5]).To(BeEquivalentTo(20))
		g.Expect(c.Del(ctx, key).Err()).To(Succeed()) // Redis lost the window

		restored := 0
		for range 3 {
			restored += int(run(g, fw, key, 100, window, 0, 0, 0, "a", start, 30, 0)[6])
		}
		g.Expect(restored).To(Equal(30))
		g.Expect(count(g, key, "c")).To(BeEquivalentTo(30), "a's share, once")
		r = grant(g, key, 1, "b", start, 20, 0)
		g.Expect(r[6]).To(BeEquivalentTo(20), "b restores its share with its next call")
		g.Expect(r[5]).To(BeEquivalentTo(1))
		g.Expect(count(g, key, "c")).To(BeEquivalentTo(51))
		g.Expect(grant(g, key, 1, "b", start, 21, 0)[6]).To(BeZero(), "nothing twice")
		g.Expect(count(g, key, "c")).To(BeEquivalentTo(52))
	})

	t.Run("a partly replicated share is topped up, not added again", func(t *testing.T) {
		g := NewWithT(t)
		key := uniqueKey(t) + ":swc"
		r := grant(g, key, 10, "a", 0, 0, 0)
		start := r[4] / 1000 / window * window
		// What a replica that saw a's first grant of 10 but not its next 15 holds.
		f, err := c.HGet(ctx, key, "a").Result()
		g.Expect(err).NotTo(HaveOccurred())
		r = grant(g, key, 15, "a", start, 10, 0)
		g.Expect(r[5]).To(BeEquivalentTo(15))
		g.Expect(c.HSet(ctx, key, "c", 10, "a", f).Err()).To(Succeed())

		r = grant(g, key, 5, "a", start, 25, 0)
		g.Expect(r[6]).To(BeEquivalentTo(15), "only the 15 the replica did not see")
		g.Expect(count(g, key, "c")).To(BeEquivalentTo(30))
	})

	t.Run("knowledge older than the state adds nothing", func(t *testing.T) {
		g := NewWithT(t)
		key := uniqueKey(t) + ":swc"
		r := grant(g, key, 40, "a", 0, 0, 0)
		start := r[4] / 1000 / window * window
		// A reply lost on the way back: Redis counted 40, the replica knows of none.
		r = grant(g, key, 1, "a", start, 0, 0)
		g.Expect(r[6]).To(BeZero())
		g.Expect(count(g, key, "c")).To(BeEquivalentTo(41))
	})

	t.Run("a lease goes back only to a Redis that holds it", func(t *testing.T) {
		g := NewWithT(t)
		key := uniqueKey(t) + ":swc"
		ret := scripts.LeaseReturn()
		r := grant(g, key, 30, "a", 0, 0, 0)
		start := r[4] / 1000 / window * window
		g.Expect(grant(g, key, 20, "b", 0, 0, 0)[5]).To(BeEquivalentTo(20))
		// z never held units here: a return of 9 by z takes nothing off the others' count.
		g.Expect(run(g, ret, key, window, start, 9, "z", start, 0, 0)).To(Equal([]int64{0, 0}))
		g.Expect(count(g, key, "c")).To(BeEquivalentTo(50))
		// After a loss, a's return restores its share first, then gives back what it returns.
		g.Expect(c.HSet(ctx, key, "c", 20, "a", 0).Err()).To(Succeed())
		g.Expect(run(g, ret, key, window, start, 10, "a", start, 30, 0)).To(Equal([]int64{10, 30}))
		g.Expect(count(g, key, "c")).To(BeEquivalentTo(40), "20 + a's 30 restored - 10 returned")
		g.Expect(run(g, ret, key, window, start, 100, "a", start, 20, 0)).To(Equal([]int64{20, 0}),
			"never more than a's share")
		g.Expect(count(g, key, "c")).To(BeEquivalentTo(20))
	})

	t.Run("a new window drops dead replicas' fields, but never scans a stuffed state", func(t *testing.T) {
		for _, dead := range []int{40, 200} {
			g := NewWithT(t)
			key := uniqueKey(t) + ":swc"
			now, err := c.Time(ctx).Result()
			g.Expect(err).NotTo(HaveOccurred())
			start := now.UnixMilli() / window * window
			q := (start / window) % 4096
			// The state of the previous window: one live replica's field (a, of that window) and
			// dead ones of a window long gone.
			fields := []any{"s", start - window, "c", 10, "p", 0, "a", 10*4096 + (q+4095)%4096}
			for i := range dead {
				fields = append(fields, fmt.Sprintf("dead%04d", i), 5*4096+(q+4000)%4096)
			}
			g.Expect(c.HSet(ctx, key, fields...).Err()).To(Succeed())
			g.Expect(grant(g, key, 1, "b", 0, 0, 0)[5]).To(BeEquivalentTo(1))
			n, err := c.HLen(ctx, key).Result()
			g.Expect(err).NotTo(HaveOccurred())
			if dead <= 128 {
				g.Expect(n).To(BeEquivalentTo(5), "s, c, p, a (of the previous window) and b")
			} else {
				g.Expect(n).To(BeEquivalentTo(5+dead), "a stuffed state is left as it is")
			}
		}
	})

	t.Run("the previous window is restored where the roll was lost", func(t *testing.T) {
		g := NewWithT(t)
		key := uniqueKey(t) + ":swc"
		swc, _ := scripts.For(string(limiter.SlidingWindowCounter))
		// A short window: the replica was granted 40 in window k-1, and the Redis that took
		// over lost all of it; in window k the replica's first call restores p.
		const w = int64(2000)
		redisMS := earlyInAWindow(g, w)
		r := run(g, swc, key, 100, w, 40, 0, 40, "a", 0, 0, 0)
		g.Expect(r[5]).To(BeEquivalentTo(40))
		prevStart := r[4] / 1000 / w * w
		g.Expect(c.Del(ctx, key).Err()).To(Succeed())
		g.Eventually(func() int64 { return redisMS() / w * w }).WithTimeout(5 * time.Second).WithPolling(10 * time.Millisecond).
			Should(BeEquivalentTo(prevStart + w))
		r = run(g, swc, key, 100, w, 1, 0, 1, "a", prevStart, 40, 0)
		g.Expect(r[6]).To(BeEquivalentTo(40))
		g.Expect(count(g, key, "p")).To(BeEquivalentTo(40))
		r = run(g, swc, key, 100, w, 1, 0, 1, "a", prevStart+w, 1, 40)
		g.Expect(r[6]).To(BeZero(), "p is restored once")
		g.Expect(count(g, key, "p")).To(BeEquivalentTo(40))
	})

	// call is one decision of replica id with its known share, a hold of 60 s and the peers it
	// saw live lately.
	call := func(g Gomega, key string, cost int64, id string, start, known, peers int64) []int64 {
		return run(g, fw, key, 100, window, cost, 0, cost, id, start, known, 0, 60_000, peers)
	}
	// lost grants ra, rb and rc (ids as short as a state's own fields would collide) 10 each in a window and then loses the state, as a failover to a
	// replica that received none of it; it returns the window's start.
	lost := func(g Gomega, key string) int64 {
		var start int64
		for _, id := range []string{"ra", "rb", "rc"} {
			r := call(g, key, 10, id, 0, 0, 3)
			g.Expect(r[5]).To(BeEquivalentTo(10))
			start = r[4] / 1000 / window * window
		}
		g.Expect(c.Del(ctx, key).Err()).To(Succeed())
		return start
	}
	marks := func(g Gomega, key string) int {
		all, err := c.HGetAll(ctx, key).Result()
		g.Expect(err).NotTo(HaveOccurred())
		n := 0
		for f := range all {
			if strings.HasPrefix(f, "@") {
				n++
			}
		}
		return n
	}

	t.Run("a hold ends once as many replicas as were live re-asserted", func(t *testing.T) {
		g := NewWithT(t)
		key := uniqueKey(t) + ":swc"
		start := lost(g, key)
		r := call(g, key, 1, "ra", start, 10, 3)
		g.Expect(r[2]).To(BeEquivalentTo(-3), "a restored its share: grants wait")
		g.Expect(r[6]).To(BeEquivalentTo(10))
		r = call(g, key, 1, "ra", start, 10, 3)
		g.Expect(r[2]).To(BeEquivalentTo(-3), "a replica counts once in a hold")
		r = call(g, key, 1, "rb", start, 10, 1)
		g.Expect(r[2]).To(BeEquivalentTo(-3), "b is the second of three: a caller that saw fewer peers does not shorten the hold")
		g.Expect(marks(g, key)).To(Equal(2))
		r = run(g, fw, key, 100, window, 0, 0, 0, "rc", start, 10, 0, 60_000, 0) // c re-asserts
		g.Expect(r[6]).To(BeEquivalentTo(10))
		g.Expect(marks(g, key)).To(BeZero(), "the hold ended and its marks went")
		r = call(g, key, 1, "ra", start, 10, 3)
		g.Expect(r[0]).To(BeEquivalentTo(1), "grants go on")
		g.Expect(count(g, key, "c")).To(BeEquivalentTo(31), "every share once, and the grant")
	})

	t.Run("a hold whose peers are unknown runs its length", func(t *testing.T) {
		g := NewWithT(t)
		key := uniqueKey(t) + ":swc"
		start := lost(g, key)
		for _, id := range []string{"ra", "rb", "rc"} {
			r := call(g, key, 1, id, start, 10, 0)
			g.Expect(r[2]).To(BeEquivalentTo(-3), id)
		}
		g.Expect(count(g, key, "c")).To(BeEquivalentTo(30))
	})

	t.Run("a hold carries over into the next window with its marks", func(t *testing.T) {
		g := NewWithT(t)
		swc, _ := scripts.For(string(limiter.SlidingWindowCounter))
		key := uniqueKey(t) + ":swc"
		const w = int64(2000)
		redisMS := earlyInAWindow(g, w)
		one := func(id string, start, known, knownPrev, peers int64) []int64 {
			return run(g, swc, key, 100, w, 1, 0, 1, id, start, known, knownPrev, 60_000, peers)
		}
		r := one("ra", 0, 0, 0, 2)
		g.Expect(r[5]).To(BeEquivalentTo(1))
		start := r[4] / 1000 / w * w
		g.Expect(one("rb", 0, 0, 0, 2)[5]).To(BeEquivalentTo(1))
		g.Expect(c.Del(ctx, key).Err()).To(Succeed())
		g.Expect(one("ra", start, 1, 0, 2)[2]).To(BeEquivalentTo(-3), "a restored: the hold begins")
		g.Eventually(func() int64 { return redisMS() / w * w }).WithTimeout(5 * time.Second).WithPolling(10 * time.Millisecond).
			Should(BeEquivalentTo(start + w))
		r = one("ra", start, 1, 0, 2)
		g.Expect(r[2]).To(BeEquivalentTo(-3), "the hold outlives its window")
		g.Expect(r[6]).To(BeZero())
		r = one("rb", start, 1, 0, 2)
		g.Expect(r[6]).To(BeEquivalentTo(1), "b's share of the window before")
		g.Expect(r[0]).To(BeEquivalentTo(1), "b is the second of two: the hold ends")
		g.Expect(count(g, key, "p")).To(BeEquivalentTo(2))
	})
}

// heartbeats stands in for the sidecars' heartbeats, which tell every replica of a policy
// that one of them found Redis short of its shares: each then re-asserts its own.
type heartbeats struct {
	mu sync.Mutex
	ls []*limiter.Limiter
}

func (h *heartbeats) tell(string, int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, l := range h.ls {
		l.Reassert()
	}
}

// exactWindow waits, if need be, until the current window of w on Redis's clock has at least
// margin left, so that a test's decisions all fall in one window.
func exactWindow(t *testing.T, c redis.UniversalClient, w, margin time.Duration) {
	t.Helper()
	now, err := c.Time(context.Background()).Result()
	if err != nil {
		t.Fatalf("reading Redis's clock: %v", err)
	}
	left := w - time.Duration(now.UnixMilli()%w.Milliseconds())*time.Millisecond
	if left < margin {
		time.Sleep(left + 10*time.Millisecond)
	}
}

// fleetDemand drives demand well above lim through every limiter, counting admissions in
// admitted, until the returned stop is called; stop waits for every caller.
func fleetDemand(ls []*limiter.Limiter, key string, lim limiter.Limit, admitted *atomic.Int64) (stop func()) {
	quit := make(chan struct{})
	var wg sync.WaitGroup
	for _, l := range ls {
		for range 4 {
			wg.Go(func() {
				for {
					select {
					case <-quit:
						return
					default:
					}
					r, err := l.Allow(context.Background(), key, lim, 1)
					if err == nil && r.Allowed {
						admitted.Add(1)
					}
					if err != nil || !r.Allowed {
						time.Sleep(time.Millisecond)
					}
				}
			})
		}
	}
	return func() { close(quit); wg.Wait() }
}

// waitAdmitted polls until admitted reaches n.
func waitAdmitted(t *testing.T, admitted *atomic.Int64, n int64) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for admitted.Load() < n {
		if time.Now().After(deadline) {
			t.Fatalf("admitted %d of %d within 30s", admitted.Load(), n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// demandUntil drives demand through every limiter, as fleetDemand does, until admitted reaches
// n, and returns once every driver has stopped. Each driver looks at the count before each
// decision, so the count ends within len(ls)*4 of n however fast leased decisions are and however
// late a poller would wake: a phase admits what the test planned, not what the scheduler allowed.
func demandUntil(t *testing.T, ls []*limiter.Limiter, key string, lim limiter.Limit, admitted *atomic.Int64, n int64) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	var wg sync.WaitGroup
	for _, l := range ls {
		for range 4 {
			wg.Go(func() {
				for admitted.Load() < n && time.Now().Before(deadline) {
					r, err := l.Allow(context.Background(), key, lim, 1)
					if err == nil && r.Allowed {
						admitted.Add(1)
					}
					if err != nil || !r.Allowed {
						time.Sleep(time.Millisecond)
					}
				}
			})
		}
	}
	wg.Wait()
	if got := admitted.Load(); got < n {
		t.Fatalf("admitted %d of %d within 30s", got, n)
	}
}

// A Redis restarted empty mid-window (no persistence): three replicas, leasing, each restore
// what they were granted, so the window admits no more than its limit; without shares, it
// admits the limit again after the restart.
func TestSharesRestoreARestartedRedis(t *testing.T) {
	for _, alg := range []limiter.Algorithm{limiter.FixedWindow, limiter.SlidingWindowCounter} {
		for _, withShares := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/shares=%v", alg, withShares), func(t *testing.T) {
				g := NewWithT(t)
				srv, err := redistest.Start()
				g.Expect(err).NotTo(HaveOccurred())
				t.Cleanup(func() { _ = srv.Close() })
				lim := limiter.Limit{Algorithm: alg, Requests: 2000, Window: time.Hour, Replicas: 3,
					FailureMode: limiter.FailureModeClosed}
				var ls []*limiter.Limiter
				var first redis.UniversalClient
				fleet := &heartbeats{}
				for range 3 {
					c, err := redisconn.NewClient(srv.URL(), redisconn.Options{PoolSize: 8, DialTimeout: time.Second,
						ReadTimeout: time.Second, WriteTimeout: time.Second, PoolTimeout: time.Second})
					g.Expect(err).NotTo(HaveOccurred())
					t.Cleanup(func() { _ = c.Close() })
					if first == nil {
						first = c
					}
					o := limiter.Options{LeaseHorizon: 2 * time.Second, BreakerOpenFor: 100 * time.Millisecond}
					if withShares {
						o.ReplicaID, o.RestoreHold, o.OnRestore = limiter.NewReplicaID(), 2*time.Second, fleet.tell
					}
					ls = append(ls, newLimiter(t, c, o))
					fleet.ls = append(fleet.ls, ls[len(ls)-1])
				}
				exactWindow(t, first, time.Hour, 2*time.Minute)
				key := uniqueKey(t)
				admitted := &atomic.Int64{}
				stop := fleetDemand(ls, key, lim, admitted)
				waitAdmitted(t, admitted, 1200)

				lost := admitted.Load() // at least: every unit admitted was counted before
				g.Expect(srv.Stop()).To(Succeed())
				g.Expect(srv.Start()).To(Succeed())
				restarted := time.Now()
				// Demand goes on until the limit is surely spent, and a few seconds more.
				time.Sleep(5 * time.Second)
				stop()
				total := admitted.Load()
				var restored uint64
				for _, l := range ls {
					restored += l.Stats().RestoredUnits
				}
				t.Logf("admitted %d of %d in the window (%d before Redis was killed), %d units restored, %s after the restart",
					total, lim.Requests, lost, restored, time.Since(restarted).Round(time.Millisecond))
				if !withShares {
					g.Expect(total).To(BeNumerically(">", lim.Requests+lost/2),
						"the restart must lose counts for this test to mean anything")
					return
				}
				g.Expect(total).To(BeNumerically("<=", lim.Requests), "grants waited for every replica's shares")
				// Redis's count holds every admitted unit again: nothing lost stays lost.
				c, err := first.HGet(context.Background(), key+":"+"swc", "c").Int64()
				g.Expect(err).NotTo(HaveOccurred())
				g.Expect(c).To(BeNumerically(">=", total))
				// What one replica grants before another has re-asserted is the bound (README,
				// Redis failover): never more than the lost shares, which without shares are
				// all admitted again.
				g.Expect(total).To(BeNumerically("<=", lim.Requests+lost))
				g.Expect(total).To(BeNumerically(">=", lim.Requests*95/100))
				g.Expect(restored).To(BeNumerically(">=", lost))
			})
		}
	}
}

// More keys than the share table: the units beyond it are counted as unkept, and decisions go
// on exactly.
func TestShareTableBound(t *testing.T) {
	g := NewWithT(t)
	c := newClient(t, shared.URL())
	l := newLimiter(t, c, limiter.Options{ReplicaID: limiter.NewReplicaID(), ShareKeys: 4})
	lim := limiter.Limit{Algorithm: limiter.FixedWindow, Requests: 3, Window: time.Hour, Replicas: 1}
	for i := range 10 {
		key := fmt.Sprintf("%s-%d", uniqueKey(t), i)
		for j := range 4 {
			r, err := l.Allow(context.Background(), key, lim, 1)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(r.Allowed).To(Equal(j < 3), "key %d decision %d", i, j)
		}
	}
	st := l.Stats()
	g.Expect(st.ShareKeys).To(Equal(4))
	g.Expect(st.UnkeptShareUnits).To(BeEquivalentTo(6 * 3))
}

// A shard's master dies while its replica is behind (cut off from it), and the replica takes
// over: the replicas restore the window on the new master, whose count holds every unit
// admitted.
func TestSharesRestoreAClusterFailover(t *testing.T) {
	g := NewWithT(t)
	cl, err := redistest.StartClusterWithReplicas(3)
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { _ = cl.Close() })
	lim := limiter.Limit{Algorithm: limiter.FixedWindow, Requests: 20000, Window: time.Hour, Replicas: 2,
		FailureMode: limiter.FailureModeClosed}
	var ls []*limiter.Limiter
	var first redis.UniversalClient
	fleet := &heartbeats{}
	for range 2 {
		c, err := redisconn.NewClient(cl.URL(), redisconn.Options{
			ReadTimeout: 200 * time.Millisecond, WriteTimeout: 200 * time.Millisecond,
			DialTimeout: 200 * time.Millisecond, PoolTimeout: 500 * time.Millisecond,
		})
		g.Expect(err).NotTo(HaveOccurred())
		t.Cleanup(func() { _ = c.Close() })
		if first == nil {
			first = c
		}
		ls = append(ls, newLimiter(t, c, limiter.Options{LeaseHorizon: 2 * time.Second,
			BreakerOpenFor: 100 * time.Millisecond, ReplicaID: limiter.NewReplicaID(),
			RestoreHold: 2 * time.Second, OnRestore: fleet.tell}))
		fleet.mu.Lock()
		fleet.ls = append(fleet.ls, ls[len(ls)-1])
		fleet.mu.Unlock()
	}
	exactWindow(t, first, time.Hour, 2*time.Minute)
	key := uniqueKey(t)
	ctx := context.Background()
	master, err := first.(*redis.ClusterClient).MasterForKey(ctx, key+":swc")
	g.Expect(err).NotTo(HaveOccurred())
	replica, err := cl.ReplicaOf(master.Options().Addr)
	g.Expect(err).NotTo(HaveOccurred())
	rc := redis.NewClient(&redis.Options{Addr: replica.Addr(), MaxRetries: -1})
	t.Cleanup(func() { _ = rc.Close() })
	mc := redis.NewClient(&redis.Options{Addr: master.Options().Addr, MaxRetries: -1})
	t.Cleanup(func() { _ = mc.Close() })

	admitted := &atomic.Int64{}
	demandUntil(t, ls, key, lim, admitted, 2000)
	// Cut the replica off: it cannot authenticate to its master any more, and its link goes.
	g.Expect(rc.ConfigSet(ctx, "masteruser", "nobody").Err()).To(Succeed())
	g.Expect(rc.ConfigSet(ctx, "masterauth", "wrong").Err()).To(Succeed())
	g.Expect(mc.Do(ctx, "CLIENT", "KILL", "TYPE", "replica").Err()).To(Succeed())
	cut := admitted.Load()
	demandUntil(t, ls, key, lim, admitted, cut+3000)
	behind := admitted.Load() - cut
	for _, s := range cl.Nodes {
		if s.Addr() == master.Options().Addr {
			g.Expect(s.Stop()).To(Succeed())
		}
	}
	g.Expect(rc.Do(ctx, "CLUSTER", "FAILOVER", "TAKEOVER").Err()).To(Succeed())
	stop := fleetDemand(ls, key, lim, admitted)
	time.Sleep(8 * time.Second)
	stop()
	total := admitted.Load()
	var restored uint64
	for _, l := range ls {
		restored += l.Stats().RestoredUnits
	}
	state, _ := rc.HGetAll(ctx, key+":swc").Result()
	t.Logf("admitted %d of %d; %d admitted after the replica was cut off; %d units restored; the new master holds %v",
		total, lim.Requests, behind, restored, state)
	for i, l := range ls {
		t.Logf("limiter %d: %+v", i, l.Stats())
	}
	// behind counts admissions from leases granted before the cut too, so it bounds what the
	// replica missed from above.
	g.Expect(restored).To(BeNumerically(">", behind/2), "the new master lacked what the replica missed")
	c, err := strconv.ParseInt(state["c"], 10, 64)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(c).To(BeNumerically(">=", total), "the new master's count holds every admitted unit")
	// Grants of the key waited until both had re-asserted (the restoring one tells the other,
	// as heartbeats do): the window admits no more than its limit.
	g.Expect(total).To(BeNumerically("<=", lim.Requests))
	g.Expect(total).To(BeNumerically(">=", lim.Requests*95/100))
}

// Sentinel: the replica is cut off (it cannot resync), the master killed, and the sentinels
// promote the replica, which lacks what was admitted after the cut: the replicas, following
// the new master by themselves, restore it, and the window admits exactly its limit.
func TestSharesRestoreASentinelFailover(t *testing.T) {
	for _, leases := range []bool{true, false} {
		t.Run(fmt.Sprintf("leases=%v", leases), func(t *testing.T) {
			g := NewWithT(t)
			grp, err := redistest.StartSentinel()
			g.Expect(err).NotTo(HaveOccurred())
			t.Cleanup(func() { _ = grp.Close() })
			lim := limiter.Limit{Algorithm: limiter.SlidingWindowCounter, Requests: 20000, Window: time.Hour, Replicas: 3,
				FailureMode: limiter.FailureModeClosed}
			horizon := 2 * time.Second
			if !leases {
				horizon = -1
			}
			var ls []*limiter.Limiter
			var first redis.UniversalClient
			fleet := &heartbeats{}
			for range 3 {
				c, err := redisconn.NewClient(grp.URL(), redisconn.Options{PoolSize: 8, DialTimeout: 200 * time.Millisecond,
					ReadTimeout: 200 * time.Millisecond, WriteTimeout: 200 * time.Millisecond, PoolTimeout: 500 * time.Millisecond})
				g.Expect(err).NotTo(HaveOccurred())
				t.Cleanup(func() { _ = c.Close() })
				if first == nil {
					first = c
				}
				l := newLimiter(t, c, limiter.Options{LeaseHorizon: horizon, BreakerOpenFor: 100 * time.Millisecond,
					ReplicaID: limiter.NewReplicaID(), RestoreHold: 2 * time.Second, OnRestore: fleet.tell})
				ls = append(ls, l)
				fleet.mu.Lock()
				fleet.ls = append(fleet.ls, l)
				fleet.mu.Unlock()
			}
			ctx := context.Background()
			exactWindow(t, first, time.Hour, 2*time.Minute)
			key := uniqueKey(t)
			admitted := &atomic.Int64{}
			demandUntil(t, ls, key, lim, admitted, 3000)
			g.Expect(grp.CutReplica(ctx)).To(Succeed())
			cut := admitted.Load()
			demandUntil(t, ls, key, lim, admitted, cut+4000)
			behind := admitted.Load() - cut
			g.Expect(grp.Master().Stop()).To(Succeed())
			stop := fleetDemand(ls, key, lim, admitted)
			g.Expect(grp.WaitMaster(ctx, grp.Replica())).To(Succeed())
			time.Sleep(8 * time.Second)
			stop()
			total := admitted.Load()
			var restored uint64
			for _, l := range ls {
				restored += l.Stats().RestoredUnits
			}
			t.Logf("admitted %d of %d; %d after the replica was cut off; %d units restored", total, lim.Requests, behind, restored)
			g.Expect(restored).To(BeNumerically(">", behind/2), "the promoted replica lacked what it missed")
			g.Expect(total).To(BeNumerically("<=", lim.Requests))
			g.Expect(total).To(BeNumerically(">=", lim.Requests*95/100))
			for _, l := range ls {
				g.Expect(l.Stats().Shards).To(HaveExactElements(HaveField("Name", "all")), "a Sentinel group is one shard, whichever node is master")
			}
		})
	}
}
