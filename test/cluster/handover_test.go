package cluster

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// TestNamedPortRolloutAndRollbackLoseNoRequest puts Redline in front of a live Service the way
// the rollout guide says for a named targetPort: the Service targets the application's port by
// name (http) and never changes; the workload, running without a sidecar, is opted in and
// rolls, then opted out and rolls back, while two clients keep sending requests through the
// ClusterIP. Not one request fails either way; in between, the limit holds through the same
// Service (the injected pods' sidecars took the name http); after the rollback, the policy says
// its Ready pods run without the sidecar.
func TestNamedPortRolloutAndRollbackLoseNoRequest(t *testing.T) {
	g := NewWithT(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	c := suite.client
	ns := "handover"
	g.Expect(c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})).To(Succeed())
	policy := sampleObjects(t, "config/samples/checkout_per_api_key.yaml")[0]
	policy.SetNamespace(ns)
	g.Expect(c.Create(ctx, policy)).To(Succeed())
	for _, o := range sampleObjects(t, "config/samples/workload/checkout.yaml") {
		o.SetNamespace(ns)
		switch o.GetKind() {
		case "Deployment":
			useEchoApp(t, o)
			namedAppPort(t, o)
		case "Service":
			ports, _, _ := unstructured.NestedSlice(o.Object, "spec", "ports")
			ports[0].(map[string]any)["targetPort"] = "http"
			g.Expect(unstructured.SetNestedSlice(o.Object, ports, "spec", "ports")).To(Succeed())
		}
		g.Expect(c.Create(ctx, o)).To(Succeed(), "creating %s %s", o.GetKind(), o.GetName())
	}
	before := awaitReadyPods(g, ctx, ns, 3)
	for _, p := range before {
		g.Expect(hasSidecar(p)).To(BeFalse(), "pod %s: the workload starts without Redline", p.Name)
	}
	var svc corev1.Service
	g.Expect(c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "checkout"}, &svc)).To(Succeed())
	g.Expect(svc.Spec.Ports[0].TargetPort).To(Equal(intstr.FromString("http")))
	awaitServedByAll(g, ctx, svc.Spec.ClusterIP, before)

	injected := rollWithLoad(t, g, ctx, ns, svc.Spec.ClusterIP, before, "true")
	for _, p := range injected {
		g.Expect(hasSidecar(p)).To(BeTrue(), "pod %s should carry the injected sidecar", p.Name)
	}
	awaitServedByAll(g, ctx, svc.Spec.ClusterIP, injected)
	g.Eventually(func(g Gomega) {
		cond := enforcedIn(g, ctx, ns, policy.GetName())
		g.Expect(cond).NotTo(BeNil())
		g.Expect(cond.Status).To(Equal(metav1.ConditionTrue), "%s: %s", cond.Reason, cond.Message)
	}).WithContext(ctx).WithTimeout(3 * time.Minute).WithPolling(time.Second).Should(Succeed())

	// The same Service, unchanged, now goes through the sidecars: the limit holds.
	w := awaitWindowRoom(g, ctx, time.Minute, 40*time.Second)
	statuses, _, errs := sendCounting(ctx, fmt.Sprintf("http://%s:80/api/orders", svc.Spec.ClusterIP), newAPIKey(g), 110, 5)
	g.Expect(windowIndex(g, ctx, time.Minute)).To(Equal(w),
		"the requests crossed a window boundary on Redis's clock: the run cannot be judged, run it again")
	logf("through the unchanged Service after the rollout, 110 requests of one key: %v", statuses)
	g.Expect(errs).To(BeEmpty())
	g.Expect(statuses).To(Equal(map[int]int{http.StatusOK: 100, http.StatusTooManyRequests: 10}))

	back := rollWithLoad(t, g, ctx, ns, svc.Spec.ClusterIP, injected, "false")
	for _, p := range back {
		g.Expect(hasSidecar(p)).To(BeFalse(), "pod %s: rolled back without the sidecar", p.Name)
	}
	g.Eventually(func(g Gomega) {
		cond := enforcedIn(g, ctx, ns, policy.GetName())
		g.Expect(cond).NotTo(BeNil())
		g.Expect(cond.Status).To(Equal(metav1.ConditionFalse), "%s: %s", cond.Reason, cond.Message)
		g.Expect(cond.Reason).To(Equal("PodsWithoutSidecar"), cond.Message)
	}).WithContext(ctx).WithTimeout(3 * time.Minute).WithPolling(time.Second).Should(Succeed())
}

// namedAppPort names the application's port http, as the Service will target it, and gives
// the application a readiness probe by that name (the injector makes it a number).
func namedAppPort(t *testing.T, o *unstructured.Unstructured) {
	t.Helper()
	if err := unstructured.SetNestedField(o.Object, "false", "spec", "template", "metadata", "annotations", "redline.dev/inject"); err != nil {
		t.Fatal(err)
	}
	containers, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
	app := containers[0].(map[string]any)
	app["ports"] = []any{map[string]any{"name": "http", "containerPort": int64(8080)}}
	app["readinessProbe"] = map[string]any{"httpGet": map[string]any{"path": "/", "port": "http"}, "periodSeconds": int64(2)}
	if err := unstructured.SetNestedSlice(o.Object, containers, "spec", "template", "spec", "containers"); err != nil {
		t.Fatal(err)
	}
}

// rollWithLoad sets the workload's redline.dev/inject to inject and waits until every old pod
// is gone, while two clients send GET / (outside the policy) through the Service at ip on
// kept-alive connections; it fails the test on any failed request and returns the new pods.
func rollWithLoad(t *testing.T, g *WithT, ctx context.Context, ns, ip string, old []corev1.Pod, inject string) []corev1.Pod {
	t.Helper()
	c := suite.client
	url := fmt.Sprintf("http://%s:80/", ip)
	ld := startLoad(ctx, url, 2)
	t0 := time.Now()
	var dep appsv1.Deployment
	g.Expect(c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "checkout"}, &dep)).To(Succeed())
	patch := client.MergeFrom(dep.DeepCopy())
	dep.Spec.Template.Annotations["redline.dev/inject"] = inject
	g.Expect(c.Patch(ctx, &dep, patch)).To(Succeed())
	pods := awaitReadyPods(g, ctx, ns, 3)
	g.Eventually(func(g Gomega) {
		for _, p := range old {
			var cur corev1.Pod
			g.Expect(c.Get(ctx, client.ObjectKeyFromObject(&p), &cur)).NotTo(Succeed(), "old pod %s still exists", p.Name)
		}
	}).WithContext(ctx).WithTimeout(3 * time.Minute).WithPolling(500 * time.Millisecond).Should(Succeed())
	time.Sleep(2 * time.Second)
	ok, failed := ld.stop()
	logf("redline.dev/inject=%s, the Service's targetPort unchanged: rolled in %s, %d requests answered 200, %d failed %v",
		inject, since(t0), ok, len(failed), first(failed, 5))
	g.Expect(ok).To(BeNumerically(">", 0))
	g.Expect(failed).To(BeEmpty(), "requests failed at the client while the workload rolled")
	return pods
}
