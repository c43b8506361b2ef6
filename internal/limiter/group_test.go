package limiter_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/redline-dev/redline/internal/limiter"
	"github.com/redline-dev/redline/internal/testutil/redistest"
)

// Replicas announce themselves per policy with the configuration they apply; each group's count
// is its own, the keys expire, and a replica that stops announcing drops out.
func TestAnnounceGroups(t *testing.T) {
	g := NewWithT(t)
	c := newClient(t, shared.URL())
	ctx := context.Background()
	ns := fmt.Sprint("announce-", time.Now().UnixNano())
	const ttl = 2 * time.Second

	n, err := limiter.Announce(ctx, c, ns, "pod-a", "hash1", ttl, []string{"p1", "p2"})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(n).To(Equal([]int64{1, 1}))
	n, err = limiter.Announce(ctx, c, ns, "pod-b", "hash2", ttl, []string{"p1"})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(n).To(Equal([]int64{2}))

	members, err := limiter.GroupMembers(ctx, c, ns, "p1", ttl)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(members).To(Equal(map[string]string{"pod-a": "hash1", "pod-b": "hash2"}))
	members, err = limiter.GroupMembers(ctx, c, ns, "p2", ttl)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(members).To(Equal(map[string]string{"pod-a": "hash1"}))

	for _, k := range []string{limiter.GroupKey(ns, "p1"), limiter.GroupConfigKey(ns, "p1")} {
		g.Expect(c.PTTL(ctx, k).Val()).To(BeNumerically(">", 0), "%s has a TTL", k)
	}
	g.Expect(limiter.GroupKey("a{b", "c}")).To(Equal("rl:{hb/a%7Bb/c%7D}"))

	// After the TTL only the replica that keeps announcing is counted.
	g.Eventually(func() []int64 {
		n, _ := limiter.Announce(ctx, c, ns, "pod-b", "hash2", ttl, []string{"p1"})
		return n
	}).WithTimeout(10 * time.Second).WithPolling(200 * time.Millisecond).Should(Equal([]int64{1}))
	members, err = limiter.GroupMembers(ctx, c, ns, "p1", ttl)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(members).To(Equal(map[string]string{"pod-b": "hash2"}))

	// SCRIPT FLUSH: the next announcement loads the script again.
	g.Expect(c.ScriptFlush(ctx).Err()).To(Succeed())
	_, err = limiter.Announce(ctx, c, ns, "pod-b", "hash2", ttl, []string{"p1"})
	g.Expect(err).NotTo(HaveOccurred())
}

// Limit.Replicas divides the local fallback by the limit's own group, not the limiter's count.
func TestFallbackUsesLimitReplicas(t *testing.T) {
	g := NewWithT(t)
	srv, err := redistest.Start()
	g.Expect(err).NotTo(HaveOccurred())
	c, err := limiter.NewClient(srv.URL(), limiter.ClientOptions{DialTimeout: 200 * time.Millisecond})
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { _ = c.Close() })
	g.Expect(srv.Close()).To(Succeed())

	l := newLimiter(t, c, limiter.Options{BreakerFailures: 1})
	lim := exactLimit(limiter.FixedWindow, 100)
	lim.FailureMode = limiter.FailLocal
	lim.Replicas = 5
	key := uniqueKey(t)
	admitted := 0
	for range 200 {
		r, err := l.Allow(context.Background(), key, lim, 1)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(r.Source).To(Equal(limiter.SourceFallback))
		if r.Allowed {
			admitted++
		}
	}
	g.Expect(admitted).To(BeNumerically("~", 100/5, 1))
}
