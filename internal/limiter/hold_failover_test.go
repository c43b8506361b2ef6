package limiter_test

import (
	"context"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"github.com/redis/go-redis/v9"

	"github.com/redline-dev/redline/internal/limiter"
	"github.com/redline-dev/redline/internal/redisconn"
	"github.com/redline-dev/redline/internal/testutil/redistest"
)

// sentinelClient is a client of grp with timeouts short enough that a dead master trips the
// breaker within a test, as the shares' failover tests use.
func sentinelClient(t *testing.T, grp *redistest.Sentinel) redis.UniversalClient {
	t.Helper()
	c, err := redisconn.NewClient(grp.URL(), redisconn.Options{PoolSize: 8, DialTimeout: 200 * time.Millisecond,
		ReadTimeout: 200 * time.Millisecond, WriteTimeout: 200 * time.Millisecond, PoolTimeout: 500 * time.Millisecond})
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
	l := newLimiter(t, sentinelClient(t, grp), limiter.Options{ReplicaID: limiter.NewReplicaID(),
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
	g.Expect(l.Stats().RestoredUnits).To(Equal(uint64(120)))
}
