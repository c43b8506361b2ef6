package controller_test

import (
	"context"
	"maps"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/redline-dev/redline/api/v1alpha1"
	"github.com/redline-dev/redline/internal/sidecar/contract"
)

// replicaSetOf is the ReplicaSet the Deployment controller would create for d (envtest runs
// no kube-controller-manager): named after d and its pods' pod-template-hash label.
func replicaSetOf(d *appsv1.Deployment) *appsv1.ReplicaSet {
	tmpl := *d.Spec.Template.DeepCopy()
	tmpl.Labels = maps.Clone(tmpl.Labels)
	if tmpl.Labels == nil {
		tmpl.Labels = map[string]string{}
	}
	tmpl.Labels[appsv1.DefaultDeploymentUniqueLabelKey] = "7c9d"
	return &appsv1.ReplicaSet{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: d.Namespace, Name: d.Name + "-7c9d",
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: "apps/v1", Kind: "Deployment", Name: d.Name, UID: d.UID, Controller: new(true),
			}},
		},
		Spec: appsv1.ReplicaSetSpec{Replicas: d.Spec.Replicas, Selector: d.Spec.Selector, Template: tmpl},
	}
}

// admitPod creates a pod of rs as its controller would (generateName and a controller
// reference, no name) through the webhook, and returns the pool its sidecar starts with ("" for
// the sidecar's default) and the admission warnings.
func admitPod(g Gomega, ctx context.Context, rs *appsv1.ReplicaSet) (string, []string) {
	warnings.Take()
	sidecar := admitSidecar(g, ctx, warnK8s, rs)
	warns := warnings.Take()
	return poolOf(g, ctx, rs.Namespace, sidecar), warns
}

// poolOf is the pool a sidecar starts with, as kubelet gives it its environment: the budget's,
// from its workload's key of the namespace's ConfigMap when that is there, over its
// --redis-pool-size.
func poolOf(g Gomega, ctx context.Context, ns string, sidecar *corev1.Container) string {
	pool := ""
	for _, a := range sidecar.Args {
		if v, ok := strings.CutPrefix(a, "--"+contract.FlagRedisPoolSize+"="); ok {
			pool = v
		}
	}
	for _, e := range sidecar.Env {
		if e.Name != contract.EnvBudgetRedisPoolSize || e.ValueFrom == nil || e.ValueFrom.ConfigMapKeyRef == nil {
			continue
		}
		ref := e.ValueFrom.ConfigMapKeyRef
		var cm corev1.ConfigMap
		err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: ref.Name}, &cm)
		g.Expect(client.IgnoreNotFound(err)).To(Succeed())
		if v, ok := cm.Data[ref.Key]; ok && err == nil {
			pool = v
		}
	}
	return pool
}

// admitSidecar creates a pod of rs as its controller would through the webhook, with c, and
// returns its injected sidecar. The pods only carry the answer; they never run.
func admitSidecar(g Gomega, ctx context.Context, c client.Client, rs *appsv1.ReplicaSet) *corev1.Container {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: rs.Namespace, GenerateName: rs.Name + "-",
			Labels: rs.Spec.Template.Labels, Annotations: rs.Spec.Template.Annotations,
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: "apps/v1", Kind: "ReplicaSet", Name: rs.Name, UID: rs.UID, Controller: new(true),
			}},
		},
		Spec: rs.Spec.Template.Spec,
	}
	g.Expect(c.Create(ctx, pod)).To(Succeed())
	g.Expect(k8s.Delete(ctx, pod)).To(Succeed())
	for i, ctr := range pod.Spec.InitContainers {
		if ctr.Name == contract.ContainerName {
			return &pod.Spec.InitContainers[i]
		}
	}
	g.Expect(pod.Spec.InitContainers).To(ContainElement(HaveField("Name", contract.ContainerName)), "the webhook did not inject pod %s", pod.Name)
	return nil
}

func setMaxReplicas(ctx context.Context, d *appsv1.Deployment, n int32) {
	GinkgoHelper()
	hpa := hpaFor(d, 0)
	Expect(k8s.Get(ctx, client.ObjectKeyFromObject(hpa), hpa)).To(Succeed())
	hpa.Spec.MaxReplicas = n
	Expect(k8s.Update(ctx, hpa)).To(Succeed())
}

var _ = Describe("Pools sized from the Redis connection budget", func() {
	// maxclients 200 - reserve (4 for the manager + 5% = 10) leaves 186 to share.
	It("gives new pods the pool the budget allows, following the HPA's maxReplicas", func(ctx SpecContext) {
		ns := newNamespace(ctx)
		checkout := injectedDeployment(ns, "checkout", 2, "")
		Expect(k8s.Create(ctx, checkout)).To(Succeed())
		rs := replicaSetOf(checkout)
		Expect(k8s.Create(ctx, rs)).To(Succeed())
		hpa := hpaFor(checkout, 5)
		Expect(k8s.Create(ctx, hpa)).To(Succeed())
		p := policy(ns, "checkout-limit", 100)
		Expect(k8s.Create(ctx, p)).To(Succeed())
		DeferCleanup(func(ctx context.Context) {
			for _, o := range []client.Object{hpa, rs, checkout} {
				Expect(client.IgnoreNotFound(k8s.Delete(ctx, o))).To(Succeed())
			}
		})

		By("one workload at 5 replicas: 186 / 5 = 37, capped at 16")
		Eventually(func(g Gomega) {
			pool, warns := admitPod(g, ctx, rs)
			g.Expect(pool).To(Equal("16"), "pool of a new pod at maxReplicas 5")
			g.Expect(warns).To(BeEmpty())
			c := condition(g, ctx, ns, p.Name, v1alpha1.ConditionRedisConnectionBudget)
			g.Expect(c.Reason).To(Equal(v1alpha1.ReasonWithinBudget))
			g.Expect(c.Message).To(HaveSuffix("Deployment " + ns + "/checkout 5 x 16"))
		}, timeout, interval).Should(Succeed())

		By("maxReplicas 40, where the default pool would open 640 of 200: 186 / 40 = 4")
		setMaxReplicas(ctx, checkout, 40)
		Eventually(func(g Gomega) {
			pool, _ := admitPod(g, ctx, rs)
			g.Expect(pool).To(Equal("4"), "pool of a new pod at maxReplicas 40")
			c := condition(g, ctx, ns, p.Name, v1alpha1.ConditionRedisConnectionBudget)
			g.Expect(c.Reason).To(Equal(v1alpha1.ReasonWithinBudget), "the controller counts the pool the injector gives: 40 x 4 + 4 = 164")
			g.Expect(c.Message).To(HaveSuffix("Deployment " + ns + "/checkout 40 x 4"))
			g.Expect(gauge(g, "redline_redis_connections_worst_case", nil)).To(Equal(164.0))
		}, timeout, interval).Should(Succeed())

		By("back to maxReplicas 5: the pool returns")
		setMaxReplicas(ctx, checkout, 5)
		Eventually(func(g Gomega) {
			pool, _ := admitPod(g, ctx, rs)
			g.Expect(pool).To(Equal("16"), "pool of a new pod back at maxReplicas 5")
			g.Expect(gauge(g, "redline_redis_connections_worst_case", nil)).To(Equal(84.0))
		}, timeout, interval).Should(Succeed())
	})

	It("lets the annotation win, with OverBudget when it overspends", func(ctx SpecContext) {
		ns := newNamespace(ctx)
		checkout := injectedDeployment(ns, "checkout", 2, "")
		pinned := injectedDeployment(ns, "pinned", 2, "8")
		var cleanup []client.Object
		for _, d := range []*appsv1.Deployment{checkout, pinned} {
			Expect(k8s.Create(ctx, d)).To(Succeed())
			cleanup = append(cleanup, d)
		}
		checkoutRS, pinnedRS := replicaSetOf(checkout), replicaSetOf(pinned)
		checkoutHPA, pinnedHPA := hpaFor(checkout, 5), hpaFor(pinned, 30)
		for _, o := range []client.Object{checkoutRS, pinnedRS, checkoutHPA, pinnedHPA} {
			Expect(k8s.Create(ctx, o)).To(Succeed())
			cleanup = append(cleanup, o)
		}
		p := policy(ns, "pinned-limit", 100)
		p.Spec.TargetSelector.MatchLabels = map[string]string{"app": "pinned"}
		Expect(k8s.Create(ctx, p)).To(Succeed())
		DeferCleanup(func(ctx context.Context) {
			for _, o := range cleanup {
				Expect(client.IgnoreNotFound(k8s.Delete(ctx, o))).To(Succeed())
			}
		})

		By("two workloads share 186: 93 each; pinned asks 8 x 30 = 240")
		Eventually(func(g Gomega) {
			pool, warns := admitPod(g, ctx, pinnedRS)
			g.Expect(pool).To(Equal("8"), "the annotation wins")
			// The warning would carry the workload's maxReplicas and share to whoever sent the
			// review: given only where the webhook verifies the API server's certificate.
			g.Expect(warns).To(BeEmpty())
			pool, warns = admitPod(g, ctx, checkoutRS)
			g.Expect(pool).To(Equal("16"), "93 / 5, capped at the default")
			g.Expect(warns).To(BeEmpty())

			// 30 x 8 + 5 x 16 = 320 > 186, the namespace's share.
			c := condition(g, ctx, ns, p.Name, v1alpha1.ConditionRedisConnectionBudget)
			g.Expect(c.Reason).To(Equal(v1alpha1.ReasonOverBudget))
			g.Expect(c.Message).To(ContainSubstring("namespace " + ns + "'s worst case 320 connections per Redis node at maxReplicas (deployment pinned 30 x 8, deployment checkout 5 x 16), over its share of Redis's connections, 186"))
			g.Expect(eventsAbout(g, ctx, ns, "HorizontalPodAutoscaler", "pinned")).To(ContainElement(
				HavePrefix("Warning/" + v1alpha1.ReasonOverBudget + ": Deployment " + ns + "/pinned at 30 replicas x 8 connections")))
		}, timeout, interval).Should(Succeed())

		By("pinned's maxReplicas 10: 80 fits its share, and the total is back within")
		setMaxReplicas(ctx, pinned, 10)
		Eventually(func(g Gomega) {
			pool, warns := admitPod(g, ctx, pinnedRS)
			g.Expect(pool).To(Equal("8"))
			g.Expect(warns).To(BeEmpty())
			c := condition(g, ctx, ns, p.Name, v1alpha1.ConditionRedisConnectionBudget)
			g.Expect(c.Reason).To(Equal(v1alpha1.ReasonWithinBudget))
			g.Expect(eventsAbout(g, ctx, ns, "HorizontalPodAutoscaler", "pinned")).To(ContainElement(
				HavePrefix("Normal/" + v1alpha1.ReasonWithinBudget + ": Redis connections are within the namespace's share again")))
		}, timeout, interval).Should(Succeed())
	})

	It("counts a ReplicaSet without a Deployment as its own workload", func(ctx SpecContext) {
		ns := newNamespace(ctx)
		d := injectedDeployment(ns, "worker", 3, "")
		rs := &appsv1.ReplicaSet{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "worker"},
			Spec:       appsv1.ReplicaSetSpec{Replicas: ptr.To[int32](30), Selector: d.Spec.Selector, Template: d.Spec.Template},
		}
		Expect(k8s.Create(ctx, rs)).To(Succeed())
		DeferCleanup(func(ctx context.Context) { Expect(client.IgnoreNotFound(k8s.Delete(ctx, rs))).To(Succeed()) })
		p := policy(ns, "worker-limit", 100)
		p.Spec.TargetSelector.MatchLabels = map[string]string{"app": "worker"}
		Expect(k8s.Create(ctx, p)).To(Succeed())

		Eventually(func(g Gomega) {
			pool, _ := admitPod(g, ctx, rs)
			g.Expect(pool).To(Equal("6"), "186 / 30")
			c := condition(g, ctx, ns, p.Name, v1alpha1.ConditionRedisConnectionBudget)
			g.Expect(c.Message).To(HaveSuffix("ReplicaSet " + ns + "/worker 30 x 6"))
		}, timeout, interval).Should(Succeed())
	})
})
