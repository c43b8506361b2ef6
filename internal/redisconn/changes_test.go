package redisconn

import (
	"context"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"github.com/redis/go-redis/v9"

	"github.com/redline-dev/redline/internal/testutil/redistest"
)

// A Cluster failover that no command sees fail (CLUSTER FAILOVER on the replica of a key's
// master: the old master answers MOVED, which go-redis follows) is counted as a node change;
// a thousand commands on an unchanged cluster are not.
func TestClusterFailoverIsANodeChange(t *testing.T) {
	g := NewWithT(t)
	cl, err := redistest.StartClusterWithReplicas(3)
	g.Expect(err).NotTo(HaveOccurred(), "the test needs real redis-server processes")
	t.Cleanup(func() { _ = cl.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	stats := &ConnStats{}
	c, err := NewClient(cl.URL(), Options{Stats: stats, ReadTimeout: 2 * time.Second})
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { _ = c.Close() })
	cc := c.(*redis.ClusterClient)

	const key = "changes-key"
	for i := range 1000 {
		g.Expect(c.Set(ctx, key, i, 0).Err()).To(Succeed())
	}
	g.Expect(stats.NodeChanges()).To(BeZero(), "no change on a steady cluster")

	// Timeouts are not changes: a caller's deadline, a read timeout on a paused node.
	short, cancelShort := context.WithTimeout(ctx, 50*time.Millisecond)
	g.Expect(c.Do(short, "blpop", "changes-list", "1").Err()).To(HaveOccurred())
	cancelShort()
	m0, err := cc.MasterForKey(ctx, key)
	g.Expect(err).NotTo(HaveOccurred())
	paused := cl.Client(m0.Options().Addr)
	defer func() { _ = paused.Close() }()
	slow, err := NewClient(cl.URL(), Options{Stats: stats, ReadTimeout: 100 * time.Millisecond})
	g.Expect(err).NotTo(HaveOccurred())
	defer func() { _ = slow.Close() }()
	g.Expect(slow.Get(ctx, key).Err()).To(Succeed())
	g.Expect(paused.Do(ctx, "client", "pause", 500).Err()).To(Succeed())
	g.Expect(slow.Get(ctx, key).Err()).To(HaveOccurred(), "a read timeout")
	g.Eventually(func() error { return slow.Get(ctx, key).Err() }, 10*time.Second, 50*time.Millisecond).Should(Succeed())
	g.Expect(stats.NodeChanges()).To(BeZero(), "timeouts are not node changes")

	m, err := cc.MasterForKey(ctx, key)
	g.Expect(err).NotTo(HaveOccurred())
	replica, err := cl.ReplicaOf(m.Options().Addr)
	g.Expect(err).NotTo(HaveOccurred())
	rc, mc := cl.Client(replica.Addr()), cl.Client(m.Options().Addr)
	defer rc.Close()
	defer mc.Close()
	g.Expect(rc.Do(ctx, "CLUSTER", "FAILOVER").Err()).To(Succeed(), "a failover the master agrees to")
	role := func(c *redis.Client) any {
		r, err := c.Do(ctx, "ROLE").Slice()
		if err != nil || len(r) == 0 {
			return err
		}
		return r[0]
	}
	g.Eventually(func() any { return role(rc) }, time.Minute, 20*time.Millisecond).Should(Equal("master"))
	g.Eventually(func() any { return role(mc) }, time.Minute, 20*time.Millisecond).Should(Equal("slave"),
		"the old master turned replica: it answers MOVED")

	g.Expect(c.Get(ctx, key).Val()).To(Equal("999"), "the command succeeds: the client follows the new master")
	g.Expect(stats.NodeChanges()).To(BeNumerically(">", 0), "and counts the change it followed")
}

// A client of a Sentinel group counts the switch to a new master (SENTINEL FAILOVER: the old
// one is demoted alive, the client dials the new one).
func TestSentinelSwitchIsANodeChange(t *testing.T) {
	g := NewWithT(t)
	grp, err := redistest.StartSentinel()
	g.Expect(err).NotTo(HaveOccurred(), "the test needs real redis-server processes")
	t.Cleanup(func() { _ = grp.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	stats := &ConnStats{}
	c, err := NewClient(grp.URL(), Options{Stats: stats, ReadTimeout: 2 * time.Second})
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { _ = c.Close() })

	burst(g, c, 4) // several connections to the master, all at one address
	g.Expect(c.Set(ctx, "k", "v", 0).Err()).To(Succeed())
	g.Expect(stats.NodeChanges()).To(BeZero(), "no change while the master stays")

	sc := grp.SentinelClient(grp.Sentinels[0])
	defer func() { _ = sc.Close() }()
	g.Expect(sc.Failover(ctx, redistest.SentinelMasterName).Err()).To(Succeed())
	g.Expect(grp.WaitMaster(ctx, grp.Replica())).To(Succeed())
	g.Eventually(func() error { return c.Set(ctx, "k", "w", 0).Err() }, time.Minute, 50*time.Millisecond).Should(Succeed(),
		"the client writes to the new master")
	g.Expect(stats.NodeChanges()).To(BeNumerically(">", 0), "and counts the switch")
}
