package fleet_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	. "github.com/onsi/gomega"

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
	g.Expect(fleet.GroupKey("a{b", "c}")).To(Equal("rl:{hb/a%7Bb/c%7D}"))

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
