package cluster

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart/loader"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// TestRedlineUpgradeLosesNoRequest rolls Redline itself (helm upgrade --wait with a new pod
// template: both manager replicas replaced, one at a time) while a workload serves through its
// sidecars and scales out: no request fails at the client, the pod created during the upgrade
// is injected (the webhook's failurePolicy is Ignore, so a pod that met no webhook would start
// without its sidecar, silently unlimited), and the policy stays Enforced.
func TestRedlineUpgradeLosesNoRequest(t *testing.T) {
	g := NewWithT(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	c := suite.client
	ns := "upgrade"
	policy := deploySample(t, g, ctx, ns)
	pods := awaitReadyPods(g, ctx, ns, 3)
	var svc corev1.Service
	g.Expect(c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "checkout"}, &svc)).To(Succeed())
	awaitServedByAll(g, ctx, svc.Spec.ClusterIP, pods)
	url := fmt.Sprintf("http://%s:80/", svc.Spec.ClusterIP)

	ld := startLoad(ctx, url, 1)

	cfg, err := helmConfig()
	g.Expect(err).NotTo(HaveOccurred())
	ch, err := loader.Load(filepath.Join(suite.root, "charts", "redline"))
	g.Expect(err).NotTo(HaveOccurred())
	vals := installValues()
	vals["podAnnotations"] = map[string]any{"redline.dev/test-upgrade": time.Now().UTC().Format(time.RFC3339Nano)}
	up := action.NewUpgrade(cfg)
	up.Namespace, up.Wait, up.Timeout = releaseNS, true, 5*time.Minute
	upgraded := make(chan error, 1)
	t0 := time.Now()
	go func() {
		_, err := up.RunWithContext(ctx, releaseName, ch, vals)
		upgraded <- err
	}()

	// A pod created while the managers roll.
	g.Eventually(func(g Gomega) {
		var mgr appsv1.Deployment
		g.Expect(c.Get(ctx, client.ObjectKey{Namespace: releaseNS, Name: "redline-manager"}, &mgr)).To(Succeed())
		g.Expect(mgr.Spec.Template.Annotations).To(HaveKey("redline.dev/test-upgrade"))
	}).WithContext(ctx).WithTimeout(time.Minute).WithPolling(100 * time.Millisecond).Should(Succeed())
	var dep appsv1.Deployment
	g.Expect(c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "checkout"}, &dep)).To(Succeed())
	patch := client.MergeFrom(dep.DeepCopy())
	four := int32(4)
	dep.Spec.Replicas = &four
	g.Expect(c.Patch(ctx, &dep, patch)).To(Succeed())

	g.Expect(<-upgraded).To(Succeed(), "helm upgrade --wait")
	took := since(t0)
	all := awaitReadyPods(g, ctx, ns, 4)
	for _, p := range all {
		g.Expect(hasSidecar(p)).To(BeTrue(), "pod %s, created during the upgrade or before, should carry the sidecar", p.Name)
	}
	time.Sleep(2 * time.Second)
	ok, failed := ld.stop()
	logf("helm upgrade --wait rolled the managers in %s; %d requests answered 200, %d failed %v", took, ok, len(failed), first(failed, 5))
	g.Expect(ok).To(BeNumerically(">", 0))
	g.Expect(failed).To(BeEmpty(), "requests failed at the client during Redline's upgrade")
	g.Eventually(func(g Gomega) {
		cond := enforcedIn(g, ctx, ns, policy.GetName())
		g.Expect(cond).NotTo(BeNil())
		g.Expect(cond.Status).To(Equal(metav1.ConditionTrue), "Enforced: %s", cond.Message)
		g.Expect(cond.Message).To(HavePrefix("4 of 4 live sidecars"))
	}).WithContext(ctx).WithTimeout(3 * time.Minute).WithPolling(time.Second).Should(Succeed())
}
