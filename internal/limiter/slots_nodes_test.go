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

// A Cluster takeover that no call sees fail: the key's shard promotes a replica that never
// received a running request's slot, and the old master, alive, answers MOVED, which the Redis
// client follows by itself. A replica whose client counts node changes (the sidecar's) undoes
// the slot it was granted on the new master and decides by the failure mode until the slots
// settle; the control, a limiter that does not know of node changes, is granted the running
// request's place: two requests of a key limited to one.
func TestSlotsThroughAClusterTakeoverNoCallSeesFail(t *testing.T) {
	g := NewWithT(t)
	cl, err := redistest.StartClusterWithReplicas(3)
	g.Expect(err).NotTo(HaveOccurred(), "the test needs real redis-server processes")
	t.Cleanup(func() { _ = cl.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	limiterOn := func(stats *redisconn.ConnStats) *limiter.Limiter {
		c, err := redisconn.NewClient(cl.URL(), redisconn.Options{Stats: stats, ReadTimeout: 2 * time.Second})
		g.Expect(err).NotTo(HaveOccurred())
		t.Cleanup(func() { _ = c.Close() })
		o := limiter.TestOptions{ReplicaID: limiter.NewReplicaID(), SlotExpiry: 10 * time.Minute} // no renewal round during the test
		if stats != nil {
			o.NodeChanges = stats.NodeChanges
		}
		return newLimiter(t, c, o)
	}
	holder := limiterOn(&redisconn.ConnStats{})
	watching := &redisconn.ConnStats{}
	taker := limiterOn(watching)
	control := limiterOn(nil)

	key := uniqueKey(t)
	admin := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs(), MaxRetries: -1})
	defer admin.Close()
	m, err := admin.MasterForKey(ctx, key)
	g.Expect(err).NotTo(HaveOccurred())
	replica, err := cl.ReplicaOf(m.Options().Addr)
	g.Expect(err).NotTo(HaveOccurred())
	mc, rc := cl.Client(m.Options().Addr), cl.Client(replica.Addr())
	defer mc.Close()
	defer rc.Close()
	// Both clients learn the slot map, and the key has room, before the cut.
	for _, l := range []*limiter.Limiter{taker, control} {
		res, s, err := l.Acquire(ctx, key, inFlight(1))
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(res.Allowed).To(BeTrue())
		l.Release(ctx, s)
	}
	g.Expect(redistest.CutClusterReplica(ctx, mc, rc)).To(Succeed())
	_, held, err := holder.Acquire(ctx, key, inFlight(1))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(held).NotTo(BeNil(), "the running request's slot, on the old master only")

	g.Expect(rc.Do(ctx, "CLUSTER", "FAILOVER", "TAKEOVER").Err()).To(Succeed())
	role := func(c *redis.Client) any {
		r, err := c.Do(ctx, "ROLE").Slice()
		if err != nil || len(r) == 0 {
			return err
		}
		return r[0]
	}
	g.Eventually(func() any { return role(rc) }, time.Minute, 10*time.Millisecond).Should(Equal("master"))
	g.Eventually(func() any { return role(mc) }, time.Minute, 10*time.Millisecond).Should(Equal("slave"),
		"the old master turned replica: it answers MOVED")

	res, s, err := control.Acquire(ctx, key, inFlight(1))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(s).NotTo(BeNil(), "the control: granted the running request's place on the new master")
	g.Expect(res.Err).NotTo(HaveOccurred())
	control.Release(ctx, s)

	res, s, err = taker.Acquire(ctx, key, inFlight(1))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(s).To(BeNil(), "a node change during the call undoes its slot")
	g.Expect(res.Allowed).To(BeFalse(), "Closed refuses")
	g.Expect(res.Err).To(HaveOccurred())
	g.Expect(watching.NodeChanges()).To(BeNumerically(">", 0))
	g.Expect(rc.ZCard(ctx, key).Val()).To(BeZero(), "the undone slot is off the new master")
	res, s, err = taker.Acquire(ctx, key, inFlight(1))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(s).To(BeNil())
	g.Expect(res.Err).To(MatchError(limiter.ErrSlotsSettling), "then it waits for the slots to settle")

	holder.Reassert() // as the holder's sidecar does when it hears of the loss (or at its next renewal)
	res, s, err = holder.Acquire(ctx, uniqueKey(t), inFlight(1))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(s).To(BeNil(), "the holder settles too")
	g.Expect(res.Err).To(MatchError(limiter.ErrSlotsSettling))
	g.Expect(holder.SlotStats().Reasserted).To(Equal(uint64(1)))
	g.Expect(rc.ZCard(ctx, key).Val()).To(Equal(int64(1)), "the running request counts on the new master")
	holder.Release(ctx, held)
}
