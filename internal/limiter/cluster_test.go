package limiter_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"github.com/redis/go-redis/v9"

	"github.com/redline-dev/redline/internal/keyscheme"
	"github.com/redline-dev/redline/internal/limiter"
	"github.com/redline-dev/redline/internal/limiter/scripts"
	"github.com/redline-dev/redline/internal/testutil/redistest"
)

// The same exactness on a 3-master Redis Cluster, with keys spread over the masters so that
// every batch splits into one pipeline per node.
func TestClusterExactUnderConcurrency(t *testing.T) {
	g := NewWithT(t)
	cl, err := redistest.StartCluster(3)
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { _ = cl.Close() })

	admin := newClient(t, cl.URL())
	_, isCluster := admin.(*redis.ClusterClient)
	g.Expect(isCluster).To(BeTrue(), "a comma-separated seed list makes a cluster client")
	_, err = scripts.Load(context.Background(), admin)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(scripts.Missing(context.Background(), admin)).To(BeEmpty())

	keys := make([]string, 6)
	for i := range keys {
		keys[i] = keyscheme.Key("shop", "checkout", "per-key", fmt.Sprint("client-", i))
	}
	nodes := map[string]bool{}
	for _, k := range keys {
		addr, err := admin.(*redis.ClusterClient).MasterForKey(context.Background(), k+":swc")
		g.Expect(err).NotTo(HaveOccurred())
		nodes[addr.Options().Addr] = true
	}
	g.Expect(len(nodes)).To(BeNumerically(">=", 2), "the keys land on more than one master")

	for _, n := range []int{3, 10} {
		t.Run(fmt.Sprintf("%d instances", n), func(t *testing.T) {
			ls := instances(t, cl.URL(), n, limiter.TestOptions{})
			allAlgorithms(t, func(t *testing.T, alg limiter.Algorithm) {
				const limit = 60
				ks := make([]string, len(keys))
				for i, k := range keys {
					ks[i] = k + fmt.Sprint(n, alg) // fresh state per subtest (FixedWindow and SlidingWindowCounter share one), same slot spread
				}
				got := hammer(t, ls, ks, exactLimit(alg, limit), 64, 6)
				NewWithT(t).Expect(got).To(HaveEach(int64(limit)))
			})
		})
	}
	g.Expect(keysWithoutTTL(cl.URL())).To(BeEmpty())
}

// On a cluster a hot key loads one master with every decision of every replica; with leases
// that master sees a script call per lease instead. Measured on the master itself (INFO
// commandstats), with leases off and on, for the same load.
func TestClusterHotKeyShardCallsFallWithLeases(t *testing.T) {
	g := NewWithT(t)
	cl, err := redistest.StartCluster(3)
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { _ = cl.Close() })
	admin := newClient(t, cl.URL()).(*redis.ClusterClient)
	_, err = scripts.Load(context.Background(), admin)
	g.Expect(err).NotTo(HaveOccurred())

	calls := func(node *redis.Client) int64 {
		info, err := node.Info(context.Background(), "commandstats").Result()
		g.Expect(err).NotTo(HaveOccurred())
		var n int64
		for line := range strings.SplitSeq(info, "\n") {
			if rest, ok := strings.CutPrefix(line, "cmdstat_evalsha:calls="); ok {
				n, _ = strconv.ParseInt(rest[:strings.IndexByte(rest, ',')], 10, 64)
			}
		}
		return n
	}
	const decisions = 3 * 16 * 100
	for _, c := range []struct {
		name    string
		horizon time.Duration
		most    float64
	}{{"leases off", -1, 1.01}, {"leases on", 2 * time.Second, 0.2}} {
		t.Run(c.name, func(t *testing.T) {
			g := NewWithT(t)
			key := keyscheme.Key("shop", "checkout", "hot", c.name)
			node, err := admin.MasterForKey(context.Background(), key+":swc")
			g.Expect(err).NotTo(HaveOccurred())
			ls := instances(t, cl.URL(), 3, limiter.TestOptions{LeaseHorizon: c.horizon})
			lim := exactLimit(limiter.FixedWindow, 1_000_000)
			lim.Replicas = 3
			before := calls(node)
			got, _ := flood(t, ls, []string{key}, lim, 16, 100)
			g.Expect(got[0]).To(Equal(int64(decisions)))
			per := float64(calls(node)-before) / decisions
			t.Logf("%s: the hot key's master ran %.3f scripts per decision", c.name, per)
			g.Expect(per).To(BeNumerically("<", c.most))
		})
	}
}
