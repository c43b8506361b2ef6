package controller_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"math"
	"net/http"
	"runtime"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/redline-dev/redline/api/v1alpha1"
	"github.com/redline-dev/redline/internal/controller/loop"
	"github.com/redline-dev/redline/internal/controller/policies"
	"github.com/redline-dev/redline/internal/policydoc"
)

// emptyPolicies is a document of n empty policies: three bytes each, a decoded struct each, and
// a re-marshalled object each for a hash check.
func emptyPolicies(n int) []byte {
	var b bytes.Buffer
	b.WriteString(`{"version":1,"namespace":"x","hash":"","scripts":{},"policies":[`)
	b.WriteString(strings.Repeat("{},", n))
	b.WriteString("{}]}")
	return b.Bytes()
}

func gzipped(data []byte) []byte {
	var b bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&b, gzip.BestCompression)
	_, _ = zw.Write(data)
	_ = zw.Close()
	return b.Bytes()
}

// configMapMeta reads only the ConfigMap's metadata, so that polling it allocates next to
// nothing in this process, whose allocations the spec measures.
func configMapMeta(g Gomega, ctx context.Context, ns string) *metav1.PartialObjectMetadata {
	m := &metav1.PartialObjectMetadata{}
	m.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("ConfigMap"))
	g.Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: policydoc.ConfigMapName}, m)).To(Succeed())
	return m
}

var _ = Describe("A tenant cannot reach the manager", func() {
	// Issue 18, 1: 4,212 bytes of gzip in a tenant's own ConfigMap drove the manager to
	// 1,059 MiB of heap, a 1 MiB plain document to 275 MiB: the reconciler decompressed and
	// parsed whatever was there. Now it compares digests of what it would write, and reads
	// content back only for an invalid update, bounded and vouched for before it is parsed.
	DescribeTable("rewrites a tenant's ConfigMap without decoding what the tenant put there",
		func(ctx SpecContext, plain, compressed []byte) {
			ns := newNamespace(ctx)
			Expect(k8s.Create(ctx, policy(ns, "p", 100))).To(Succeed())
			Expect(k8s.Create(ctx, policy(ns, "kept", 100))).To(Succeed())
			expectProgrammed(ctx, ns, "p")
			expectProgrammed(ctx, ns, "kept")
			// An invalid update of "kept" makes every reconcile read back the document in
			// force for its last accepted generation.
			Expect(retry.RetryOnConflict(retry.DefaultRetry, func() error {
				var k v1alpha1.RateLimitPolicy
				if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "kept"}, &k); err != nil {
					return err
				}
				k.Spec.TargetSelector = metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
					{Key: "app", Operator: metav1.LabelSelectorOpExists, Values: []string{"x"}},
				}}
				return k8s.Update(ctx, &k)
			})).To(Succeed())
			Eventually(func(g Gomega) {
				g.Expect(condition(g, ctx, ns, "kept", v1alpha1.ConditionProgrammed).Message).To(ContainSubstring("generation 1 stays"))
			}, timeout, interval).Should(Succeed())
			var hash string
			Eventually(func(g Gomega) {
				doc, _ := document(g, ctx, ns)
				hash = doc.Hash
			}, timeout, interval).Should(Succeed())

			runtime.GC()
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			const rounds = 3
			for range rounds {
				var written string
				Expect(retry.RetryOnConflict(retry.DefaultRetry, func() error {
					var cm corev1.ConfigMap
					if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: policydoc.ConfigMapName}, &cm); err != nil {
						return err
					}
					cm.Data, cm.BinaryData = nil, nil
					if plain != nil {
						cm.Data = map[string]string{policydoc.DataKey: string(plain)}
					} else {
						cm.BinaryData = map[string][]byte{policydoc.GzipDataKey: compressed}
					}
					err := k8s.Update(ctx, &cm)
					written = cm.ResourceVersion
					return err
				})).To(Succeed())
				Eventually(func(g Gomega) {
					m := configMapMeta(g, ctx, ns)
					g.Expect(m.ResourceVersion).NotTo(Equal(written), "the manager restores the ConfigMap")
				}, timeout, interval).Should(Succeed())
			}
			runtime.ReadMemStats(&after)
			alloc := after.TotalAlloc - before.TotalAlloc
			AddReportEntry("allocated in the manager's process over the rounds", fmt.Sprintf("%.1f MiB", float64(alloc)/(1<<20)))
			GinkgoWriter.Printf("%d rounds of a tenant's document: %.1f MiB allocated in this process\n", rounds, float64(alloc)/(1<<20))
			// The whole process is measured: the test itself writes and reads the document
			// (a few MiB each way, more the more often a loaded machine has it retry and
			// poll), and the suite's other controllers run beside it. Measured 21 MiB a round
			// on a quiet machine and 34 MiB at a load average of 25; the manager that decoded
			// what the tenant wrote spent 275 MiB a round on the 1 MB plain document and
			// 1,059 MiB on the gzip one. A bound per round between the two.
			Expect(alloc/rounds).To(BeNumerically("<", 64<<20), "allocated per round")

			doc, _ := document(Default, ctx, ns)
			Expect(doc.Hash).To(Equal(hash))
			Expect(policyNames(doc)).To(Equal([]string{"kept", "p"}), "the last accepted generation of kept is still enforced")
		},
		Entry("4 KiB of gzip that expands to 4 MiB of empty policies", nil, gzipped(emptyPolicies(4<<20/3))),
		Entry("a 1 MB plain document of empty policies", emptyPolicies(1000000/3), nil),
		Entry("a plain document within the size the manager reads, not one it wrote", emptyPolicies(700000/3), nil),
	)

	// Issue 18, 2: immutable: true on a tenant's ConfigMap failed every update, and three
	// failures made /readyz fail: the webhook left the Service.
	It("stays ready while a tenant's ConfigMap refuses updates, and says so on the tenant's policies", func(ctx SpecContext) {
		readyz := startManagerAs(ctx, "redline-ready-despite-tenants")
		binding := &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{GenerateName: "redline-ready-"},
			RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "cluster-admin"},
			Subjects:   []rbacv1.Subject{{Kind: "User", Name: "redline-ready-despite-tenants"}},
		}
		Expect(k8s.Create(ctx, binding)).To(Succeed())
		DeferCleanup(func(ctx context.Context) { _ = k8s.Delete(ctx, binding) })
		Eventually(readyz, timeout, interval).Should(Equal(http.StatusOK))

		ns := newNamespace(ctx)
		Expect(k8s.Create(ctx, policy(ns, "p", 100))).To(Succeed())
		expectProgrammed(ctx, ns, "p")
		Expect(retry.RetryOnConflict(retry.DefaultRetry, func() error {
			var cm corev1.ConfigMap
			if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: policydoc.ConfigMapName}, &cm); err != nil {
				return err
			}
			cm.Immutable = new(true)
			return k8s.Update(ctx, &cm)
		})).To(Succeed())
		Expect(retry.RetryOnConflict(retry.DefaultRetry, func() error {
			var p v1alpha1.RateLimitPolicy
			if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "p"}, &p); err != nil {
				return err
			}
			p.Spec.Rules[0].Limit.Requests = 200
			return k8s.Update(ctx, &p)
		})).To(Succeed())
		Eventually(func(g Gomega) {
			c := condition(g, ctx, ns, "p", v1alpha1.ConditionProgrammed)
			g.Expect(c.Status).To(Equal(metav1.ConditionFalse))
			g.Expect(c.Reason).To(Equal(v1alpha1.ReasonConfigMapError))
			g.Expect(c.Message).To(ContainSubstring("is immutable"))
			g.Expect(eventReasons(ctx, ns, "p")).To(ContainElement(v1alpha1.ReasonConfigMapError))
		}, timeout, interval).Should(Succeed())
		Consistently(readyz, 3*time.Second, interval).Should(Equal(http.StatusOK))

		By("an admission policy that refuses the ConfigMap")
		// envtest's API server admits ConfigMaps past a ResourceQuota (no quota controller
		// fills in its usage); a validating admission policy refuses them as a quota or a
		// tenant's webhook would.
		refused := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "rlp-refused-", Labels: map[string]string{"redline-test/refuse-configmaps": "true"}}}
		Expect(k8s.Create(ctx, refused)).To(Succeed())
		vap := &admissionregistrationv1.ValidatingAdmissionPolicy{
			ObjectMeta: metav1.ObjectMeta{GenerateName: "refuse-configmaps-"},
			Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
				FailurePolicy: ptr.To(admissionregistrationv1.Fail),
				MatchConstraints: &admissionregistrationv1.MatchResources{ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{{
					RuleWithOperations: admissionregistrationv1.RuleWithOperations{
						Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update},
						Rule:       admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"configmaps"}},
					},
				}}},
				Validations: []admissionregistrationv1.Validation{{Expression: "false", Message: "no ConfigMaps in this namespace"}},
			},
		}
		Expect(k8s.Create(ctx, vap)).To(Succeed())
		DeferCleanup(func(ctx context.Context) { _ = k8s.Delete(ctx, vap) })
		vapBinding := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{
			ObjectMeta: metav1.ObjectMeta{GenerateName: "refuse-configmaps-"},
			Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{
				PolicyName:        vap.Name,
				ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny},
				MatchResources: &admissionregistrationv1.MatchResources{NamespaceSelector: &metav1.LabelSelector{
					MatchLabels: map[string]string{"redline-test/refuse-configmaps": "true"},
				}},
			},
		}
		Expect(k8s.Create(ctx, vapBinding)).To(Succeed())
		DeferCleanup(func(ctx context.Context) { _ = k8s.Delete(ctx, vapBinding) })
		Eventually(func() error {
			return k8s.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: refused.Name, Name: "probe"}}, client.DryRunAll)
		}, timeout, interval).Should(HaveOccurred(), "the admission policy is in force")
		Expect(k8s.Create(ctx, policy(refused.Name, "q", 100))).To(Succeed())
		Eventually(func(g Gomega) {
			c := condition(g, ctx, refused.Name, "q", v1alpha1.ConditionProgrammed)
			g.Expect(c.Status).To(Equal(metav1.ConditionFalse))
			g.Expect(c.Reason).To(Equal(v1alpha1.ReasonConfigMapError))
			g.Expect(c.Message).To(ContainSubstring("the API server refused it"))
			g.Expect(c.Message).To(ContainSubstring("no ConfigMaps in this namespace"))
		}, timeout, interval).Should(Succeed())
		Consistently(readyz, 3*time.Second, interval).Should(Equal(http.StatusOK))

		By("deleting the immutable ConfigMap: the controller recreates it")
		Expect(k8s.Delete(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: policydoc.ConfigMapName}})).To(Succeed())
		Eventually(func(g Gomega) {
			doc, _ := document(g, ctx, ns)
			g.Expect(doc.Policies[0].Rules[0].Requests).To(BeEquivalentTo(200))
		}, timeout, interval).Should(Succeed())
		expectProgrammed(ctx, ns, "p")
	})

	// Issue 18, 3: every ConfigMap labelled managed-by=redline was cached whatever its name,
	// and workloads with their whole pod templates.
	It("caches only the ConfigMap it writes, without its content, and workloads without their pod specs", func(ctx SpecContext) {
		ns := newNamespace(ctx)
		Expect(k8s.Create(ctx, policy(ns, "p", 100))).To(Succeed())
		expectProgrammed(ctx, ns, "p")
		other := &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "other", Labels: map[string]string{loop.ManagedByLabel: loop.ManagedByValue}},
			Data:       map[string]string{"big": strings.Repeat("x", 512<<10)},
		}
		Expect(k8s.Create(ctx, other)).To(Succeed())
		d := injectedDeployment(ns, "web", 1, "")
		d.Annotations = map[string]string{"kubectl.kubernetes.io/last-applied-configuration": strings.Repeat("y", 64<<10)}
		d.Spec.Template.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "BIG", Value: strings.Repeat("z", 64<<10)}}
		Expect(k8s.Create(ctx, d)).To(Succeed())
		DeferCleanup(func(ctx context.Context) { _ = k8s.Delete(ctx, d) })

		Eventually(func(g Gomega) {
			var cached appsv1.Deployment
			g.Expect(mgrCache.Get(ctx, client.ObjectKeyFromObject(d), &cached)).To(Succeed())
			g.Expect(cached.Annotations).To(BeEmpty())
			g.Expect(cached.Spec.Template.Spec.Containers).To(BeEmpty())
			g.Expect(cached.Spec.Template.Annotations).To(HaveKeyWithValue("redline.dev/inject", "true"))
			g.Expect(cached.Spec.Template.Labels).To(Equal(d.Spec.Template.Labels))
			g.Expect(*cached.Spec.Replicas).To(BeEquivalentTo(1))

			var cm corev1.ConfigMap
			g.Expect(mgrCache.Get(ctx, client.ObjectKey{Namespace: ns, Name: policydoc.ConfigMapName}, &cm)).To(Succeed())
			g.Expect(cm.Data).To(BeNil())
			g.Expect(cm.BinaryData).To(BeNil())
			g.Expect(cm.Labels).To(HaveKeyWithValue(loop.ManagedByLabel, loop.ManagedByValue))
		}, timeout, interval).Should(Succeed())
		var list corev1.ConfigMapList
		Expect(mgrCache.List(ctx, &list, client.InNamespace(ns))).To(Succeed())
		names := []string{}
		for _, cm := range list.Items {
			names = append(names, cm.Name)
		}
		Expect(names).To(Equal([]string{policydoc.ConfigMapName}), "another ConfigMap with the label stays out of the cache")
	})

	// Measures the manager's memory per cached object for docs/design/tenant-isolation.md: n Deployments, each with
	// 32 KiB of what a tenant can grow (an annotation, an env value in the pod template).
	It("holds a few KiB per cached workload or ConfigMap, whatever its size", func(ctx SpecContext) {
		ns := newNamespace(ctx)
		const n = 300
		// The live heap, as the least of several readings after a GC: the manager's reconcilers
		// run beside the measure, and what one of them holds in flight at the instant of a
		// reading (a list being copied) is not what the cache keeps.
		heap := func() uint64 {
			least := uint64(math.MaxUint64)
			for range 8 {
				runtime.GC()
				var m runtime.MemStats
				runtime.ReadMemStats(&m)
				least = min(least, m.HeapAlloc)
				time.Sleep(50 * time.Millisecond)
			}
			return least
		}
		before := heap()
		var made []client.Object
		for i := range n {
			d := injectedDeployment(ns, fmt.Sprintf("w-%03d", i), 0, "")
			d.Annotations = map[string]string{"note": strings.Repeat("y", 16<<10)}
			d.Spec.Template.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "BIG", Value: strings.Repeat("z", 16<<10)}}
			Expect(k8s.Create(ctx, d)).To(Succeed())
			// Only the name: this process's heap is what is measured.
			made = append(made, &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: d.Name}})
		}
		DeferCleanup(func(ctx context.Context) {
			for _, o := range made {
				_ = k8s.Delete(ctx, o)
			}
		})
		Eventually(func(g Gomega) {
			var list appsv1.DeploymentList
			g.Expect(mgrCache.List(ctx, &list, client.InNamespace(ns))).To(Succeed())
			g.Expect(list.Items).To(HaveLen(n))
		}, timeout, interval).Should(Succeed())
		grown := int64(heap()) - int64(before)
		perObject := grown / n
		AddReportEntry("manager heap per cached Deployment", fmt.Sprintf("%d bytes (%d objects, 32 KiB of tenant bytes each)", perObject, n))
		GinkgoWriter.Printf("manager heap per cached Deployment with 32 KiB of tenant bytes: %d bytes\n", perObject)
		Expect(perObject).To(BeNumerically("<", 8<<10), "a cached Deployment keeps none of the 32 KiB")

		// ConfigMaps named redline-policies, each in its own namespace (one per namespace is all
		// a tenant can get cached), with 128 KiB of content each; not labelled, so that no
		// reconcile deletes them.
		const namespaces = 100
		before = heap()
		for range namespaces {
			other := newNamespace(ctx)
			cm := &corev1.ConfigMap{
				ObjectMeta: metav1.ObjectMeta{Namespace: other, Name: policydoc.ConfigMapName},
				Data:       map[string]string{policydoc.DataKey: strings.Repeat("c", 128<<10)},
			}
			Expect(k8s.Create(ctx, cm)).To(Succeed())
			made = append(made, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: other, Name: policydoc.ConfigMapName}})
		}
		Eventually(func(g Gomega) {
			var list corev1.ConfigMapList
			g.Expect(mgrCache.List(ctx, &list)).To(Succeed())
			n := 0
			for _, cm := range list.Items {
				if cm.Annotations[policies.HashAnnotation] == "" && cm.Labels[loop.ManagedByLabel] == "" {
					n++
				}
			}
			g.Expect(n).To(BeNumerically(">=", namespaces))
		}, timeout, interval).Should(Succeed())
		perConfigMap := (int64(heap()) - int64(before)) / namespaces
		AddReportEntry("manager heap per cached ConfigMap", fmt.Sprintf("%d bytes (128 KiB of content each)", perConfigMap))
		GinkgoWriter.Printf("manager heap per cached ConfigMap with 128 KiB of content: %d bytes\n", perConfigMap)
		Expect(perConfigMap).To(BeNumerically("<", 16<<10), "a cached ConfigMap keeps none of its 128 KiB")
	})

	// Issue 18, 4: gzip let up to ~118 MiB of JSON into a 1 MiB ConfigMap, and a 400-policy
	// document needed a 43 MiB heap in a sidecar limited to 64Mi.
	It("does not write a document larger than the sidecar loads, and keeps the last good one", func(ctx SpecContext) {
		ns := newNamespace(ctx)
		Expect(k8s.Create(ctx, policy(ns, "small", 10))).To(Succeed())
		expectProgrammed(ctx, ns, "small")
		var inForce string
		Eventually(func(g Gomega) {
			doc, _ := document(g, ctx, ns)
			inForce = doc.Hash
		}, timeout, interval).Should(Succeed())

		// 32 rules of 16 headers of 1,600 bytes: over 768 KiB of JSON that compresses to a
		// few KiB, which the controller used to write.
		wide := policy(ns, "wide", 10)
		wide.Spec.Rules = nil
		for i := range 32 {
			r := policy(ns, "x", 10).Spec.Rules[0]
			r.Name = fmt.Sprintf("r%d", i)
			for j := range 16 {
				v := strings.Repeat("v", 1600)
				r.Match.Headers = append(r.Match.Headers, v1alpha1.HeaderMatch{Name: fmt.Sprintf("X-H%d", j), Value: &v})
			}
			wide.Spec.Rules = append(wide.Spec.Rules, r)
		}
		Expect(k8s.Create(ctx, wide)).To(Succeed())
		Eventually(func(g Gomega) {
			c := condition(g, ctx, ns, "wide", v1alpha1.ConditionProgrammed)
			g.Expect(c.Status).To(Equal(metav1.ConditionFalse))
			g.Expect(c.Reason).To(Equal(v1alpha1.ReasonDocumentTooLarge))
			g.Expect(c.Message).To(ContainSubstring(fmt.Sprintf("over the %d bytes a sidecar loads within its default memory limit", policydoc.MaxDocumentBytes)))
			g.Expect(c.Message).To(ContainSubstring("keeps the last configuration that fit (hash %.12s) in force", inForce))
			g.Expect(c.Message).To(ContainSubstring("these policies do not fit (the oldest are kept first): wide."))
			g.Expect(condition(g, ctx, ns, "small", v1alpha1.ConditionProgrammed).Reason).To(Equal(v1alpha1.ReasonDocumentTooLarge))
		}, timeout, interval).Should(Succeed())
		Consistently(func(g Gomega) {
			doc, _ := document(g, ctx, ns)
			g.Expect(doc.Hash).To(Equal(inForce))
		}, time.Second, interval).Should(Succeed())
		Expect(k8s.Delete(ctx, wide)).To(Succeed())
		expectProgrammed(ctx, ns, "small")
	})

	// Issue 18, 9 and 10: 100 empty Deployments in one namespace cut a 50-replica victim's
	// pool to 2, and the budget condition named other tenants' workloads and the cluster's
	// total in every policy.
	It("keeps one namespace's workloads out of another's pools, status and Events", func(ctx SpecContext) {
		attacker, victim := newNamespace(ctx), newNamespace(ctx)
		api := injectedDeployment(victim, "api", 5, "")
		Expect(k8s.Create(ctx, api)).To(Succeed())
		apiRS := replicaSetOf(api)
		Expect(k8s.Create(ctx, apiRS)).To(Succeed())
		vp := policy(victim, "api-limit", 100)
		vp.Spec.TargetSelector.MatchLabels = map[string]string{"app": "api"}
		Expect(k8s.Create(ctx, vp)).To(Succeed())
		made := []client.Object{apiRS, api}
		DeferCleanup(func(ctx context.Context) {
			for _, o := range made {
				_ = k8s.Delete(ctx, o)
			}
		})
		var alone string
		Eventually(func(g Gomega) {
			pool, _ := admitPod(g, ctx, apiRS)
			g.Expect(pool).To(Equal("16"), "(200 - 14) / 5 replicas, capped")
			c := condition(g, ctx, victim, vp.Name, v1alpha1.ConditionRedisConnectionBudget)
			g.Expect(c.Reason).To(Equal(v1alpha1.ReasonWithinBudget))
			alone = c.Message
		}, timeout, interval).Should(Succeed())

		By("the attacker: 100 empty Deployments and one with an absurd maxReplicas")
		for i := range 100 {
			d := injectedDeployment(attacker, fmt.Sprintf("empty-%03d", i), 0, "")
			Expect(k8s.Create(ctx, d)).To(Succeed())
			made = append(made, d)
		}
		huge := injectedDeployment(attacker, "huge", 1, "")
		Expect(k8s.Create(ctx, huge)).To(Succeed())
		hugeHPA := hpaFor(huge, 100000)
		Expect(k8s.Create(ctx, hugeHPA)).To(Succeed())
		ap := policy(attacker, "huge-limit", 100)
		ap.Spec.TargetSelector.MatchLabels = map[string]string{"app": "huge"}
		Expect(k8s.Create(ctx, ap)).To(Succeed())
		made = append(made, hugeHPA, huge)

		// Once a budget pass has counted the attacker's workloads:
		Eventually(func(g Gomega) {
			c := condition(g, ctx, attacker, ap.Name, v1alpha1.ConditionRedisConnectionBudget)
			g.Expect(c.Reason).To(Equal(v1alpha1.ReasonOverBudget), "the absurd maxReplicas is the attacker's own problem")
			g.Expect(c.Message).To(ContainSubstring("huge 100000 x 2"))
		}, timeout, interval).Should(Succeed())
		pool, _ := admitPod(Default, ctx, apiRS)
		Expect(pool).To(Equal("16"), "(200 - 14) / 2 namespaces / 5 replicas, capped: the empty Deployments count for nothing")
		Eventually(func(g Gomega) {
			c := condition(g, ctx, attacker, ap.Name, v1alpha1.ConditionRedisConnectionBudget)
			g.Expect(c.Message).To(HavePrefix("namespace " + attacker + "'s worst case 200,000 connections per Redis node at maxReplicas (deployment huge 100000 x 2)"))
			g.Expect(eventsAbout(g, ctx, attacker, "HorizontalPodAutoscaler", "huge")).To(ContainElement(HavePrefix("Warning/" + v1alpha1.ReasonOverBudget)))
		}, timeout, interval).Should(Succeed())
		Consistently(func(g Gomega) {
			c := condition(g, ctx, victim, vp.Name, v1alpha1.ConditionRedisConnectionBudget)
			g.Expect(c.Reason).To(Equal(v1alpha1.ReasonWithinBudget))
			g.Expect(c.Message).To(Equal(alone), "nothing of the attacker's reaches the victim's status")
			g.Expect(c.Message).NotTo(ContainSubstring(attacker))
			for _, kind := range []string{"HorizontalPodAutoscaler", "Deployment"} {
				for _, e := range eventsAbout(g, ctx, attacker, kind, "huge") {
					g.Expect(e).NotTo(ContainSubstring(victim), "the attacker's Events name nothing of the victim's")
				}
			}
		}, 2*time.Second, interval).Should(Succeed())
		Expect(apierrors.IsNotFound(k8s.Get(ctx, client.ObjectKey{Namespace: victim, Name: "huge"}, &appsv1.Deployment{}))).To(BeTrue())

		By("the attacker churning its HPA rewrites nothing of the victim's")
		var settled v1alpha1.RateLimitPolicy
		Expect(k8s.Get(ctx, client.ObjectKeyFromObject(vp), &settled)).To(Succeed())
		for i := range 10 {
			setMaxReplicas(ctx, huge, int32(100000+i))
		}
		Eventually(func(g Gomega) {
			c := condition(g, ctx, attacker, ap.Name, v1alpha1.ConditionRedisConnectionBudget)
			g.Expect(c.Message).To(ContainSubstring("huge 100009 x 2"))
		}, timeout, interval).Should(Succeed())
		Consistently(func(g Gomega) {
			var now v1alpha1.RateLimitPolicy
			g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(vp), &now)).To(Succeed())
			g.Expect(now.ResourceVersion).To(Equal(settled.ResourceVersion), "the victim's policy is not written")
		}, 2*time.Second, interval).Should(Succeed())
	})
})
