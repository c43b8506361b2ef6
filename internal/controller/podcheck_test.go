package controller_test

import (
	"context"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/redline-dev/redline/api/v1alpha1"
	"github.com/redline-dev/redline/internal/sidecar/contract"
)

// readyPod creates a pod labelled app=checkout, with the sidecar container or without, and
// marks it Ready as a kubelet would.
func readyPod(ctx context.Context, ns, name string, sidecar bool) *corev1.Pod {
	GinkgoHelper()
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{"app": "checkout"}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "app:1"}}},
	}
	if sidecar {
		p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: contract.ContainerName, Image: "redline:1"})
	}
	Expect(k8s.Create(ctx, p)).To(Succeed())
	p.Status.Phase = corev1.PodRunning
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
	Expect(k8s.Status().Update(ctx, p)).To(Succeed())
	return p
}

var _ = Describe("Pods without a sidecar", func() {
	It("says a policy is not enforced while a Ready pod it selects runs without the sidecar", func() {
		ctx := context.Background()
		ns := newNamespace(ctx)
		Expect(k8s.Create(ctx, policy(ns, "p", 100))).To(Succeed())
		expectProgrammed(ctx, ns, "p")

		readyPod(ctx, ns, "guarded", true)
		bare := readyPod(ctx, ns, "unguarded", false)
		Eventually(func(g Gomega) {
			c := condition(g, ctx, ns, "p", v1alpha1.ConditionEnforced)
			g.Expect(c.Status).To(Equal(metav1.ConditionFalse), "%s: %s", c.Reason, c.Message)
			g.Expect(c.Reason).To(Equal(v1alpha1.ReasonPodsWithoutSidecar))
			g.Expect(c.Message).To(HavePrefix("1 Ready pod(s) this policy selects run without the Redline sidecar, so their traffic is not limited: unguarded."))
			g.Expect(c.Message).NotTo(ContainSubstring("guarded,"))
		}, timeout, interval).Should(Succeed())
		Eventually(func(g Gomega) []string { return eventsAbout(g, ctx, ns, "RateLimitPolicy", "p") }, timeout, interval).
			Should(ContainElement(HavePrefix("Warning/"+v1alpha1.ReasonPodsWithoutSidecar+": Enforced=False: ")), "told when it appeared")
		Eventually(func(g Gomega) float64 {
			return gauge(g, "redline_policy_pods_without_sidecar", map[string]string{"namespace": ns, "policy": "p"})
		}, timeout, interval).Should(Equal(1.0))
		Eventually(func(g Gomega) float64 {
			return gauge(g, "redline_policy_condition", map[string]string{"namespace": ns, "policy": "p", "condition": v1alpha1.ConditionEnforced})
		}, timeout, interval).Should(BeZero(), "the series the RedlinePolicyNotEnforced alert reads")

		// Not Ready (a failing probe takes it out of its Services): nothing reaches it.
		bare.Status.Conditions[0].Status = corev1.ConditionFalse
		Expect(k8s.Status().Update(ctx, bare)).To(Succeed())
		Eventually(func(g Gomega) string {
			return condition(g, ctx, ns, "p", v1alpha1.ConditionEnforced).Reason
		}, timeout, interval).Should(Equal(v1alpha1.ReasonNoSidecars))
		Eventually(func(g Gomega) float64 {
			return gauge(g, "redline_policy_pods_without_sidecar", map[string]string{"namespace": ns, "policy": "p"})
		}, timeout, interval).Should(BeZero())
	})
})
