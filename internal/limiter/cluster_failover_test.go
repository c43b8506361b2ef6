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

// A shard's master dies and its replica takes over (CLUSTER FAILOVER TAKEOVER): the limiter,
// with a sidecar's timeouts, decides on the new master within seconds, not after go-redis's
// next periodic reload of the slot map (34.8 s measured before it asked for one on failures).
func TestClusterFailoverDecidesOnTheNewMaster(t *testing.T) {
	g := NewWithT(t)
	cl, err := redistest.StartClusterWithReplicas(3)
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { _ = cl.Close() })

	c, err := redisconn.NewClient(cl.URL(), redisconn.Options{
		ReadTimeout: 100 * time.Millisecond, WriteTimeout: 100 * time.Millisecond,
		DialTimeout: 200 * time.Millisecond, PoolTimeout: 200 * time.Millisecond,
	})
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { _ = c.Close() })
	l := newLimiter(t, c, limiter.TestOptions{})
	lim := limiter.Limit{Algorithm: limiter.FixedWindow, Requests: 1_000_000, Window: time.Hour,
		Replicas: 1, FailureMode: limiter.FailureModeClosed}
	key := uniqueKey(t)
	decide := func() limiter.Result {
		r, err := l.Allow(context.Background(), key, lim, 1)
		g.Expect(err).NotTo(HaveOccurred())
		return r
	}
	g.Expect(decide().Source).To(Equal(limiter.SourceRedis))

	master, err := c.(*redis.ClusterClient).MasterForKey(context.Background(), key+":swc")
	g.Expect(err).NotTo(HaveOccurred())
	replica, err := cl.ReplicaOf(master.Options().Addr)
	g.Expect(err).NotTo(HaveOccurred())
	for _, s := range cl.Nodes {
		if s.Addr() == master.Options().Addr {
			g.Expect(s.Stop()).To(Succeed())
		}
	}
	killed := time.Now()
	rc := redis.NewClient(&redis.Options{Addr: replica.Addr(), MaxRetries: -1})
	t.Cleanup(func() { _ = rc.Close() })
	g.Expect(rc.Do(context.Background(), "CLUSTER", "FAILOVER", "TAKEOVER").Err()).To(Succeed())

	g.Expect(decide().Source).NotTo(Equal(limiter.SourceRedis), "the dead master cannot decide")
	g.Eventually(func() limiter.Source { return decide().Source }).WithTimeout(15*time.Second).WithPolling(20*time.Millisecond).
		Should(Equal(limiter.SourceRedis), "the new master decides")
	t.Logf("decisions from Redis again %s after the master was killed", time.Since(killed).Round(10*time.Millisecond))

	// The key's shard has a new address: the dead master's breaker goes once the slot map no
	// longer names it, so failover after failover leaves no breakers behind. (go-redis follows
	// MOVED before its slot map reloads, so the first decisions on the new master may still go
	// through the old address's breaker.)
	g.Eventually(func() []limiter.ShardState {
		decide() // traffic goes on
		return l.Stats().Shards
	}).WithTimeout(10*time.Second).WithPolling(50*time.Millisecond).
		Should(Equal([]limiter.ShardState{{Name: replica.Addr()}}), "one breaker, the new master's, closed")
}
