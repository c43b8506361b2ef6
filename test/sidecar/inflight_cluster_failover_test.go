package sidecar_test

import (
	"bufio"
	"fmt"
	"net/http"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"github.com/redis/go-redis/v9"

	"github.com/redline-dev/redline/internal/keyscheme"
	"github.com/redline-dev/redline/internal/testutil/redistest"
)

// TestInFlightThroughASentinelFailover on a Redis Cluster: three masters with a replica each,
// the shard of the key loses the slots of n running streams (its replica was cut off before
// they were taken, then its master killed and the replica promoted by CLUSTER FAILOVER
// TAKEOVER). The sidecars re-assert the slots on the new master and the streams run on, while
// 12 clients on three sidecars keep asking for the same key (failure mode Closed). The upstream
// never serves more than n of the key at once; once the streams end the clients are served.
func TestInFlightThroughAClusterFailover(t *testing.T) {
	g := NewWithT(t)
	cl, err := redistest.StartClusterWithReplicas(3)
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { _ = cl.Close() })
	e := newEnv(t, "web")
	const n = 4
	e.write(t, inFlightDocument(e.namespace, n, 0))
	up := newGauge(t)
	scs := make([]*sidecar, 3)
	for i, name := range []string{"pod-a", "pod-b", "pod-c"} {
		scs[i] = start(t, name, e, cl.URL(), up.Listener.Addr().String(), true, "--in-flight-expiry=20s")
	}
	ctx := ctxTimeout(t, 5*time.Minute)

	key := keyscheme.Key(e.namespace, "p", "slots", "k")
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs(), MaxRetries: -1})
	m, err := cc.MasterForKey(ctx, key)
	g.Expect(err).NotTo(HaveOccurred())
	masterAddr := m.Options().Addr
	g.Expect(cc.Close()).To(Succeed())
	var master *redistest.Server
	for _, s := range cl.Nodes {
		if s.Addr() == masterAddr {
			master = s
		}
	}
	g.Expect(master).NotTo(BeNil(), "the master of the key, %s, is a node of the cluster", masterAddr)
	replica, err := cl.ReplicaOf(masterAddr)
	g.Expect(err).NotTo(HaveOccurred())
	mc, rc := cl.Client(masterAddr), cl.Client(replica.Addr())
	defer mc.Close()
	defer rc.Close()
	g.Expect(redistest.CutClusterReplica(ctx, mc, rc)).To(Succeed()) // from here on, writes reach the master only

	for i := range n {
		resp, err := get(ctx, scs[i%3].proxy+"/hold", "k")
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(resp.StatusCode).To(Equal(http.StatusOK))
		_, err = bufio.NewReader(resp.Body).ReadString('\n')
		g.Expect(err).NotTo(HaveOccurred())
		t.Cleanup(func() { resp.Body.Close() })
	}
	g.Expect(up.cur.Load()).To(Equal(int64(n)))
	g.Expect(mc.ZCard(ctx, key).Val()).To(Equal(int64(n)), "the old master counts the running streams")
	g.Expect(rc.Exists(ctx, key).Val()).To(BeZero(), "the cut replica never saw them")

	cr := newCrowd(ctx, scs)
	g.Eventually(cr.refused.Load, time.Minute, 10*time.Millisecond).Should(BeNumerically(">", 12))

	g.Expect(master.Stop()).To(Succeed())
	switched := time.Now()
	// The cluster may promote the replica itself before TAKEOVER arrives (its link has been
	// down for a short time only): then TAKEOVER answers an error, and the role says it all.
	if err := rc.Do(ctx, "CLUSTER", "FAILOVER", "TAKEOVER").Err(); err != nil {
		t.Logf("CLUSTER FAILOVER TAKEOVER on %s: %v", replica.Addr(), err)
	}
	g.Eventually(func() any {
		role, err := rc.Do(ctx, "ROLE").Slice()
		if err != nil || len(role) == 0 {
			return err
		}
		return role[0]
	}, 2*time.Minute, 20*time.Millisecond).Should(Equal("master"))
	t.Logf("the replica was promoted %v after the master was killed", time.Since(switched).Round(time.Millisecond))
	last := ""
	reasserted := func() float64 {
		sum, seen := 0.0, ""
		for _, s := range scs {
			r := s.metric(t, "redline_sidecar_in_flight_slots_reasserted_total")
			sum += r
			seen += fmt.Sprintf(" [slots %v reasserted %v lost %v renewal errors %v]", s.metric(t, "redline_sidecar_in_flight_slots"), r,
				s.metric(t, "redline_sidecar_in_flight_slots_lost_total"), s.metric(t, "redline_sidecar_in_flight_renewal_errors_total"))
		}
		if seen != last {
			t.Logf("sidecars:%s", seen)
			last = seen
		}
		return sum
	}
	g.Eventually(reasserted, 2*time.Minute, 100*time.Millisecond).Should(BeNumerically("==", n))
	g.Expect(rc.ZCard(ctx, key).Val()).To(Equal(int64(n)), "the promoted replica counts the running streams")
	g.Expect(up.cur.Load()).To(Equal(int64(n)), "the streams ran on through the switch")
	g.Expect(cr.served.Load()).To(BeZero(), "no request took a running stream's place")

	up.release()
	g.Eventually(cr.served.Load, 2*time.Minute, 10*time.Millisecond).Should(BeNumerically(">", 0))
	cr.stop()
	g.Expect(cr.wrong.Load()).To(BeNil())
	g.Expect(up.peak.Load()).To(Equal(int64(n)), "the most requests of the key in progress at once")
	t.Logf("peak %d (limit %d); %d refused, %d served after the streams ended", up.peak.Load(), n, cr.refused.Load(), cr.served.Load())
	g.Eventually(func() int64 { return rc.ZCard(ctx, key).Val() }, time.Minute, 50*time.Millisecond).Should(BeZero(), "every slot went back")
}
