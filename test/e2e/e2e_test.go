package e2e

import (
	"fmt"
	"strconv"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	v1alpha1 "github.com/redline-dev/redline/api/v1alpha1"
	"github.com/redline-dev/redline/internal/compiled"
	"github.com/redline-dev/redline/internal/testutil/stack"
	"github.com/redline-dev/redline/internal/webhook/contract"
)

// The specs share one stack and run in order: the later ones break Redis and the manager.
var _ = Describe("Redline on a local cluster", Ordered, func() {
	It("injects the sidecar into every Pod of the opted-in Deployment", func(ctx SpecContext) {
		Expect(pods).To(HaveLen(replicas))
		for i := range pods {
			pod := &pods[i]
			Expect(pod.Annotations).To(HaveKey(contract.AnnotationInjected), "pod %s", pod.Name)
			sc, ok := stack.SidecarContainer(pod)
			Expect(ok).To(BeTrue(), "pod %s has no sidecar", pod.Name)
			// The API server is 1.29+, so the webhook's auto mode picks a native sidecar.
			Expect(pod.Spec.InitContainers).To(ContainElement(HaveField("Name", contract.ContainerName)))
			Expect(sc.RestartPolicy).To(Equal(ptr.To(corev1.ContainerRestartPolicyAlways)))
			Expect(sc.Image).To(Equal(stack.SidecarImage))
			Expect(sc.Args).To(ContainElements(
				"--"+contract.FlagUpstream+"="+contract.UpstreamHost+":"+strconv.Itoa(upstreamPort),
				"--"+contract.FlagConfigDir+"="+contract.PoliciesDir,
				"--"+contract.FlagPodLabels+"="+contract.PodLabelsFile,
			))
			Expect(sc.Env).To(ContainElements(
				corev1.EnvVar{Name: contract.EnvRedisURL, Value: st.Redis.URL()},
				HaveField("Name", contract.EnvPodName),
				HaveField("Name", contract.EnvPodNamespace),
			))
			Expect(sc.VolumeMounts).To(ConsistOf(
				HaveField("MountPath", contract.PoliciesDir),
				HaveField("MountPath", contract.PodInfoDir),
			))
			Expect(pod.Spec.Volumes).To(ContainElements(
				SatisfyAll(HaveField("Name", contract.PoliciesVolume),
					HaveField("ConfigMap.LocalObjectReference.Name", compiled.ConfigMapName)),
				SatisfyAll(HaveField("Name", contract.PodInfoVolume), HaveField("DownwardAPI", Not(BeNil()))),
			))
			// The app container is untouched.
			Expect(pod.Spec.Containers).To(HaveLen(1))
		}
		// Each sidecar runs with what its Pod says, and enforces the namespace's document.
		doc, _, err := st.PoliciesDocument(ctx, namespace)
		Expect(err).NotTo(HaveOccurred())
		for _, sc := range sidecars {
			Expect(sc.Env).To(ContainElement("POD_NAME=" + sc.Pod.Name))
			Eventually(func(g Gomega) {
				v, err := sc.Metric(ctx, "redline_sidecar_config_info", map[string]string{"hash": doc.Hash})
				g.Expect(err).NotTo(HaveOccurred())
				g.Expect(v).To(Equal(1.0))
			}).Should(Succeed())
		}
	})

	DescribeTable("admits exactly the limit across three replicas",
		func(ctx SpecContext, alg v1alpha1.Algorithm) {
			before := upstream.Hits()
			t := send(ctx, exactPrefix(alg), freshKey("exact"), 3*exactLimit, 12)
			fmt.Fprintf(GinkgoWriter, "%s: sent %d, admitted %d, refused %d in %s\n", alg, t.Sent, t.Admitted, t.Limited, t.Elapsed)
			Expect(t.Failed).To(BeZero(), "first failure: %s", t.FirstFailure)
			Expect(t.Admitted).To(Equal(exactLimit))
			Expect(t.Limited).To(Equal(2 * exactLimit))
			for i, c := range t.PerTarget {
				Expect(c.Sent).To(Equal(exactLimit), "sidecar %d", i)
			}
			Expect(upstream.Hits() - before).To(BeEquivalentTo(exactLimit))
		},
		Entry("FixedWindow", v1alpha1.FixedWindow),
		Entry("SlidingWindowLog", v1alpha1.SlidingWindowLog),
		Entry("SlidingWindowCounter", v1alpha1.SlidingWindowCounter),
		Entry("TokenBucket", v1alpha1.TokenBucket),
	)
})
