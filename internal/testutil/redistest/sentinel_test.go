package redistest_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"github.com/redis/go-redis/v9"

	"github.com/redline-dev/redline/internal/redisconn"
	"github.com/redline-dev/redline/internal/testutil/redistest"
)

// TestSentinelFailoverLosesWritesAfterCut proves the harness reproduces issue 20's failover
// with the replica behind: a client on the redis+sentinel:// URL follows Sentinel to the
// promoted replica by itself, and what was written after the replica was cut off is gone
// there, while what it had received survives.
func TestSentinelFailoverLosesWritesAfterCut(t *testing.T) {
	g := NewWithT(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	s, err := redistest.StartSentinel()
	g.Expect(err).NotTo(HaveOccurred())
	defer func() { g.Expect(s.Close()).To(Succeed()) }()

	addr, err := s.MasterAddr(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(addr).To(Equal(s.Master().Addr()), "the sentinels name the server started as master")

	// Timeouts for a shared test machine, not the hot path's 50ms: a stalled reply must not
	// fail a write this test needs to succeed.
	c, err := redisconn.NewClient(s.URL(), redisconn.Options{
		DialTimeout: time.Second, ReadTimeout: time.Second, WriteTimeout: time.Second,
	})
	g.Expect(err).NotTo(HaveOccurred())
	defer c.Close()
	replica := redis.NewClient(&redis.Options{Addr: s.Replica().Addr(), MaxRetries: -1})
	defer replica.Close()

	g.Expect(c.Set(ctx, "before-cut", "kept", 0).Err()).To(Succeed())
	g.Expect(s.WaitReplicaInSync(ctx)).To(Succeed())
	g.Expect(replica.Get(ctx, "before-cut").Val()).To(Equal("kept"), "replicated before the cut")

	g.Expect(s.CutReplica(ctx)).To(Succeed())
	const lost = 10
	for i := range lost {
		g.Expect(c.Set(ctx, fmt.Sprintf("after-cut-%d", i), "lost", 0).Err()).To(Succeed())
	}
	// The writes reached the master; the replica, cut off, does not receive them.
	master := redis.NewClient(&redis.Options{Addr: s.Master().Addr(), MaxRetries: -1})
	g.Expect(master.Exists(ctx, "after-cut-0", fmt.Sprintf("after-cut-%d", lost-1)).Val()).To(BeEquivalentTo(2))
	_ = master.Close()

	g.Expect(s.Master().Stop()).To(Succeed()) // SIGKILL: a crash

	// The client follows the promotion without being told: writes through the same client
	// succeed again, and they land on the server that was the replica.
	g.Eventually(func(g Gomega) {
		g.Expect(c.Set(ctx, "after-failover", "new-master", 0).Err()).To(Succeed())
	}).WithContext(ctx).WithTimeout(30 * time.Second).WithPolling(100 * time.Millisecond).Should(Succeed())
	g.Expect(s.WaitMaster(ctx, s.Replica())).To(Succeed())
	g.Expect(replica.Get(ctx, "after-failover").Val()).To(Equal("new-master"))

	// The promoted replica had everything before the cut and nothing after it.
	g.Expect(c.Get(ctx, "before-cut").Val()).To(Equal("kept"))
	for i := range lost {
		g.Expect(c.Get(ctx, fmt.Sprintf("after-cut-%d", i)).Err()).To(MatchError(redis.Nil), "after-cut-%d", i)
	}
}

// TestSentinelRestoreReplicaResyncs shows that the cut is what keeps the replica behind:
// enabling the replication user again lets the replica catch up with what it missed.
func TestSentinelRestoreReplicaResyncs(t *testing.T) {
	g := NewWithT(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	s, err := redistest.StartSentinel()
	g.Expect(err).NotTo(HaveOccurred())
	defer func() { g.Expect(s.Close()).To(Succeed()) }()
	master := redis.NewClient(&redis.Options{Addr: s.Master().Addr(), MaxRetries: -1})
	defer master.Close()
	replica := redis.NewClient(&redis.Options{Addr: s.Replica().Addr(), MaxRetries: -1})
	defer replica.Close()

	g.Expect(s.CutReplica(ctx)).To(Succeed())
	g.Expect(master.Set(ctx, "while-cut", "v", 0).Err()).To(Succeed())
	// Cut off, the replica cannot authenticate: its link stays down and the write stays missing.
	g.Consistently(func(g Gomega) {
		info, err := replica.Info(ctx, "replication").Result()
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(info).To(ContainSubstring("master_link_status:down"))
		g.Expect(replica.Exists(ctx, "while-cut").Val()).To(BeZero())
	}).WithContext(ctx).WithTimeout(2 * time.Second).WithPolling(200 * time.Millisecond).Should(Succeed())

	g.Expect(s.RestoreReplica(ctx)).To(Succeed())
	g.Expect(s.WaitReplicaInSync(ctx)).To(Succeed())
	g.Expect(replica.Get(ctx, "while-cut").Val()).To(Equal("v"))
}
