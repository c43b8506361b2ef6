package controller_test

import (
	"context"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	v1alpha1 "github.com/redline-dev/redline/api/v1alpha1"
	"github.com/redline-dev/redline/internal/backend"
	"github.com/redline-dev/redline/internal/sidecar/contract"
)

// onDefault selects the series of the manager's own Redis (RedisBackends have theirs).
var onDefault = map[string]string{"backend": backend.DefaultLabel}

// budgetMaxClients is the suite's redis-server maxclients.
const budgetMaxClients = 200

func injectedDeployment(ns, name string, replicas int32, pool string) *appsv1.Deployment {
	labels := map[string]string{"app": name}
	ann := map[string]string{contract.AnnotationInject: "true", contract.AnnotationUpstreamPort: "8080"}
	if pool != "" {
		ann[contract.AnnotationRedisPoolSize] = pool
	}
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: appsv1.DeploymentSpec{
			Replicas: new(replicas),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels, Annotations: ann},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "app:1"}}},
			},
		},
	}
}

func hpaFor(d *appsv1.Deployment, maxReplicas int32) *autoscalingv2.HorizontalPodAutoscaler {
	return &autoscalingv2.HorizontalPodAutoscaler{
		ObjectMeta: metav1.ObjectMeta{Namespace: d.Namespace, Name: d.Name},
		Spec: autoscalingv2.HorizontalPodAutoscalerSpec{
			ScaleTargetRef: autoscalingv2.CrossVersionObjectReference{APIVersion: "apps/v1", Kind: "Deployment", Name: d.Name},
			MinReplicas:    ptr.To[int32](1),
			MaxReplicas:    maxReplicas,
			Metrics: []autoscalingv2.MetricSpec{{
				Type: autoscalingv2.ResourceMetricSourceType,
				Resource: &autoscalingv2.ResourceMetricSource{
					Name:   corev1.ResourceCPU,
					Target: autoscalingv2.MetricTarget{Type: autoscalingv2.UtilizationMetricType, AverageUtilization: ptr.To[int32](80)},
				},
			}},
		},
	}
}

// eventsAbout lists "type/reason: note" of the Events regarding kind/name.
func eventsAbout(g Gomega, ctx context.Context, ns, kind, name string) []string {
	var list eventsv1.EventList
	g.Expect(k8s.List(ctx, &list, client.InNamespace(ns))).To(Succeed())
	var out []string
	for _, e := range list.Items {
		if e.Regarding.Kind == kind && e.Regarding.Name == name {
			out = append(out, e.Type+"/"+e.Reason+": "+e.Note)
		}
	}
	return out
}

// gauge reads a gauge of the manager's registry; labels select one series.
func gauge(g Gomega, name string, labels map[string]string) float64 {
	families, err := metrics.Registry.Gather()
	g.Expect(err).NotTo(HaveOccurred())
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	series:
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if want, ok := labels[l.GetName()]; ok && want != l.GetValue() {
					continue series
				}
			}
			return m.GetGauge().GetValue()
		}
	}
	g.Expect(name).To(BeEmpty(), "no series of %s with labels %v", name, labels)
	return 0
}

var _ = Describe("Redis connection budget", func() {
	It("reports a workload whose HPA takes the worst case past maxclients, and clears when it scales back", func(ctx SpecContext) {
		shop, other := newNamespace(ctx), newNamespace(ctx)
		// 5 x 8 + 2 x 16 + 4 (manager) = 76 of 200. search has no annotation: the budget sizes
		// its pool, (200 - 14 reserve) / 2 workloads / 2 replicas, capped at the default 16.
		checkout := injectedDeployment(shop, "checkout", 2, "8")
		Expect(k8s.Create(ctx, checkout)).To(Succeed())
		search := injectedDeployment(shop, "search", 2, "")
		Expect(k8s.Create(ctx, search)).To(Succeed())
		plain := injectedDeployment(shop, "plain", 100, "")
		delete(plain.Spec.Template.Annotations, contract.AnnotationInject) // not injected: opens nothing
		Expect(k8s.Create(ctx, plain)).To(Succeed())
		hpa := hpaFor(checkout, 5)
		Expect(k8s.Create(ctx, hpa)).To(Succeed())
		DeferCleanup(func(ctx context.Context) {
			for _, o := range []client.Object{hpa, checkout, search, plain} {
				Expect(client.IgnoreNotFound(k8s.Delete(ctx, o))).To(Succeed())
			}
		})

		p := policy(shop, "checkout-limit", 100) // targets app=checkout
		Expect(k8s.Create(ctx, p)).To(Succeed())
		unrelated := policy(other, "elsewhere", 100)
		Expect(k8s.Create(ctx, unrelated)).To(Succeed())

		Eventually(func(g Gomega) {
			c := condition(g, ctx, shop, p.Name, v1alpha1.ConditionRedisConnectionBudget)
			g.Expect(c.Status).To(Equal(metav1.ConditionTrue))
			g.Expect(c.Reason).To(Equal(v1alpha1.ReasonWithinBudget))
			// Only the policy's own workloads: a total in every policy's message would rewrite
			// them all on every change anywhere.
			g.Expect(c.Message).To(Equal("within the namespace's share of Redis's connections; this policy's workloads at maxReplicas x pool: Deployment " + shop + "/checkout 5 x 8"))
			g.Expect(gauge(g, "redline_redis_connections_worst_case", onDefault)).To(Equal(76.0))
			g.Expect(gauge(g, "redline_redis_maxclients", onDefault)).To(Equal(float64(budgetMaxClients)))
			g.Expect(gauge(g, "redline_redis_connected_clients", onDefault)).To(BeNumerically(">", 0))
			g.Expect(gauge(g, "redline_redis_workload_connections_worst_case",
				map[string]string{"namespace": shop, "name": "search"})).To(Equal(32.0))
		}, timeout, interval).Should(Succeed())

		By("scaling maxReplicas past the namespace's share: 30 x 8 + 32 = 272 > (200 - 14) / 1 namespace")
		Expect(k8s.Get(ctx, client.ObjectKeyFromObject(hpa), hpa)).To(Succeed())
		hpa.Spec.MaxReplicas = 30
		Expect(k8s.Update(ctx, hpa)).To(Succeed())
		Eventually(func(g Gomega) {
			c := condition(g, ctx, shop, p.Name, v1alpha1.ConditionRedisConnectionBudget)
			g.Expect(c.Status).To(Equal(metav1.ConditionFalse))
			g.Expect(c.Reason).To(Equal(v1alpha1.ReasonOverBudget))
			g.Expect(c.Message).To(ContainSubstring("namespace " + shop + "'s worst case 272 connections per Redis node at maxReplicas (deployment checkout 30 x 8, deployment search 2 x 16), over its share of Redis's connections, 186"))
			g.Expect(c.Message).To(ContainSubstring("lower maxReplicas"))
			g.Expect(eventsAbout(g, ctx, shop, "HorizontalPodAutoscaler", "checkout")).To(ContainElement(SatisfyAll(
				HavePrefix("Warning/"+v1alpha1.ReasonOverBudget+": Deployment "+shop+"/checkout at 30 replicas x 8 connections"),
				ContainSubstring("worst case 272"))))
			g.Expect(gauge(g, "redline_redis_connections_worst_case", onDefault)).To(Equal(276.0))
		}, timeout, interval).Should(Succeed())
		// The workload that did not change is not blamed.
		Expect(eventsAbout(Default, ctx, shop, "Deployment", "search")).To(BeEmpty())
		// A policy whose targets open no connections is not part of the total.
		Eventually(func(g Gomega) {
			c := condition(g, ctx, other, unrelated.Name, v1alpha1.ConditionRedisConnectionBudget)
			g.Expect(c.Status).To(Equal(metav1.ConditionTrue))
			g.Expect(c.Reason).To(Equal(v1alpha1.ReasonNoInjectedWorkloads))
			g.Expect(c.Message).NotTo(ContainSubstring("worst case"))
		}, timeout, interval).Should(Succeed())
		// The other conditions stay beside it.
		Eventually(func(g Gomega) {
			g.Expect(condition(g, ctx, shop, p.Name, v1alpha1.ConditionProgrammed).Status).To(Equal(metav1.ConditionTrue))
		}, timeout, interval).Should(Succeed())

		By("scaling back down")
		Expect(k8s.Get(ctx, client.ObjectKeyFromObject(hpa), hpa)).To(Succeed())
		hpa.Spec.MaxReplicas = 5
		Expect(k8s.Update(ctx, hpa)).To(Succeed())
		Eventually(func(g Gomega) {
			c := condition(g, ctx, shop, p.Name, v1alpha1.ConditionRedisConnectionBudget)
			g.Expect(c.Status).To(Equal(metav1.ConditionTrue))
			g.Expect(c.Reason).To(Equal(v1alpha1.ReasonWithinBudget))
			g.Expect(c.Message).To(HaveSuffix("checkout 5 x 8"))
			g.Expect(eventsAbout(g, ctx, shop, "HorizontalPodAutoscaler", "checkout")).To(ContainElement(
				HavePrefix("Normal/" + v1alpha1.ReasonWithinBudget + ": Redis connections are within the namespace's share again")))
			g.Expect(gauge(g, "redline_redis_connections_worst_case", onDefault)).To(Equal(76.0))
		}, timeout, interval).Should(Succeed())

		By("a Deployment without an HPA counts at spec.replicas, with the pool the injector gives it: 186 / 2 / 11 = 8")
		Expect(k8s.Get(ctx, client.ObjectKeyFromObject(search), search)).To(Succeed())
		search.Spec.Replicas = ptr.To[int32](11)
		Expect(k8s.Update(ctx, search)).To(Succeed())
		Eventually(func(g Gomega) {
			g.Expect(gauge(g, "redline_redis_workload_connections_worst_case",
				map[string]string{"namespace": shop, "name": "search"})).To(Equal(88.0))
			g.Expect(gauge(g, "redline_redis_connections_worst_case", onDefault)).To(Equal(132.0))
			g.Expect(condition(g, ctx, shop, p.Name, v1alpha1.ConditionRedisConnectionBudget).Reason).To(Equal(v1alpha1.ReasonWithinBudget))
		}, timeout, interval).Should(Succeed())

		By("its annotation forcing the default pool: 11 x 16 pushes it over")
		Expect(k8s.Get(ctx, client.ObjectKeyFromObject(search), search)).To(Succeed())
		search.Spec.Template.Annotations[contract.AnnotationRedisPoolSize] = "16"
		Expect(k8s.Update(ctx, search)).To(Succeed())
		Eventually(func(g Gomega) {
			c := condition(g, ctx, shop, p.Name, v1alpha1.ConditionRedisConnectionBudget)
			g.Expect(c.Reason).To(Equal(v1alpha1.ReasonOverBudget))
			g.Expect(c.Message).To(ContainSubstring("worst case 216"))
			g.Expect(eventsAbout(g, ctx, shop, "Deployment", "search")).To(ContainElement(
				HavePrefix("Warning/" + v1alpha1.ReasonOverBudget + ": Deployment " + shop + "/search at 11 replicas x 16")))
		}, timeout, interval).Should(Succeed())
		Expect(k8s.Delete(ctx, search)).To(Succeed())
		Eventually(func(g Gomega) {
			c := condition(g, ctx, shop, p.Name, v1alpha1.ConditionRedisConnectionBudget)
			g.Expect(c.Reason).To(Equal(v1alpha1.ReasonWithinBudget))
			g.Expect(gauge(g, "redline_redis_connections_worst_case", onDefault)).To(Equal(44.0))
			g.Expect(strings.Contains(c.Message, "search")).To(BeFalse())
		}, timeout, interval).Should(Succeed())
	})

	It("counts a StatefulSet at its HPA's maxReplicas", func(ctx SpecContext) {
		ns := newNamespace(ctx)
		d := injectedDeployment(ns, "ledger", 3, "4")
		set := &appsv1.StatefulSet{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "ledger"},
			Spec: appsv1.StatefulSetSpec{
				Replicas: d.Spec.Replicas, Selector: d.Spec.Selector, Template: d.Spec.Template, ServiceName: "ledger",
			},
		}
		Expect(k8s.Create(ctx, set)).To(Succeed())
		hpa := hpaFor(d, 6)
		hpa.Spec.ScaleTargetRef.Kind = "StatefulSet"
		Expect(k8s.Create(ctx, hpa)).To(Succeed())
		DeferCleanup(func(ctx context.Context) {
			for _, o := range []client.Object{hpa, set} {
				Expect(client.IgnoreNotFound(k8s.Delete(ctx, o))).To(Succeed())
			}
		})
		p := policy(ns, "ledger-limit", 100)
		p.Spec.TargetSelector.MatchLabels = map[string]string{"app": "ledger"}
		Expect(k8s.Create(ctx, p)).To(Succeed())

		Eventually(func(g Gomega) {
			c := condition(g, ctx, ns, p.Name, v1alpha1.ConditionRedisConnectionBudget)
			g.Expect(c.Reason).To(Equal(v1alpha1.ReasonWithinBudget))
			g.Expect(c.Message).To(HaveSuffix("this policy's workloads at maxReplicas x pool: StatefulSet " + ns + "/ledger 6 x 4"))
			g.Expect(gauge(g, "redline_redis_workload_connections_worst_case",
				map[string]string{"namespace": ns, "kind": "StatefulSet", "name": "ledger"})).To(Equal(24.0))
		}, timeout, interval).Should(Succeed())
	})
})
