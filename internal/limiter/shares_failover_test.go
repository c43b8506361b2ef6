package limiter_test

import (
	"context"
	"fmt"
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

// waitSettled waits, while a fleet's demand runs, until admitted reaches want and then grows
// no more for quiet: the window is spent, whatever the machine's speed. A fixed time instead
// (the demand ran 5 or 8 seconds) left a loaded machine's fleet short of the limit after a
// failover. It fails after two minutes.
func waitSettled(t *testing.T, admitted *atomic.Int64, want int64) {
	t.Helper()
	const quiet = 3 * time.Second
	deadline := time.Now().Add(2 * time.Minute)
	last, since := admitted.Load(), time.Now()
	for time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
		if n := admitted.Load(); n != last {
			last, since = n, time.Now()
			continue
		}
		if last >= want && time.Since(since) >= quiet {
			return
		}
	}
	t.Errorf("the demand did not settle at %d or more admitted in two minutes: %d", want, admitted.Load())
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
// admits the limit again after the restart. So for a rolling window of 31 days, whose leases
// are a thousandth of the limit (16 units here) and whose shares restore them as any window's.
func TestSharesRestoreARestartedRedis(t *testing.T) {
	for _, tc := range []struct {
		alg    limiter.Algorithm
		window time.Duration
	}{{limiter.FixedWindow, time.Hour}, {limiter.SlidingWindowCounter, time.Hour}, {limiter.SlidingWindowCounter, 744 * time.Hour}} {
		alg := tc.alg
		for _, withShares := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/%s/shares=%v", alg, tc.window, withShares), func(t *testing.T) {
				g := NewWithT(t)
				srv, err := redistest.Start()
				g.Expect(err).NotTo(HaveOccurred())
				t.Cleanup(func() { _ = srv.Close() })
				lim := limiter.Limit{Algorithm: alg, Requests: 2000, Window: tc.window, Replicas: 3,
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
					o := limiter.TestOptions{LeaseHorizon: 2 * time.Second, BreakerOpenFor: 100 * time.Millisecond}
					if withShares {
						o.ReplicaID, o.RestoreHold, o.OnRestore = limiter.NewReplicaID(), 2*time.Second, fleet.tell
					}
					ls = append(ls, newLimiter(t, c, o))
					fleet.ls = append(fleet.ls, ls[len(ls)-1])
				}
				exactWindow(t, first, tc.window, 2*time.Minute)
				key := uniqueKey(t)
				admitted := &atomic.Int64{}
				stop := fleetDemand(ls, key, lim, admitted)
				waitAdmitted(t, admitted, 1200)

				lost := admitted.Load() // at least: every unit admitted was counted before
				g.Expect(srv.Stop()).To(Succeed())
				g.Expect(srv.Start()).To(Succeed())
				restarted := time.Now()
				// Demand goes on until the limit is surely spent: without shares, past the
				// limit by what the restart lost.
				want := lim.Requests * 95 / 100
				if !withShares {
					want = lim.Requests + lost/2 + 1
				}
				waitSettled(t, admitted, want)
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
				// What one replica grants before another has re-asserted is the bound
				// (docs/design/failover-shares.md): never more than the lost shares, which
				// without shares are all admitted again.
				g.Expect(total).To(BeNumerically("<=", lim.Requests+lost))
				g.Expect(total).To(BeNumerically(">=", lim.Requests*95/100))
				g.Expect(restored).To(BeNumerically(">=", lost))
			})
		}
	}
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
		ls = append(ls, newLimiter(t, c, limiter.TestOptions{LeaseHorizon: 2 * time.Second,
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
	waitSettled(t, admitted, lim.Requests*95/100)
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
				l := newLimiter(t, c, limiter.TestOptions{LeaseHorizon: horizon, BreakerOpenFor: 100 * time.Millisecond,
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
			waitSettled(t, admitted, lim.Requests*95/100)
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
