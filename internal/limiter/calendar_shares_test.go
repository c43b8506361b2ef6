package limiter_test

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"github.com/redis/go-redis/v9"

	"github.com/redline-dev/redline/internal/calendar"
	"github.com/redline-dev/redline/internal/limiter"
	"github.com/redline-dev/redline/internal/redisconn"
	"github.com/redline-dev/redline/internal/testutil/redistest"
)

// dayAwayFromMidnight is a Day calendar in a zone other than UTC whose day, on Redis's clock,
// has at least an hour left: Asia/Kolkata (UTC+5:30) or America/New_York (UTC-5/-4), whose
// midnights are more than nine hours apart, so one of them always has. A test's decisions
// then all fall in one day, however slow the machine.
func dayAwayFromMidnight(t *testing.T, c redis.UniversalClient, requests int64) (limiter.Limit, int64) {
	t.Helper()
	now, err := c.Time(context.Background()).Result()
	if err != nil {
		t.Fatalf("reading Redis's clock: %v", err)
	}
	for _, zone := range []string{"Asia/Kolkata", "America/New_York"} {
		lim := calendarLimit(t, requests, calendar.Spec{Unit: calendar.Day, Zone: zone})
		start, end := lim.Calendar.PeriodMS(now.UnixMilli())
		if end-now.UnixMilli() >= time.Hour.Milliseconds() {
			t.Logf("a day in %s, %s to %s", zone, time.UnixMilli(start).UTC(), time.UnixMilli(end).UTC())
			return lim, start
		}
	}
	t.Fatalf("no zone with an hour left in its day at %s", now)
	return limiter.Limit{}, 0
}

// calendarFleet makes three limiters on url, with shares (and heartbeats that spread a loss)
// or without.
func calendarFleet(t *testing.T, url string, withShares bool, timeout time.Duration) ([]*limiter.Limiter, redis.UniversalClient) {
	t.Helper()
	var ls []*limiter.Limiter
	var first redis.UniversalClient
	fleet := &heartbeats{}
	for range 3 {
		c, err := redisconn.NewClient(url, redisconn.Options{PoolSize: 8, DialTimeout: timeout,
			ReadTimeout: timeout, WriteTimeout: timeout, PoolTimeout: 2 * timeout})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		if first == nil {
			first = c
		}
		o := limiter.TestOptions{BreakerOpenFor: 100 * time.Millisecond}
		if withShares {
			o.ReplicaID, o.RestoreHold, o.OnRestore = limiter.NewReplicaID(), 2*time.Second, fleet.tell
		}
		l := newLimiter(t, c, o)
		ls = append(ls, l)
		fleet.mu.Lock()
		fleet.ls = append(fleet.ls, l)
		fleet.mu.Unlock()
	}
	return ls, first
}

func restoredUnits(ls []*limiter.Limiter) uint64 {
	var n uint64
	for _, l := range ls {
		n += l.Stats().RestoredUnits
	}
	return n
}

// A Redis restarted empty (no persistence) in the middle of a day in a zone that is not UTC:
// three replicas restore what they were granted in the day, so the day admits no more than
// its limit; without shares it admits the limit again after the restart.
func TestCalendarSharesRestoreARestartedRedis(t *testing.T) {
	for _, withShares := range []bool{true, false} {
		t.Run(fmt.Sprintf("shares=%v", withShares), func(t *testing.T) {
			g := NewWithT(t)
			srv, err := redistest.Start()
			g.Expect(err).NotTo(HaveOccurred())
			t.Cleanup(func() { _ = srv.Close() })
			ls, first := calendarFleet(t, srv.URL(), withShares, time.Second)
			lim, start := dayAwayFromMidnight(t, first, 2000)
			lim.FailureMode, lim.Replicas = limiter.FailureModeClosed, 3
			key := uniqueKey(t)
			admitted := &atomic.Int64{}
			stop := fleetDemand(ls, key, lim, admitted)
			waitAdmitted(t, admitted, 1200)

			lost := admitted.Load() // at least: every unit admitted was counted before
			g.Expect(srv.Stop()).To(Succeed())
			g.Expect(srv.Start()).To(Succeed())
			want := lim.Requests * 95 / 100
			if !withShares {
				want = lim.Requests + lost/2 + 1
			}
			waitSettled(t, admitted, want)
			stop()
			total, restored := admitted.Load(), restoredUnits(ls)
			t.Logf("admitted %d of %d in the day (%d before Redis was killed), %d units restored", total, lim.Requests, lost, restored)
			if !withShares {
				g.Expect(total).To(BeNumerically(">", lim.Requests+lost/2), "the restart must lose counts for this test to mean anything")
				return
			}
			g.Expect(total).To(BeNumerically("<=", lim.Requests), "grants waited for every replica's shares")
			g.Expect(total).To(BeNumerically(">=", lim.Requests*95/100))
			g.Expect(restored).To(BeNumerically(">=", lost))
			// Redis's count of the day holds every admitted unit again.
			c, err := first.Get(context.Background(), key+":cal:day:"+strconv.FormatInt(start, 10)).Int64()
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(c).To(BeNumerically(">=", total))
		})
	}
}

// Sentinel: the replica is cut off, the master killed, and the sentinels promote the replica,
// which lacks what was admitted in the day after the cut: the replicas restore it, and the
// day admits no more than its limit.
func TestCalendarSharesRestoreASentinelFailover(t *testing.T) {
	g := NewWithT(t)
	grp, err := redistest.StartSentinel()
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { _ = grp.Close() })
	ls, first := calendarFleet(t, grp.URL(), true, 200*time.Millisecond)
	lim, _ := dayAwayFromMidnight(t, first, 10000)
	lim.FailureMode, lim.Replicas = limiter.FailureModeClosed, 3
	ctx := context.Background()
	key := uniqueKey(t)
	admitted := &atomic.Int64{}
	demandUntil(t, ls, key, lim, admitted, 1500)
	g.Expect(grp.CutReplica(ctx)).To(Succeed())
	cut := admitted.Load()
	demandUntil(t, ls, key, lim, admitted, cut+2000)
	behind := admitted.Load() - cut
	g.Expect(grp.Master().Stop()).To(Succeed())
	stop := fleetDemand(ls, key, lim, admitted)
	g.Expect(grp.WaitMaster(ctx, grp.Replica())).To(Succeed())
	waitSettled(t, admitted, lim.Requests*95/100)
	stop()
	total, restored := admitted.Load(), restoredUnits(ls)
	t.Logf("admitted %d of %d in the day; %d after the replica was cut off; %d units restored", total, lim.Requests, behind, restored)
	g.Expect(restored).To(BeNumerically(">", behind/2), "the promoted replica lacked what it missed")
	g.Expect(total).To(BeNumerically("<=", lim.Requests))
	g.Expect(total).To(BeNumerically(">=", lim.Requests*95/100))
}

// A give-back leaves the replica's share before it reaches Redis: a restart after it restores
// what the day still counts, not the units that went back.
func TestCalendarSharesGiveBackLowersTheShare(t *testing.T) {
	g := NewWithT(t)
	srv, err := redistest.Start()
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { _ = srv.Close() })
	c := newClient(t, srv.URL())
	l := newLimiter(t, c, limiter.TestOptions{ReplicaID: limiter.NewReplicaID(), BreakerOpenFor: 100 * time.Millisecond})
	lim, start := dayAwayFromMidnight(t, c, 5)
	ctx := context.Background()
	key := uniqueKey(t)
	var first limiter.Result
	for i := range 3 {
		r, err := l.Allow(ctx, key, lim, 1)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(r.Allowed).To(BeTrue())
		if i == 0 {
			first = r
		}
	}
	back, err := l.GiveBack(ctx, []limiter.Refund{{Key: key, Limit: lim, Result: first}})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(back).To(Equal(int64(1)))

	g.Expect(srv.Stop()).To(Succeed())
	g.Expect(srv.Start()).To(Succeed())
	// The first decisions after the restart may meet the breaker or a reconnection: poll until
	// Redis decides, then count what the day still admits.
	admitted := 0
	g.Eventually(func() error {
		r, err := l.Allow(ctx, key, lim, 1)
		if err == nil && r.Allowed && r.Source == limiter.SourceRedis {
			admitted++
		}
		if err == nil && r.Source != limiter.SourceRedis {
			return fmt.Errorf("decided by %v", r.Source)
		}
		return err
	}).WithTimeout(30 * time.Second).WithPolling(50 * time.Millisecond).Should(Succeed())
	for range 5 {
		r, err := l.Allow(ctx, key, lim, 1)
		g.Expect(err).NotTo(HaveOccurred())
		if r.Allowed {
			g.Expect(r.Source).To(Equal(limiter.SourceRedis))
			admitted++
		}
	}
	g.Expect(admitted).To(Equal(3), "the day counts the 2 units kept, restored, and admits 3 more")
	n, err := c.Get(ctx, key+":cal:day:"+strconv.FormatInt(start, 10)).Int64()
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(n).To(Equal(int64(5)))
	g.Expect(l.Stats().RestoredUnits).To(Equal(uint64(2)))
}

// A cluster shard's master dies while its replica is cut off from it, and the replica takes
// over (CLUSTER FAILOVER TAKEOVER): the replicas restore the day on the new master, and the
// day admits no more than its limit.
func TestCalendarSharesRestoreAClusterFailover(t *testing.T) {
	g := NewWithT(t)
	cl, err := redistest.StartClusterWithReplicas(3)
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { _ = cl.Close() })
	ls, first := calendarFleet(t, cl.URL(), true, 200*time.Millisecond)
	lim, start := dayAwayFromMidnight(t, first, 10000)
	lim.FailureMode, lim.Replicas = limiter.FailureModeClosed, 3
	ctx := context.Background()
	key := uniqueKey(t)
	master, err := first.(*redis.ClusterClient).MasterForKey(ctx, key)
	g.Expect(err).NotTo(HaveOccurred())
	replica, err := cl.ReplicaOf(master.Options().Addr)
	g.Expect(err).NotTo(HaveOccurred())
	rc := redis.NewClient(&redis.Options{Addr: replica.Addr(), MaxRetries: -1})
	t.Cleanup(func() { _ = rc.Close() })
	mc := redis.NewClient(&redis.Options{Addr: master.Options().Addr, MaxRetries: -1})
	t.Cleanup(func() { _ = mc.Close() })

	admitted := &atomic.Int64{}
	demandUntil(t, ls, key, lim, admitted, 1500)
	g.Expect(rc.ConfigSet(ctx, "masteruser", "nobody").Err()).To(Succeed())
	g.Expect(rc.ConfigSet(ctx, "masterauth", "wrong").Err()).To(Succeed())
	g.Expect(mc.Do(ctx, "CLIENT", "KILL", "TYPE", "replica").Err()).To(Succeed())
	cut := admitted.Load()
	demandUntil(t, ls, key, lim, admitted, cut+2000)
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
	total, restored := admitted.Load(), restoredUnits(ls)
	count, err := rc.Get(ctx, key+":cal:day:"+strconv.FormatInt(start, 10)).Int64()
	g.Expect(err).NotTo(HaveOccurred())
	t.Logf("admitted %d of %d in the day; %d after the replica was cut off; %d units restored; the new master counts %d",
		total, lim.Requests, behind, restored, count)
	g.Expect(restored).To(BeNumerically(">", behind/2), "the new master lacked what the replica missed")
	g.Expect(count).To(BeNumerically(">=", total), "the new master's count holds every admitted unit")
	g.Expect(total).To(BeNumerically("<=", lim.Requests))
	g.Expect(total).To(BeNumerically(">=", lim.Requests*95/100))
}
