package e2e

import (
	"context"
	"strconv"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/redline-dev/redline/api/v1alpha1"
	"github.com/redline-dev/redline/internal/policydoc"
	"github.com/redline-dev/redline/internal/sidecar/contract"
	"github.com/redline-dev/redline/internal/testutil/stack"
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
				HaveField("MountPath", contract.RedisCredentialsDir),
			))
			Expect(pod.Spec.Volumes).To(ContainElements(
				SatisfyAll(HaveField("Name", contract.PoliciesVolume),
					HaveField("ConfigMap.LocalObjectReference.Name", policydoc.ConfigMapName)),
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
			GinkgoWriter.Printf("%s: sent %d, admitted %d, refused %d in %s\n", alg, t.Sent, t.Admitted, t.Limited, t.Elapsed)
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

	It("propagates a policy update to every replica", func(ctx SpecContext) {
		before, err := st.WaitProgrammed(ctx, namespace, updateName, time.Minute)
		Expect(err).NotTo(HaveOccurred())
		const newLimit = 20
		start := time.Now()
		Expect(st.ApplyPolicy(ctx, policy(updateName, updatePrefix, v1alpha1.SlidingWindowLog, newLimit, v1alpha1.FailureModeOpen))).To(Succeed())
		// One at a time and round-robin: the requests past the new limit reach every replica, so
		// exactly newLimit admitted means all three enforce it (one still on 100 would admit more).
		Eventually(func(g Gomega) {
			t := send(ctx, updatePrefix, freshKey("update"), newLimit+3*replicas, 1)
			g.Expect(t.Failed).To(BeZero(), "first failure: %s", t.FirstFailure)
			g.Expect(t.Admitted).To(Equal(newLimit))
		}).WithTimeout(time.Minute).WithPolling(100 * time.Millisecond).Should(Succeed())
		took := time.Since(start)
		GinkgoWriter.Printf("policy update enforced by all %d replicas %s after the apply\n", replicas, took.Round(time.Millisecond))
		AddReportEntry("policy update propagation", took.Round(time.Millisecond).String())

		after, err := st.WaitProgrammed(ctx, namespace, updateName, time.Minute)
		Expect(err).NotTo(HaveOccurred())
		Expect(after.Generation).To(BeNumerically(">", before.Generation))
		Expect(after.Status.ConfigHash).NotTo(Equal(before.Status.ConfigHash))
	})

	It("lifts the limit when the policy is deleted", func(ctx SpecContext) {
		Expect(st.DeletePolicy(ctx, namespace, updateName)).To(Succeed())
		Eventually(func(g Gomega) {
			doc, _, err := st.PoliciesDocument(ctx, namespace)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(doc.Policies).NotTo(ContainElement(HaveField("Name", updateName)))
		}).WithTimeout(time.Minute).Should(Succeed())
		Eventually(func(g Gomega) {
			t := send(ctx, updatePrefix, freshKey("deleted"), 150, 6)
			g.Expect(t.Failed).To(BeZero(), "first failure: %s", t.FirstFailure)
			g.Expect(t.Admitted).To(Equal(150))
		}).WithTimeout(time.Minute).WithPolling(100 * time.Millisecond).Should(Succeed())
	})

	It("heals a SCRIPT FLUSH through the manager, the only one allowed to load scripts", func(ctx SpecContext) {
		// Sidecars reach Redis as their namespace's user, which may not SCRIPT LOAD (any Lua a
		// tenant loads would run on Redis's one thread): after a flush they decide by their
		// failure mode until the manager's periodic check has loaded every script again.
		loadsBefore := sumMetric(Default, ctx, "redline_sidecar_script_loads_total", nil)
		rdb := redisClient()
		defer func() { _ = rdb.Close() }()
		Expect(rdb.ScriptFlush(ctx).Err()).To(Succeed())
		Eventually(func(g Gomega) {
			expectScriptsLoaded(g, ctx)
			expectAllProgrammed(g, ctx)
		}).WithTimeout(time.Minute).WithPolling(200 * time.Millisecond).Should(Succeed())
		alg := v1alpha1.SlidingWindowCounter
		Eventually(func(g Gomega) {
			t := send(ctx, exactPrefix(alg), freshKey("flush"), 3*exactLimit, 6)
			g.Expect(t.Failed).To(BeZero(), "first failure: %s", t.FirstFailure)
			g.Expect(t.Admitted).To(Equal(exactLimit))
		}).WithTimeout(30 * time.Second).WithPolling(200 * time.Millisecond).Should(Succeed())
		Expect(sumMetric(Default, ctx, "redline_sidecar_script_loads_total", nil)).To(Equal(loadsBefore), "no sidecar loaded a script")
	})

	It("applies each failure mode while Redis is down, and recovers when it restarts", func(ctx SpecContext) {
		// LocalFallback divides by the replica count the heartbeats recorded while Redis was up.
		Eventually(func(g Gomega) {
			for _, sc := range sidecars {
				v, err := sc.Metric(ctx, "redline_sidecar_policy_replicas", map[string]string{"policy": failName(v1alpha1.FailureModeLocalFallback)})
				g.Expect(err).NotTo(HaveOccurred())
				g.Expect(v).To(BeEquivalentTo(replicas), "sidecar of %s", sc.Pod.Name)
			}
		}).WithTimeout(time.Minute).WithPolling(200 * time.Millisecond).Should(Succeed())

		Expect(st.Redis.Stop()).To(Succeed())
		restarted := false
		defer func() {
			if !restarted {
				_ = st.Redis.Start() // leave Redis up for the specs that follow
			}
		}()

		By("Open admits everything")
		t := send(ctx, failPrefix(v1alpha1.FailureModeOpen), freshKey("open"), 2*failLimit, 6)
		Expect(t.Failed).To(BeZero(), "first failure: %s", t.FirstFailure)
		Expect(t.Admitted).To(Equal(2 * failLimit))

		By("Closed refuses everything")
		t = send(ctx, failPrefix(v1alpha1.FailureModeClosed), freshKey("closed"), 2*failLimit, 6)
		Expect(t.Failed).To(BeZero(), "first failure: %s", t.FirstFailure)
		Expect(t.Limited).To(Equal(2 * failLimit))

		By("LocalFallback admits limit/replicas on each replica")
		t = send(ctx, failPrefix(v1alpha1.FailureModeLocalFallback), freshKey("fallback"), 3*failLimit, 6)
		Expect(t.Failed).To(BeZero(), "first failure: %s", t.FirstFailure)
		for i, c := range t.PerTarget {
			Expect(c.Admitted).To(Equal(failLimit/replicas), "sidecar %d", i)
		}
		// Every one of those decisions was made by the failure mode, none reached Redis.
		for _, m := range failureModes {
			source := map[v1alpha1.FailureMode]string{
				v1alpha1.FailureModeOpen: "failopen", v1alpha1.FailureModeClosed: "failclosed", v1alpha1.FailureModeLocalFallback: "fallback",
			}[m]
			sent := map[v1alpha1.FailureMode]int{v1alpha1.FailureModeOpen: 2 * failLimit, v1alpha1.FailureModeClosed: 2 * failLimit,
				v1alpha1.FailureModeLocalFallback: 3 * failLimit}[m]
			Expect(sumMetric(Default, ctx, "redline_sidecar_decisions_total",
				map[string]string{"policy": failName(m), "source": source})).To(BeEquivalentTo(sent), "policy %s", failName(m))
		}

		By("Programmed turns False while the scripts cannot be checked")
		Eventually(func(g Gomega) {
			g.Expect(programmedStatus(g, ctx, exactName(v1alpha1.FixedWindow))).To(Equal(metav1.ConditionFalse))
		}).WithTimeout(time.Minute).WithPolling(200 * time.Millisecond).Should(Succeed())

		By("restarting Redis: shared counting resumes and Programmed comes back")
		Expect(st.Redis.Start()).To(Succeed())
		restarted = true
		start := time.Now()
		Eventually(func(g Gomega) {
			t := send(ctx, exactPrefix(v1alpha1.FixedWindow), freshKey("recovered"), exactLimit+3*replicas, 1)
			g.Expect(t.Failed).To(BeZero(), "first failure: %s", t.FirstFailure)
			g.Expect(t.Admitted).To(Equal(exactLimit))
		}).WithTimeout(time.Minute).WithPolling(200 * time.Millisecond).Should(Succeed())
		GinkgoWriter.Printf("shared limit exact again %s after Redis restarted\n", time.Since(start).Round(time.Millisecond))
		Eventually(func(g Gomega) {
			expectScriptsLoaded(g, ctx)
			expectAllProgrammed(g, ctx)
		}).WithTimeout(time.Minute).WithPolling(200 * time.Millisecond).Should(Succeed())
	})

	It("keeps every policy and the compiled ConfigMap across a manager restart", func(ctx SpecContext) {
		docBefore, cmBefore, err := st.PoliciesDocument(ctx, namespace)
		Expect(err).NotTo(HaveOccurred())
		var before v1alpha1.RateLimitPolicyList
		Expect(st.Client.List(ctx, &before, client.InNamespace(namespace))).To(Succeed())

		Expect(st.RestartManager(ctx)).To(Succeed())

		// Give the new manager time to reconcile everything, then compare.
		Eventually(func(g Gomega) { expectAllProgrammed(g, ctx) }).WithTimeout(time.Minute).Should(Succeed())
		Consistently(func(g Gomega) {
			docAfter, cmAfter, err := st.PoliciesDocument(ctx, namespace)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(docAfter.Hash).To(Equal(docBefore.Hash))
			g.Expect(cmAfter.Data).To(Equal(cmBefore.Data))
			expectAllProgrammed(g, ctx)
		}).WithTimeout(3 * time.Second).WithPolling(500 * time.Millisecond).Should(Succeed())
		var after v1alpha1.RateLimitPolicyList
		Expect(st.Client.List(ctx, &after, client.InNamespace(namespace))).To(Succeed())
		Expect(after.Items).To(HaveLen(len(before.Items)))
		for i := range after.Items {
			Expect(after.Items[i].Generation).To(Equal(before.Items[i].Generation))
			Expect(after.Items[i].Status.ConfigHash).To(Equal(before.Items[i].Status.ConfigHash))
		}

		By("the restarted webhook still injects new Pods")
		app := stack.App{Namespace: namespace, Name: "after-restart", Replicas: 1,
			Labels: map[string]string{"app": "after-restart"}, UpstreamPort: upstreamPort}
		Expect(st.CreateDeployment(ctx, app)).To(Succeed())
		_, err = st.WaitPods(ctx, app, time.Minute)
		Expect(err).NotTo(HaveOccurred())

		By("and the sidecars still decide against the shared limit")
		t := send(ctx, exactPrefix(v1alpha1.TokenBucket), freshKey("after-restart"), 3*exactLimit, 12)
		Expect(t.Failed).To(BeZero(), "first failure: %s", t.FirstFailure)
		Expect(t.Admitted).To(Equal(exactLimit))
	})

	It("removes the ConfigMap and every limit with the namespace's last policy", func(ctx SpecContext) {
		var list v1alpha1.RateLimitPolicyList
		Expect(st.Client.List(ctx, &list, client.InNamespace(namespace))).To(Succeed())
		for _, p := range list.Items {
			Expect(st.DeletePolicy(ctx, namespace, p.Name)).To(Succeed())
		}
		Eventually(func(g Gomega) {
			_, _, err := st.PoliciesDocument(ctx, namespace)
			g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "ConfigMap still there: %v", err)
		}).WithTimeout(time.Minute).Should(Succeed())
		// kubelet empties an optional ConfigMap volume whose ConfigMap is gone; no document means
		// no limits.
		Eventually(func(g Gomega) {
			t := send(ctx, exactPrefix(v1alpha1.FixedWindow), freshKey("no-policies"), 3*exactLimit, 12)
			g.Expect(t.Failed).To(BeZero(), "first failure: %s", t.FirstFailure)
			g.Expect(t.Admitted).To(Equal(3 * exactLimit))
		}).WithTimeout(time.Minute).WithPolling(200 * time.Millisecond).Should(Succeed())
	})
})

// programmedStatus is the status of the policy's Programmed condition.
func programmedStatus(g Gomega, ctx context.Context, name string) metav1.ConditionStatus {
	var p v1alpha1.RateLimitPolicy
	g.Expect(st.Client.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, &p)).To(Succeed())
	c := meta.FindStatusCondition(p.Status.Conditions, "Programmed")
	g.Expect(c).NotTo(BeNil())
	return c.Status
}
