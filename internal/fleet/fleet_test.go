package fleet_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"github.com/redis/go-redis/v9"

	"github.com/redline-dev/redline/internal/fleet"
	"github.com/redline-dev/redline/internal/redisconn"
	"github.com/redline-dev/redline/internal/testutil/redistest"
)

// Replicas announce themselves per policy with the configuration they apply; each group's count
// is its own, the keys expire, and a replica that stops announcing drops out.
func TestAnnounceGroups(t *testing.T) {
	g := NewWithT(t)
	srv, err := redistest.Start()
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { _ = srv.Close() })
	c, err := redisconn.NewClient(srv.URL(), redisconn.Options{ReadTimeout: 5 * time.Second})
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { _ = c.Close() })
	ctx := context.Background()
	ns := fmt.Sprint("announce-", time.Now().UnixNano())
	const ttl = 2 * time.Second

	n, err := fleet.Announce(ctx, c, ns, "pod-a", "hash1", ttl, []string{"p1", "p2"})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(n).To(Equal([]int64{1, 1}))
	n, err = fleet.Announce(ctx, c, ns, "pod-b", "hash2", ttl, []string{"p1"})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(n).To(Equal([]int64{2}))

	members, err := fleet.Members(ctx, c, ns, "p1", ttl)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(members).To(Equal(map[string]string{"pod-a": "hash1", "pod-b": "hash2"}))
	members, err = fleet.Members(ctx, c, ns, "p2", ttl)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(members).To(Equal(map[string]string{"pod-a": "hash1"}))

	for _, k := range []string{fleet.GroupKey(ns, "p1"), fleet.GroupConfigKey(ns, "p1")} {
		g.Expect(c.PTTL(ctx, k).Val()).To(BeNumerically(">", 0), "%s has a TTL", k)
	}
	g.Expect(fleet.GroupKey("a{b", "c}")).To(Equal("rl:hb:{a%7Bb/c%7D}"))

	// After the TTL only the replica that keeps announcing is counted.
	g.Eventually(func() []int64 {
		n, _ := fleet.Announce(ctx, c, ns, "pod-b", "hash2", ttl, []string{"p1"})
		return n
	}).WithTimeout(10 * time.Second).WithPolling(200 * time.Millisecond).Should(Equal([]int64{1}))
	members, err = fleet.Members(ctx, c, ns, "p1", ttl)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(members).To(Equal(map[string]string{"pod-b": "hash2"}))

	// SCRIPT FLUSH: the next announcement loads the script again.
	g.Expect(c.ScriptFlush(ctx).Err()).To(Succeed())
	_, err = fleet.Announce(ctx, c, ns, "pod-b", "hash2", ttl, []string{"p1"})
	g.Expect(err).NotTo(HaveOccurred())
}

// A member scored in the future (written by hand: ZADD with a score a caller chose) is not a
// live replica: the heartbeat does not count it and removes it, and the manager does not see
// it. Before the clamp, 1,000 such members made a lone sidecar count 1,001 replicas for ever.
func TestFutureScoredMembersDoNotCount(t *testing.T) {
	g := NewWithT(t)
	srv, err := redistest.Start()
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { _ = srv.Close() })
	c, err := redisconn.NewClient(srv.URL(), redisconn.Options{ReadTimeout: 5 * time.Second})
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { _ = c.Close() })
	ctx := context.Background()
	const ns, ttl = "victim", 15 * time.Second

	now, err := c.Time(ctx).Result()
	g.Expect(err).NotTo(HaveOccurred())
	future := make([]redis.Z, 1000)
	for i := range future {
		future[i] = redis.Z{Score: float64(now.Add(time.Hour * time.Duration(1+i)).UnixMilli()), Member: fmt.Sprint("ghost-", i)}
	}
	g.Expect(c.ZAdd(ctx, fleet.GroupKey(ns, "p"), future...).Err()).To(Succeed())
	g.Expect(c.HSet(ctx, fleet.GroupConfigKey(ns, "p"), "ghost-0", "h").Err()).To(Succeed())

	// One beat removes at most 256 of them, but none is ever counted.
	for range 4 {
		n, err := fleet.Announce(ctx, c, ns, "pod-a", "hash1", ttl, []string{"p"})
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(n).To(Equal([]int64{1}))
		members, err := fleet.Members(ctx, c, ns, "p", ttl)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(members).To(Equal(map[string]string{"pod-a": "hash1"}))
	}
	g.Expect(c.ZCard(ctx, fleet.GroupKey(ns, "p")).Val()).To(Equal(int64(1)), "the future members are gone")
	g.Expect(c.HExists(ctx, fleet.GroupConfigKey(ns, "p"), "ghost-0").Val()).To(BeFalse())
}

// What the manager reads of a group is bounded: at most MaxMembers members, each name and hash
// cut to MaxMemberBytes, however much a tenant wrote into its own group's keys.
func TestMembersAreBounded(t *testing.T) {
	g := NewWithT(t)
	srv, err := redistest.Start()
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { _ = srv.Close() })
	c, err := redisconn.NewClient(srv.URL(), redisconn.Options{ReadTimeout: 10 * time.Second, WriteTimeout: 10 * time.Second})
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { _ = c.Close() })
	ctx := context.Background()
	const ns, ttl = "stuffed", 15 * time.Second

	now, err := c.Time(ctx).Result()
	g.Expect(err).NotTo(HaveOccurred())
	score := float64(now.UnixMilli() - 1000)
	long := strings.Repeat("x", 1000)
	zs := make([]redis.Z, fleet.MaxMembers+500)
	for i := range zs {
		zs[i] = redis.Z{Score: score, Member: fmt.Sprint(i, long)}
	}
	for i := 0; i < len(zs); i += 1000 {
		g.Expect(c.ZAdd(ctx, fleet.GroupKey(ns, "p"), zs[i:min(i+1000, len(zs))]...).Err()).To(Succeed())
	}
	g.Expect(c.HSet(ctx, fleet.GroupConfigKey(ns, "p"), fmt.Sprint(0, long), long).Err()).To(Succeed())

	members, err := fleet.Members(ctx, c, ns, "p", ttl)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(members).To(HaveLen(fleet.MaxMembers))
	for m, h := range members {
		g.Expect(len(m)).To(BeNumerically("<=", fleet.MaxMemberBytes))
		g.Expect(len(h)).To(BeNumerically("<=", fleet.MaxMemberBytes))
	}
}
