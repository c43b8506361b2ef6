package cluster

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// The keys of the namespace's ConfigMap redline-sidecar-redis that the manager writes for the
// sample Deployment (internal/webhook/podinject/workloadkeys.go) and the metric of the pool a
// sidecar runs with.
const (
	sidecarRedisConfigMap = "redline-sidecar-redis"
	poolSizeKey           = "pool-size.deployment.checkout"
	replicasKey           = "replicas.deployment.checkout"
	poolMetric            = "redline_sidecar_redis_pool_max_connections"
)

// TestConnectionBudgetFollowsMaxReplicas changes an HPA's maxReplicas on the real cluster and
// checks that the sidecars' Redis pool follows it: the manager rewrites the workload's pool in
// the namespace's ConfigMap (its share of Redis's maxclients divided by maxReplicas), and a pod
// started afterwards (the HPA raising minReplicas) runs with the new pool while the pods
// started before keep theirs.
func TestConnectionBudgetFollowsMaxReplicas(t *testing.T) {
	g := NewWithT(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	c := suite.client
	ns := "budget"
	deploySample(t, g, ctx, ns)
	old := awaitReadyPods(g, ctx, ns, 3)
	// A target no load here reaches: the HPA moves only with minReplicas and maxReplicas.
	createHPA(g, ctx, ns, 3, 6, "50")

	pool6 := awaitBudgetKeys(g, ctx, ns, "6")
	oldPools := map[string]int{}
	for _, p := range old {
		oldPools[p.Name] = sidecarPool(g, ctx, p)
	}

	var hpa autoscalingv2.HorizontalPodAutoscaler
	g.Expect(c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "checkout"}, &hpa)).To(Succeed())
	patch := client.MergeFrom(hpa.DeepCopy())
	hpa.Spec.MaxReplicas = 200
	g.Expect(c.Patch(ctx, &hpa, patch)).To(Succeed())
	pool200 := awaitBudgetKeys(g, ctx, ns, "200")
	logf("the workload's pool in %s: %d at maxReplicas 6, %d at maxReplicas 200; the pods started before the HPA run with %v",
		sidecarRedisConfigMap, pool6, pool200, oldPools)
	g.Expect(pool200).To(BeNumerically("<", pool6), "over 30 times the replicas share the same connections")

	// A new pod: the HPA scales to its new minimum.
	g.Expect(c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "checkout"}, &hpa)).To(Succeed())
	patch = client.MergeFrom(hpa.DeepCopy())
	four := int32(4)
	hpa.Spec.MinReplicas = &four
	g.Expect(c.Patch(ctx, &hpa, patch)).To(Succeed())
	all := awaitReadyPods(g, ctx, ns, 4)
	var started int
	for _, p := range all {
		got := sidecarPool(g, ctx, p)
		if was, ok := oldPools[p.Name]; ok {
			g.Expect(got).To(Equal(was), "pod %s, started before the change, keeps its pool", p.Name)
			continue
		}
		started++
		logf("pod %s, started by the HPA after maxReplicas became 200, runs with a pool of %d", p.Name, got)
		g.Expect(got).To(Equal(pool200), "the pool of pod %s, started after maxReplicas became 200", p.Name)
	}
	g.Expect(started).To(Equal(1))
}

// awaitBudgetKeys waits until the namespace's ConfigMap says the sample Deployment runs at most
// maxReplicas pods and returns the pool it gives each.
func awaitBudgetKeys(g *WithT, ctx context.Context, ns, maxReplicas string) int {
	var pool int
	g.Eventually(func(g Gomega) {
		var cm corev1.ConfigMap
		g.Expect(suite.client.Get(ctx, client.ObjectKey{Namespace: ns, Name: sidecarRedisConfigMap}, &cm)).To(Succeed())
		g.Expect(cm.Data).To(HaveKeyWithValue(replicasKey, maxReplicas))
		g.Expect(cm.Data).To(HaveKey(poolSizeKey))
		var err error
		pool, err = strconv.Atoi(cm.Data[poolSizeKey])
		g.Expect(err).NotTo(HaveOccurred())
	}).WithContext(ctx).WithTimeout(3 * time.Minute).WithPolling(500 * time.Millisecond).Should(Succeed())
	return pool
}

// sidecarPool is the Redis pool pod's sidecar runs with (its metric poolMetric).
func sidecarPool(g *WithT, ctx context.Context, p corev1.Pod) int {
	hc := &http.Client{Timeout: 5 * time.Second}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+p.Status.PodIP+":9091/metrics", nil)
	g.Expect(err).NotTo(HaveOccurred())
	resp, err := hc.Do(req)
	g.Expect(err).NotTo(HaveOccurred(), "the metrics of pod %s's sidecar", p.Name)
	defer func() { _ = resp.Body.Close() }()
	sc := bufio.NewScanner(io.LimitReader(resp.Body, 4<<20))
	sc.Buffer(make([]byte, 64<<10), 64<<10)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), poolMetric+" "); ok {
			n, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			g.Expect(err).NotTo(HaveOccurred())
			return int(n)
		}
	}
	g.Expect(sc.Err()).NotTo(HaveOccurred())
	g.Expect("").NotTo(BeEmpty(), "pod %s's sidecar exports no %s", p.Name, poolMetric)
	return 0
}
