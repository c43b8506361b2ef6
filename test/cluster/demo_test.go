package cluster

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

const shopNS = "shop"

// TestSharedLimitAcrossReplicas is the demo's story on real pods: the sample policy (100 POSTs
// a minute per API key, SlidingWindowCounter) and the sample workload (an annotated Deployment
// of 3 replicas behind a Service that targets the sidecar), 300 requests of one key through the
// Service's ClusterIP, which kube-proxy spreads over the three pods: exactly 100 are admitted,
// every other one is a 429, and the policy is Enforced by 3 of 3 live sidecars.
func TestSharedLimitAcrossReplicas(t *testing.T) {
	g := NewWithT(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	c := suite.client
	t0 := time.Now()

	policy := deploySample(t, g, ctx, shopNS)

	pods := awaitReadyPods(g, ctx, shopNS, 3)
	logf("3 checkout pods Ready %s after they were created", since(t0))
	for _, p := range pods {
		g.Expect(hasSidecar(p)).To(BeTrue(), "pod %s should carry the injected sidecar", p.Name)
	}
	g.Eventually(func(g Gomega) {
		cond := enforcedIn(g, ctx, shopNS, policy.GetName())
		g.Expect(cond).NotTo(BeNil())
		g.Expect(cond.Status).To(Equal(metav1.ConditionTrue), "Enforced: %s", cond.Message)
		g.Expect(cond.Message).To(HavePrefix("3 of 3 live sidecars"))
	}).WithContext(ctx).WithTimeout(3 * time.Minute).WithPolling(time.Second).Should(Succeed())

	var svc corev1.Service
	g.Expect(c.Get(ctx, client.ObjectKey{Namespace: shopNS, Name: "checkout"}, &svc)).To(Succeed())
	url := fmt.Sprintf("http://%s:80/api/orders", svc.Spec.ClusterIP)
	awaitServedByAll(g, ctx, svc.Spec.ClusterIP, pods)

	w := awaitWindowRoom(g, ctx, time.Minute, 40*time.Second)
	statuses, _, errs := sendCounting(ctx, url, newAPIKey(g), 300, 10)
	g.Expect(windowIndex(g, ctx, time.Minute)).To(Equal(w),
		"the 300 requests crossed a window boundary on Redis's clock: the run cannot be judged, run it again")
	degraded := sidecarCounter(g, ctx, pods, "redline_sidecar_degraded_decisions_total")
	logf("300 requests through ClusterIP %s: %v, transport errors %d, decisions of the failure mode (Redis too slow) %v",
		svc.Spec.ClusterIP, statuses, len(errs), degraded)
	g.Expect(errs).To(BeEmpty())
	g.Expect(degraded).To(BeZero(), "every decision should come from the shared counter in Redis")
	g.Expect(statuses).To(Equal(map[int]int{http.StatusOK: 100, http.StatusTooManyRequests: 200}),
		"one limit of 100 shared by 3 replicas")
}

// deploySample creates namespace ns with the sample policy (changed by edits) and the sample
// workload (its application swapped for ./echo) and returns the policy.
func deploySample(t *testing.T, g *WithT, ctx context.Context, ns string, edits ...func(*unstructured.Unstructured)) *unstructured.Unstructured {
	t.Helper()
	c := suite.client
	g.Expect(c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})).To(Succeed())
	policy := sampleObjects(t, "config/samples/checkout_per_api_key.yaml")[0]
	policy.SetNamespace(ns)
	for _, edit := range edits {
		edit(policy)
	}
	g.Expect(c.Create(ctx, policy)).To(Succeed())
	for _, o := range sampleObjects(t, "config/samples/workload/checkout.yaml") {
		o.SetNamespace(ns)
		if o.GetKind() == "Deployment" {
			useEchoApp(t, o)
		}
		g.Expect(c.Create(ctx, o)).To(Succeed(), "creating %s %s", o.GetKind(), o.GetName())
	}
	return policy
}

// sampleObjects reads the objects of a YAML file of the repository.
func sampleObjects(t *testing.T, rel string) []*unstructured.Unstructured {
	t.Helper()
	f, err := os.Open(filepath.Join(suite.root, rel))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	dec := yaml.NewYAMLOrJSONDecoder(f, 4096)
	var out []*unstructured.Unstructured
	for {
		o := &unstructured.Unstructured{}
		if err := dec.Decode(&o.Object); err == io.EOF {
			return out
		} else if err != nil {
			t.Fatalf("decoding %s: %v", rel, err)
		}
		if len(o.Object) > 0 {
			out = append(out, o)
		}
	}
}

// useEchoApp swaps the sample's application (an image from a registry) for ./echo, imported
// into containerd, and tells it its pod's name.
func useEchoApp(t *testing.T, o *unstructured.Unstructured) {
	t.Helper()
	containers, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
	app := containers[0].(map[string]any)
	app["image"] = echoImage
	app["args"] = []any{"-listen=:8080"}
	app["env"] = []any{map[string]any{"name": "POD_NAME", "valueFrom": map[string]any{"fieldRef": map[string]any{"fieldPath": "metadata.name"}}}}
	if err := unstructured.SetNestedSlice(o.Object, containers, "spec", "template", "spec", "containers"); err != nil {
		t.Fatal(err)
	}
}

// awaitReadyPods waits until the sample Deployment checkout of ns has n available replicas of
// its current template and returns its pods that are not terminating.
func awaitReadyPods(g *WithT, ctx context.Context, ns string, n int) []corev1.Pod {
	var live []corev1.Pod
	g.Eventually(func(g Gomega) {
		var dep appsv1.Deployment
		g.Expect(suite.client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "checkout"}, &dep)).To(Succeed())
		// Until the controller has seen the last change, the status counts the previous template.
		g.Expect(dep.Status.ObservedGeneration).To(Equal(dep.Generation))
		g.Expect(dep.Status.AvailableReplicas).To(BeEquivalentTo(n))
		g.Expect(dep.Status.UpdatedReplicas).To(BeEquivalentTo(n))
		var pods corev1.PodList
		g.Expect(suite.client.List(ctx, &pods, client.InNamespace(ns), client.MatchingLabels{"app": "checkout"})).To(Succeed())
		live = nil
		for _, p := range pods.Items {
			if p.DeletionTimestamp == nil { // a terminating old pod is no replica any more
				live = append(live, p)
			}
		}
		g.Expect(live).To(HaveLen(n))
	}).WithContext(ctx).WithTimeout(5 * time.Minute).WithPolling(500 * time.Millisecond).Should(Succeed())
	return live
}

func hasSidecar(p corev1.Pod) bool {
	for _, cs := range append(append([]corev1.Container{}, p.Spec.InitContainers...), p.Spec.Containers...) {
		if cs.Image == "ghcr.io/redline-dev/redline-sidecar:0.1.0" {
			return true
		}
	}
	return false
}

// enforcedIn is the Enforced condition of policy name in ns, nil while it has none.
func enforcedIn(g Gomega, ctx context.Context, ns, name string) *metav1.Condition {
	const typ = "Enforced"
	p := &unstructured.Unstructured{}
	p.SetAPIVersion("redline.dev/v1alpha1")
	p.SetKind("RateLimitPolicy")
	g.Expect(suite.client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, p)).To(Succeed())
	conds, _, _ := unstructured.NestedSlice(p.Object, "status", "conditions")
	for _, c := range conds {
		m := c.(map[string]any)
		if m["type"] == typ {
			return &metav1.Condition{Type: typ, Status: metav1.ConditionStatus(fmt.Sprint(m["status"])),
				Reason: fmt.Sprint(m["reason"]), Message: fmt.Sprint(m["message"])}
		}
	}
	return nil
}

func newAPIKey(g *WithT) string {
	b := make([]byte, 8)
	_, err := rand.Read(b)
	g.Expect(err).NotTo(HaveOccurred())
	return "key-" + hex.EncodeToString(b)
}

// windowIndex is the index of Redis's current window of length w.
func windowIndex(g *WithT, ctx context.Context, w time.Duration) int64 {
	now, err := suite.redis.client.Time(ctx).Result()
	g.Expect(err).NotTo(HaveOccurred())
	return now.UnixMilli() / w.Milliseconds()
}

// awaitWindowRoom returns the current window's index once at least need of it is left on
// Redis's clock, waiting for the next window when less is.
func awaitWindowRoom(g *WithT, ctx context.Context, w, need time.Duration) int64 {
	now, err := suite.redis.client.Time(ctx).Result()
	g.Expect(err).NotTo(HaveOccurred())
	if left := time.Duration(w.Milliseconds()-now.UnixMilli()%w.Milliseconds()) * time.Millisecond; left < need {
		logf("%s left of this window on Redis's clock: waiting for the next one", left.Round(time.Millisecond))
		select {
		case <-ctx.Done():
			g.Expect(ctx.Err()).NotTo(HaveOccurred())
		case <-time.After(left + 200*time.Millisecond):
		}
	}
	return windowIndex(g, ctx, w)
}
