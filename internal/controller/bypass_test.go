package controller_test

import (
	"context"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	v1alpha1 "github.com/redline-dev/redline/api/v1alpha1"
)

func service(ns, name string, target intstr.IntOrString) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: corev1.ServiceSpec{
			Selector: map[string]string{"app": "checkout"},
			Ports:    []corev1.ServicePort{{Port: 80, TargetPort: target}},
		},
	}
}

var _ = Describe("Services around the sidecar", func() {
	It("says a policy is not enforced while a Service targets the application's port by number, not by the name the sidecar takes over", func() {
		ctx := context.Background()
		ns := newNamespace(ctx)
		d := injectedDeployment(ns, "checkout", 2, "")
		d.Spec.Template.Spec.Containers[0].Ports = []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}}
		Expect(k8s.Create(ctx, d)).To(Succeed())
		// The connection budget is cluster-wide: an injected workload left behind changes the
		// shares the budget specs expect.
		DeferCleanup(func(ctx context.Context) { Expect(k8s.Delete(ctx, d)).To(Succeed()) })
		Expect(k8s.Create(ctx, policy(ns, "p", 100))).To(Succeed())
		expectProgrammed(ctx, ns, "p")

		Expect(k8s.Create(ctx, service(ns, "through", intstr.FromString("redline")))).To(Succeed())
		Expect(k8s.Create(ctx, service(ns, "by-number", intstr.FromInt32(8080)))).To(Succeed())
		Expect(k8s.Create(ctx, service(ns, "by-name", intstr.FromString("http")))).To(Succeed())
		Eventually(func(g Gomega) {
			c := condition(g, ctx, ns, "p", v1alpha1.ConditionEnforced)
			g.Expect(c.Status).To(Equal(metav1.ConditionFalse), "%s: %s", c.Reason, c.Message)
			g.Expect(c.Reason).To(Equal(v1alpha1.ReasonServiceBypassesSidecar))
			g.Expect(c.Message).To(HavePrefix("1 Service port(s) reach this policy's pods around the sidecar"))
			g.Expect(c.Message).To(ContainSubstring("Service by-number port 80 targets 8080, the application's port 8080 of Deployment checkout"))
			g.Expect(c.Message).NotTo(ContainSubstring("Service by-name"), "the injector hands the name http over to the sidecar's port")
			g.Expect(c.Message).NotTo(ContainSubstring("Service through"))
		}, timeout, interval).Should(Succeed())
		Eventually(func(g Gomega) []string { return eventsAbout(g, ctx, ns, "RateLimitPolicy", "p") }, timeout, interval).
			Should(ContainElement(HavePrefix("Warning/"+v1alpha1.ReasonServiceBypassesSidecar+": Enforced=False: ")), "told when the first one appeared")
		Eventually(func(g Gomega) float64 {
			return gauge(g, "redline_policy_service_bypasses", map[string]string{"namespace": ns, "policy": "p"})
		}, timeout, interval).Should(Equal(1.0))

		// Both sent through the sidecar (by its port name and by its listen port): no sidecar has
		// reported yet, which is all Enforced says.
		for name, target := range map[string]intstr.IntOrString{"by-number": intstr.FromInt32(8000), "by-name": intstr.FromString("redline")} {
			edit(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}, func(s *corev1.Service) {
				s.Spec.Ports[0].TargetPort = target
			})
		}
		Eventually(func(g Gomega) string {
			return condition(g, ctx, ns, "p", v1alpha1.ConditionEnforced).Reason
		}, timeout, interval).Should(Equal(v1alpha1.ReasonNoSidecars))
		Eventually(func(g Gomega) float64 {
			return gauge(g, "redline_policy_service_bypasses", map[string]string{"namespace": ns, "policy": "p"})
		}, timeout, interval).Should(BeZero())
	})
})
