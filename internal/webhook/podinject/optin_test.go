package podinject_test

import (
	"context"
	"os"
	"path/filepath"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/yaml"

	"github.com/redline-dev/redline/internal/sidecar/contract"
	"github.com/redline-dev/redline/internal/webhook/podinject"
)

// webhookCalls is how many admission requests the manager's webhook server has answered on
// both injection paths (controller-runtime's own request counter).
func webhookCalls() float64 {
	GinkgoHelper()
	families, err := metrics.Registry.Gather()
	Expect(err).NotTo(HaveOccurred())
	total := 0.0
	for _, f := range families {
		if f.GetName() != "controller_runtime_webhook_requests_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			if hook := labelOf(m, "webhook"); hook == podinject.Path || hook == podinject.NamespacePath {
				total += m.GetCounter().GetValue()
			}
		}
	}
	return total
}

func labelOf(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// Only pods that opted in reach the webhook: the API server's matchConditions and
// namespaceSelectors (config/webhook) leave every other pod creation in the cluster free of it.
var _ = Describe("Who reaches the injection webhook", func() {
	ctx := context.Background()

	It("is called for pods that opted in by annotation or label, and for no other", func() {
		const ns = "optin-pods"
		createNamespace(ns)
		before := webhookCalls()

		plain := plainPod(ns, "plain")
		plain.Annotations = map[string]string{contract.AnnotationUpstreamPort: "8080"}
		stored, _ := createAndGet(plain)
		Expect(sidecarCount(stored)).To(BeZero())
		off, _ := createAndGet(annotatedPod(ns, "off", contract.AnnotationInject, "false"))
		Expect(sidecarCount(off)).To(BeZero())
		Expect(webhookCalls()).To(Equal(before), "pods without the opt-in never reach the webhook")

		annotated, _ := createAndGet(annotatedPod(ns, "annotated"))
		Expect(sidecarCount(annotated)).To(Equal(1), "the annotation on the pod template still works")
		Expect(webhookCalls()).To(Equal(before + 1))

		labelled := plainPod(ns, "labelled")
		labelled.Labels[contract.LabelInject] = "true"
		labelled.Annotations = map[string]string{contract.AnnotationUpstreamPort: "8080"}
		stored, _ = createAndGet(labelled)
		Expect(sidecarCount(stored)).To(Equal(1), "the label opts in too")
		Expect(webhookCalls()).To(Equal(before + 2))
	})

	It("is called for every pod of a namespace that opted in, but those that opt out", func() {
		const ns = "optin-namespace"
		Expect(client.IgnoreAlreadyExists(k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
			Name: ns, Labels: map[string]string{contract.NamespaceLabelInjection: contract.NamespaceInjectionEnabled},
		}}))).To(Succeed())
		before := webhookCalls()

		plain := plainPod(ns, "plain")
		plain.Annotations = map[string]string{contract.AnnotationUpstreamPort: "8080"}
		stored, _ := createAndGet(plain)
		Expect(sidecarCount(stored)).To(Equal(1), "the namespace's label opts its pods in")
		Expect(webhookCalls()).To(Equal(before + 1))

		annotated, _ := createAndGet(annotatedPod(ns, "annotated"))
		Expect(sidecarCount(annotated)).To(Equal(1))
		Expect(webhookCalls()).To(Equal(before+2), "sent once, not by both entries")

		out, _ := createAndGet(annotatedPod(ns, "opted-out", contract.AnnotationInject, "false"))
		Expect(sidecarCount(out)).To(BeZero())
		labelledOut := plainPod(ns, "labelled-out")
		labelledOut.Labels[contract.LabelInject] = "false"
		stored, _ = createAndGet(labelledOut)
		Expect(sidecarCount(stored)).To(BeZero())
		Expect(webhookCalls()).To(Equal(before+2), "pods that opt out never reach the webhook")
	})
})

var _ = Describe("config/samples/networkpolicy", func() {
	It("is accepted by the API server and opens the admin port to Prometheus only", func() {
		data, err := os.ReadFile(filepath.Join("..", "..", "..", "config", "samples", "networkpolicy", "sidecar-ports.yaml"))
		Expect(err).NotTo(HaveOccurred())
		np := &networkingv1.NetworkPolicy{}
		Expect(yaml.UnmarshalStrict(data, np)).To(Succeed())
		createNamespace("netpol-sample")
		np.Namespace = "netpol-sample"
		Expect(k8s.Create(context.Background(), np)).To(Succeed())
		Expect(np.Spec.PodSelector.MatchLabels).To(HaveKeyWithValue(contract.LabelInject, "true"))
		admin := 0
		for _, rule := range np.Spec.Ingress {
			for _, p := range rule.Ports {
				if p.Port.IntValue() == contract.AdminPort {
					admin++
					Expect(rule.From).NotTo(BeEmpty(), "the admin port is open to named peers only")
				}
			}
		}
		Expect(admin).To(Equal(1))
	})
})
