package cluster

import (
	"bytes"
	"context"
	"path/filepath"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart/loader"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// TestCertManagerModeInjectsPods installs cert-manager (its chart and CRDs, its controller,
// cainjector and webhook built here) and switches the installed Redline to the chart's
// webhook.certificates=certManager mode with helm upgrade --wait, as a user who keeps that mode
// does: the chart's Issuer and Certificate are issued, the cainjector puts the CA into the
// pod injector's webhook configuration, and pods are injected through the webhook serving
// cert-manager's certificate. It switches back to the default mode afterwards (the other tests
// run on it) and checks pods are injected again.
func TestCertManagerModeInjectsPods(t *testing.T) {
	g := NewWithT(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	c := suite.client

	t0 := time.Now()
	g.Expect(installCertManager(ctx)).To(Succeed())
	logf("cert-manager %s installed (helm install --wait, CRDs included) after %s", certManagerVersion, since(t0))
	// cert-manager's own webhook validates its resources; it answers once its cainjector has
	// put its CA into that webhook's configuration (what cert-manager's startupapicheck awaits).
	g.Eventually(func(g Gomega) {
		issuer := &unstructured.Unstructured{}
		issuer.SetAPIVersion("cert-manager.io/v1")
		issuer.SetKind("Issuer")
		issuer.SetNamespace(releaseNS)
		issuer.SetName("startup-api-check")
		g.Expect(unstructured.SetNestedMap(issuer.Object, map[string]any{}, "spec", "selfSigned")).To(Succeed())
		g.Expect(c.Create(ctx, issuer, client.DryRunAll)).To(Succeed())
	}).WithContext(ctx).WithTimeout(5 * time.Minute).WithPolling(time.Second).Should(Succeed())
	logf("cert-manager's API answers %s after its install began", since(t0))

	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		g := NewWithT(t)
		t0 := time.Now()
		g.Expect(upgradeRedline(ctx, installValues())).To(Succeed(), "helm upgrade --wait back to selfSigned")
		awaitInjection(t, g, ctx)
		logf("back in selfSigned mode, pods injected, %s after helm upgrade began", since(t0))
	})

	vals := installValues()
	vals["webhook"] = map[string]any{"certificates": "certManager"}
	t1 := time.Now()
	g.Expect(upgradeRedline(ctx, vals)).To(Succeed(), "helm upgrade --wait to certManager mode")
	logf("helm upgrade --wait to certManager mode returned after %s", since(t1))

	var secret corev1.Secret
	g.Eventually(func(g Gomega) {
		cert := &unstructured.Unstructured{}
		cert.SetAPIVersion("cert-manager.io/v1")
		cert.SetKind("Certificate")
		g.Expect(c.Get(ctx, client.ObjectKey{Namespace: releaseNS, Name: "redline-serving-cert"}, cert)).To(Succeed())
		conds, _, _ := unstructured.NestedSlice(cert.Object, "status", "conditions")
		ready := false
		for _, x := range conds {
			m := x.(map[string]any)
			ready = ready || (m["type"] == "Ready" && m["status"] == "True")
		}
		g.Expect(ready).To(BeTrue(), "Certificate redline-serving-cert Ready: %v", conds)
		g.Expect(c.Get(ctx, client.ObjectKey{Namespace: releaseNS, Name: "redline-webhook-server-cert"}, &secret)).To(Succeed())
		g.Expect(secret.Data["ca.crt"]).NotTo(BeEmpty())
		var mwc admissionregistrationv1.MutatingWebhookConfiguration
		g.Expect(c.Get(ctx, client.ObjectKey{Name: "redline-pod-injector"}, &mwc)).To(Succeed())
		g.Expect(mwc.Webhooks).NotTo(BeEmpty())
		for _, h := range mwc.Webhooks {
			g.Expect(bytes.TrimSpace(h.ClientConfig.CABundle)).To(Equal(bytes.TrimSpace(secret.Data["ca.crt"])),
				"webhook %s's caBundle should be the CA cert-manager issued with (the cainjector's)", h.Name)
		}
	}).WithContext(ctx).WithTimeout(5 * time.Minute).WithPolling(time.Second).Should(Succeed())
	logf("Certificate Ready and its CA injected into the webhook configuration %s after the upgrade began", since(t1))
	awaitInjection(t, g, ctx)
	logf("pods injected through the webhook in certManager mode %s after the upgrade began", since(t1))

	ns := "certs"
	deploySample(t, g, ctx, ns)
	pods := awaitReadyPods(g, ctx, ns, 3)
	for _, p := range pods {
		g.Expect(hasSidecar(p)).To(BeTrue(), "pod %s should carry the sidecar injected in certManager mode", p.Name)
	}
}

// upgradeRedline runs helm upgrade --wait of the installed release with vals.
func upgradeRedline(ctx context.Context, vals map[string]any) error {
	cfg, err := helmConfig()
	if err != nil {
		return err
	}
	ch, err := loader.Load(filepath.Join(suite.root, "charts", "redline"))
	if err != nil {
		return err
	}
	up := action.NewUpgrade(cfg)
	up.Namespace, up.Wait, up.Timeout = releaseNS, true, 5*time.Minute
	_, err = up.RunWithContext(ctx, releaseName, ch, vals)
	return err
}

// awaitInjection waits until a pod of the sample workload, created in namespace default as a
// server-side dry run (the API server calls the webhooks, stores nothing), comes back with the
// sidecar: the webhook answers, over TLS the API server trusts. With failurePolicy Ignore a
// webhook the API server cannot call lets the pod through without it.
func awaitInjection(t *testing.T, g *WithT, ctx context.Context) {
	u := sampleObjects(t, "config/samples/workload/checkout.yaml")[0]
	var dep appsv1.Deployment
	g.Expect(runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &dep)).To(Succeed())
	g.Eventually(func(g Gomega) {
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{GenerateName: "injection-check-", Namespace: "default",
				Labels: dep.Spec.Template.Labels, Annotations: dep.Spec.Template.Annotations},
			Spec: *dep.Spec.Template.Spec.DeepCopy(),
		}
		g.Expect(suite.client.Create(ctx, pod, client.DryRunAll)).To(Succeed())
		g.Expect(hasSidecar(*pod)).To(BeTrue(), "the dry-run pod should come back injected")
	}).WithContext(ctx).WithTimeout(5 * time.Minute).WithPolling(time.Second).Should(Succeed())
}
