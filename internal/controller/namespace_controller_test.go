package controller_test

import (
	"context"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/redline-dev/redline/api/v1alpha1"
	"github.com/redline-dev/redline/internal/fleet"
	"github.com/redline-dev/redline/internal/limiter"
	"github.com/redline-dev/redline/internal/limiter/scripts"
	"github.com/redline-dev/redline/internal/policydoc"
)

const (
	timeout  = 20 * time.Second
	interval = 100 * time.Millisecond
)

func newNamespace(ctx context.Context) string {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "rlp-"}}
	Expect(k8s.Create(ctx, ns)).To(Succeed())
	return ns.Name
}

// document reads and parses the namespace's compiled ConfigMap.
func document(g Gomega, ctx context.Context, ns string) (*policydoc.Document, *corev1.ConfigMap) {
	var cm corev1.ConfigMap
	g.Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: policydoc.ConfigMapName}, &cm)).To(Succeed())
	data := []byte(cm.Data[policydoc.DataKey])
	if gz, ok := cm.BinaryData[policydoc.GzipDataKey]; ok {
		var err error
		data, err = policydoc.Decompress(gz)
		g.Expect(err).NotTo(HaveOccurred())
	}
	doc, err := policydoc.Parse(data)
	g.Expect(err).NotTo(HaveOccurred())
	return doc, &cm
}

func policyNames(doc *policydoc.Document) []string {
	var out []string
	for _, p := range doc.Policies {
		out = append(out, p.Name)
	}
	return out
}

func condition(g Gomega, ctx context.Context, ns, name, typ string) *metav1.Condition {
	var p v1alpha1.RateLimitPolicy
	g.Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &p)).To(Succeed())
	c := meta.FindStatusCondition(p.Status.Conditions, typ)
	g.Expect(c).NotTo(BeNil(), "condition %s missing on %s/%s", typ, ns, name)
	return c
}

// expectProgrammed waits until the policy's status describes its current generation with
// Accepted and Programmed true.
func expectProgrammed(ctx context.Context, ns, name string) *v1alpha1.RateLimitPolicy {
	var p v1alpha1.RateLimitPolicy
	Eventually(func(g Gomega) {
		g.Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &p)).To(Succeed())
		g.Expect(p.Status.ObservedGeneration).To(Equal(p.Generation))
		for _, t := range []string{v1alpha1.ConditionAccepted, v1alpha1.ConditionProgrammed} {
			c := meta.FindStatusCondition(p.Status.Conditions, t)
			g.Expect(c).NotTo(BeNil())
			g.Expect(c.Status).To(Equal(metav1.ConditionTrue), "%s: %s %s", t, c.Reason, c.Message)
			g.Expect(c.ObservedGeneration).To(Equal(p.Generation))
		}
	}, timeout, interval).Should(Succeed())
	return &p
}

var _ = Describe("RateLimitPolicy controller", func() {
	var ctx context.Context
	BeforeEach(func() { ctx = context.Background() })

	It("compiles a policy into the namespace ConfigMap, loads its scripts and reports Programmed", func() {
		ns := newNamespace(ctx)
		Expect(k8s.Create(ctx, policy(ns, "checkout", 100))).To(Succeed())
		p := expectProgrammed(ctx, ns, "checkout")

		var doc *policydoc.Document
		Eventually(func(g Gomega) {
			var cm *corev1.ConfigMap
			doc, cm = document(g, ctx, ns)
			g.Expect(cm.Annotations).To(HaveKeyWithValue("redline.dev/config-hash", doc.Hash))
			g.Expect(cm.Labels).To(HaveKeyWithValue("app.kubernetes.io/managed-by", "redline"))
		}, timeout, interval).Should(Succeed())
		Expect(doc.Namespace).To(Equal(ns))
		Expect(doc.Policies).To(HaveLen(1))
		rule := doc.Policies[0].Rules[0]
		Expect(rule.Requests).To(BeEquivalentTo(100))
		Expect(rule.WindowMS).To(BeEquivalentTo(60000))
		Expect(rule.Key).To(Equal([]policydoc.KeyPart{{Header: "x-api-key"}}))
		Expect(doc.Policies[0].FailureMode).To(Equal("LocalFallback"), "the API server defaults failureMode")
		Expect(p.Status.ConfigHash).To(Equal(doc.Hash))

		sw, _ := scripts.For(string(limiter.SlidingWindowCounter))
		Expect(p.Status.Scripts).To(Equal([]v1alpha1.ScriptStatus{{Algorithm: v1alpha1.SlidingWindowCounter, SHA: sw.SHA}}))
		Expect(doc.Scripts).To(HaveKeyWithValue("SlidingWindowCounter", sw.SHA))
		for _, s := range scripts.All() {
			Expect(rdb.ScriptExists(ctx, s.SHA).Val()).To(Equal([]bool{true}), "script %s in redis", s.Name)
		}
		enforced := condition(Default, ctx, ns, "checkout", v1alpha1.ConditionEnforced)
		Expect(enforced.Status).To(Equal(metav1.ConditionUnknown))
		Expect(enforced.Reason).To(Equal("NoSidecars"))
	})

	It("reports Enforced from the sidecars' heartbeats", func() {
		ns := newNamespace(ctx)
		Expect(k8s.Create(ctx, policy(ns, "p", 100))).To(Succeed())
		p := expectProgrammed(ctx, ns, "p")

		// Sidecars announce themselves with fleet.Announce; two apply the current document.
		for _, pod := range []string{"pod-a", "pod-b"} {
			_, err := fleet.Announce(ctx, rdb, ns, pod, p.Status.ConfigHash, 10*time.Second, []string{"p"})
			Expect(err).NotTo(HaveOccurred())
		}
		Eventually(func(g Gomega) {
			c := condition(g, ctx, ns, "p", v1alpha1.ConditionEnforced)
			g.Expect(c.Status).To(Equal(metav1.ConditionTrue), c.Message)
			g.Expect(c.Message).To(ContainSubstring("2 of 2 live sidecars"))
		}, timeout, interval).Should(Succeed())

		// A third still applies an older document.
		_, err := fleet.Announce(ctx, rdb, ns, "pod-c", "0123456789abcdef", 10*time.Second, []string{"p"})
		Expect(err).NotTo(HaveOccurred())
		Eventually(func(g Gomega) {
			c := condition(g, ctx, ns, "p", v1alpha1.ConditionEnforced)
			g.Expect(c.Status).To(Equal(metav1.ConditionFalse))
			g.Expect(c.Reason).To(Equal("Propagating"))
			g.Expect(c.Message).To(ContainSubstring("2 of 3"))
			g.Expect(c.Message).To(ContainSubstring("pod-c"))
		}, timeout, interval).Should(Succeed())
	})

	It("records a Warning Event when the sidecars say Redis lost counts of a policy", func() {
		ns := newNamespace(ctx)
		Expect(k8s.Create(ctx, policy(ns, "p", 100))).To(Succeed())
		p := expectProgrammed(ctx, ns, "p")
		beat := func(lost bool) {
			GinkgoHelper()
			_, err := fleet.Beat(ctx, rdb, ns, "pod-a", p.Status.ConfigHash, 10*time.Second, []string{"p"}, lost)
			Expect(err).NotTo(HaveOccurred())
		}
		beat(false)
		Eventually(func(g Gomega) {
			g.Expect(condition(g, ctx, ns, "p", v1alpha1.ConditionEnforced).Status).To(Equal(metav1.ConditionTrue))
		}, timeout, interval).Should(Succeed())
		// A few resyncs with nothing lost: no Event.
		Consistently(func() []string { return eventReasons(ctx, ns, "p") }, time.Second, interval).
			ShouldNot(ContainElement(v1alpha1.ReasonRedisLostCounts))

		beat(true) // a sidecar found Redis short of its shares and restored them
		Eventually(func() []string { return eventReasons(ctx, ns, "p") }, timeout, interval).
			Should(ContainElement(v1alpha1.ReasonRedisLostCounts))
	})

	It("updates the ConfigMap and its hash when a policy changes, and deletes it with the last policy", func() {
		ns := newNamespace(ctx)
		Expect(k8s.Create(ctx, policy(ns, "a", 100))).To(Succeed())
		Expect(k8s.Create(ctx, policy(ns, "b", 50))).To(Succeed())
		expectProgrammed(ctx, ns, "a")
		expectProgrammed(ctx, ns, "b")
		var first *policydoc.Document
		Eventually(func(g Gomega) {
			first, _ = document(g, ctx, ns)
			g.Expect(policyNames(first)).To(Equal([]string{"a", "b"}))
		}, timeout, interval).Should(Succeed())

		edit(ctx, policyRef(ns, "a"), func(a *v1alpha1.RateLimitPolicy) { a.Spec.Rules[0].Limit.Requests = 200 })
		updated := expectProgrammed(ctx, ns, "a")
		Expect(updated.Generation).To(BeEquivalentTo(2))
		Eventually(func(g Gomega) {
			doc, _ := document(g, ctx, ns)
			g.Expect(doc.Hash).NotTo(Equal(first.Hash))
			g.Expect(doc.Policies[0].Rules[0].Requests).To(BeEquivalentTo(200))
			g.Expect(doc.Policies[0].Generation).To(BeEquivalentTo(2))
			g.Expect(doc.Policies[1]).To(Equal(first.Policies[1]), "policy b is untouched by a's update")
		}, timeout, interval).Should(Succeed())
		Eventually(func(g Gomega) {
			doc, _ := document(g, ctx, ns)
			var b v1alpha1.RateLimitPolicy
			g.Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "b"}, &b)).To(Succeed())
			g.Expect(b.Status.ConfigHash).To(Equal(doc.Hash), "every policy reports the hash of the document holding it")
		}, timeout, interval).Should(Succeed())

		Expect(k8s.Delete(ctx, policy(ns, "a", 0))).To(Succeed())
		Eventually(func(g Gomega) {
			doc, _ := document(g, ctx, ns)
			g.Expect(policyNames(doc)).To(Equal([]string{"b"}))
		}, timeout, interval).Should(Succeed())

		Expect(k8s.Delete(ctx, policy(ns, "b", 0))).To(Succeed())
		Eventually(func() bool {
			err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: policydoc.ConfigMapName}, &corev1.ConfigMap{})
			return apierrors.IsNotFound(err)
		}, timeout, interval).Should(BeTrue(), "the ConfigMap goes with the last policy")
	})

	It("keeps namespaces apart", func() {
		ns1, ns2 := newNamespace(ctx), newNamespace(ctx)
		Expect(k8s.Create(ctx, policy(ns1, "same-name", 10))).To(Succeed())
		Expect(k8s.Create(ctx, policy(ns2, "same-name", 20))).To(Succeed())
		expectProgrammed(ctx, ns1, "same-name")
		expectProgrammed(ctx, ns2, "same-name")
		Eventually(func(g Gomega) {
			d1, _ := document(g, ctx, ns1)
			d2, _ := document(g, ctx, ns2)
			g.Expect(d1.Namespace).To(Equal(ns1))
			g.Expect(d2.Namespace).To(Equal(ns2))
			g.Expect(d1.Policies[0].Rules[0].Requests).To(BeEquivalentTo(10))
			g.Expect(d2.Policies[0].Rules[0].Requests).To(BeEquivalentTo(20))
		}, timeout, interval).Should(Succeed())

		Expect(k8s.Delete(ctx, policy(ns1, "same-name", 0))).To(Succeed())
		Eventually(func() bool {
			return apierrors.IsNotFound(k8s.Get(ctx, client.ObjectKey{Namespace: ns1, Name: policydoc.ConfigMapName}, &corev1.ConfigMap{}))
		}, timeout, interval).Should(BeTrue())
		Consistently(func(g Gomega) {
			d2, _ := document(g, ctx, ns2)
			g.Expect(policyNames(d2)).To(Equal([]string{"same-name"}))
		}, time.Second, interval).Should(Succeed())
	})

	It("refuses a policy the compiler rejects while the other policies of the namespace keep working", func() {
		ns := newNamespace(ctx)
		Expect(k8s.Create(ctx, policy(ns, "good", 100))).To(Succeed())
		bad := policy(ns, "bad-selector", 100)
		// The API server does not validate label selectors inside custom resources.
		bad.Spec.TargetSelector = metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
			{Key: "app", Operator: metav1.LabelSelectorOpIn},
		}}
		Expect(k8s.Create(ctx, bad)).To(Succeed())

		expectProgrammed(ctx, ns, "good")
		Eventually(func(g Gomega) {
			c := condition(g, ctx, ns, "bad-selector", v1alpha1.ConditionAccepted)
			g.Expect(c.Status).To(Equal(metav1.ConditionFalse))
			g.Expect(c.Reason).To(Equal("Invalid"))
			g.Expect(c.Message).To(ContainSubstring("spec.targetSelector"))
			g.Expect(condition(g, ctx, ns, "bad-selector", v1alpha1.ConditionProgrammed).Status).To(Equal(metav1.ConditionFalse))
		}, timeout, interval).Should(Succeed())
		Eventually(func(g Gomega) {
			doc, _ := document(g, ctx, ns)
			g.Expect(policyNames(doc)).To(Equal([]string{"good"}))
		}, timeout, interval).Should(Succeed())
		Eventually(func(g Gomega) {
			g.Expect(eventReasons(ctx, ns, "bad-selector")).To(ContainElement("Invalid"))
		}, timeout, interval).Should(Succeed())
	})

	It("keeps the last accepted generation enforced when an update is invalid", func() {
		ns := newNamespace(ctx)
		Expect(k8s.Create(ctx, policy(ns, "p", 100))).To(Succeed())
		expectProgrammed(ctx, ns, "p")

		edit(ctx, policyRef(ns, "p"), func(p *v1alpha1.RateLimitPolicy) {
			p.Spec.TargetSelector = metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
				{Key: "app", Operator: metav1.LabelSelectorOpExists, Values: []string{"x"}},
			}}
			p.Spec.Rules[0].Limit.Requests = 5
		})

		Eventually(func(g Gomega) {
			c := condition(g, ctx, ns, "p", v1alpha1.ConditionProgrammed)
			g.Expect(c.Reason).To(Equal("Invalid"))
			g.Expect(c.ObservedGeneration).To(BeEquivalentTo(2))
			g.Expect(c.Message).To(ContainSubstring("generation 1 stays"))
		}, timeout, interval).Should(Succeed())
		doc, _ := document(Default, ctx, ns)
		Expect(doc.Policies).To(HaveLen(1))
		Expect(doc.Policies[0].Generation).To(BeEquivalentTo(1))
		Expect(doc.Policies[0].Rules[0].Requests).To(BeEquivalentTo(100))
	})

	It("restores the managed ConfigMap when someone deletes or edits it", func() {
		ns := newNamespace(ctx)
		Expect(k8s.Create(ctx, policy(ns, "p", 100))).To(Succeed())
		expectProgrammed(ctx, ns, "p")
		var doc *policydoc.Document
		var cm *corev1.ConfigMap
		Eventually(func(g Gomega) { doc, cm = document(g, ctx, ns) }, timeout, interval).Should(Succeed())

		edit(ctx, cm, func(cm *corev1.ConfigMap) { cm.Data[policydoc.DataKey] = `{"not":"a document"}` })
		Eventually(func(g Gomega) {
			again, _ := document(g, ctx, ns)
			g.Expect(again.Hash).To(Equal(doc.Hash))
		}, timeout, interval).Should(Succeed())

		Expect(k8s.Delete(ctx, cm)).To(Succeed())
		Eventually(func(g Gomega) {
			again, _ := document(g, ctx, ns)
			g.Expect(again.Hash).To(Equal(doc.Hash))
		}, timeout, interval).Should(Succeed())
	})

	It("reloads scripts after SCRIPT FLUSH without any policy change", func() {
		ns := newNamespace(ctx)
		Expect(k8s.Create(ctx, policy(ns, "p", 100))).To(Succeed())
		expectProgrammed(ctx, ns, "p")
		Expect(rdb.ScriptFlush(ctx).Err()).To(Succeed())
		s, _ := scripts.For(string(limiter.SlidingWindowCounter))
		Eventually(func() []bool {
			return rdb.ScriptExists(ctx, s.SHA).Val()
		}, timeout, interval).Should(Equal([]bool{true}))
	})

	DescribeTable("the API server refuses invalid specs with a message",
		func(mutate func(*v1alpha1.RateLimitPolicy), message string) {
			ns := newNamespace(ctx)
			p := policy(ns, "invalid", 100)
			mutate(p)
			err := k8s.Create(ctx, p)
			Expect(err).To(HaveOccurred())
			Expect(apierrors.IsInvalid(err)).To(BeTrue(), "%v", err)
			Expect(err.Error()).To(ContainSubstring(message))
		},
		Entry("requests below 1", func(p *v1alpha1.RateLimitPolicy) { p.Spec.Rules[0].Limit.Requests = -1 },
			"should be greater than or equal to 1"),
		Entry("no requests", func(p *v1alpha1.RateLimitPolicy) { p.Spec.Rules[0].Limit.Requests = 0 },
			"limit sets either requests and window (requests per window) or inFlight"),
		Entry("window under 1s", func(p *v1alpha1.RateLimitPolicy) {
			p.Spec.Rules[0].Limit.Window = metav1.Duration{Duration: 500 * time.Millisecond}
		}, "limit.window must be between 1s and 744h"),
		Entry("window over 744h", func(p *v1alpha1.RateLimitPolicy) {
			p.Spec.Rules[0].Limit.Window = metav1.Duration{Duration: 745 * time.Hour}
		}, "limit.window must be between 1s and 744h"),
		Entry("burst without TokenBucket", func(p *v1alpha1.RateLimitPolicy) {
			p.Spec.Rules[0].Limit.Burst = ptr.To[int64](10)
		}, "limit.burst is only valid with algorithm TokenBucket"),
		Entry("duplicate rule names", func(p *v1alpha1.RateLimitPolicy) {
			p.Spec.Rules = append(p.Spec.Rules, p.Spec.Rules[0])
		}, "rule names must be unique within a policy"),
		Entry("no key part", func(p *v1alpha1.RateLimitPolicy) { p.Spec.Rules[0].Key = nil },
			"spec.rules[0].key"),
		Entry("a key part with two sources", func(p *v1alpha1.RateLimitPolicy) {
			p.Spec.Rules[0].Key = []v1alpha1.KeyPart{{Header: "X-API-Key", Attribute: v1alpha1.Path}}
		}, "a key part sets exactly one of header, attribute or constant"),
		Entry("an empty key part", func(p *v1alpha1.RateLimitPolicy) {
			p.Spec.Rules[0].Key = []v1alpha1.KeyPart{{}}
		}, "a key part sets exactly one of header, attribute or constant"),
		Entry("a path without a slash", func(p *v1alpha1.RateLimitPolicy) {
			p.Spec.Rules[0].Match.Path.Value = "api"
		}, "match.path.value must be an absolute path starting with '/'"),
		Entry("a deprecated path prefix without a slash", func(p *v1alpha1.RateLimitPolicy) {
			p.Spec.Rules[0].Match = &v1alpha1.RuleMatch{PathPrefix: "api"}
		}, "match.pathPrefix must start with '/'"),
		Entry("an unknown algorithm", func(p *v1alpha1.RateLimitPolicy) { p.Spec.Rules[0].Algorithm = "LeakyBucket" },
			`supported values: "FixedWindow", "SlidingWindowLog", "SlidingWindowCounter", "TokenBucket"`),
		Entry("an unknown failure mode", func(p *v1alpha1.RateLimitPolicy) { p.Spec.FailureMode = "Maybe" },
			`supported values: "Open", "Closed", "LocalFallback"`),
		Entry("an unknown mode", func(p *v1alpha1.RateLimitPolicy) { p.Spec.Rules[0].Mode = "Log" },
			`supported values: "Enforce", "Shadow"`),
		Entry("an unknown rateLimitHeaders", func(p *v1alpha1.RateLimitPolicy) { p.Spec.RateLimitHeaders = "Never" },
			`supported values: "Always", "OnRefusal"`),
		Entry("no rules", func(p *v1alpha1.RateLimitPolicy) { p.Spec.Rules = nil }, "spec.rules"),
		Entry("a rule name that is not a DNS label", func(p *v1alpha1.RateLimitPolicy) { p.Spec.Rules[0].Name = "Per_Key" },
			"spec.rules[0].name"),
	)

	It("accepts burst with TokenBucket and defaults the algorithm and mode", func() {
		ns := newNamespace(ctx)
		p := policy(ns, "bucket", 10)
		p.Spec.Rules[0].Algorithm = v1alpha1.TokenBucket
		p.Spec.Rules[0].Limit.Burst = ptr.To[int64](20)
		Expect(k8s.Create(ctx, p)).To(Succeed())
		d := policy(ns, "defaults", 10)
		d.Spec.Rules[0].Algorithm = ""
		Expect(k8s.Create(ctx, d)).To(Succeed())
		Expect(d.Spec.Rules[0].Algorithm).To(Equal(v1alpha1.SlidingWindowCounter))
		Expect(d.Spec.Rules[0].Mode).To(Equal(v1alpha1.Enforce))
		expectProgrammed(ctx, ns, "bucket")
		Eventually(func(g Gomega) {
			doc, _ := document(g, ctx, ns)
			g.Expect(policyNames(doc)).To(Equal([]string{"bucket", "defaults"}))
			g.Expect(doc.Policies[0].Rules[0].Burst).To(BeEquivalentTo(20))
		}, timeout, interval).Should(Succeed())
	})
})

var _ = Describe("Redis outage", Ordered, func() {
	It("reports RedisUnavailable while Redis is down and recovers on its own", func() {
		ctx := context.Background()
		ns := newNamespace(ctx)
		Expect(k8s.Create(ctx, policy(ns, "p", 100))).To(Succeed())
		expectProgrammed(ctx, ns, "p")

		Expect(redisSrv.Stop()).To(Succeed())
		restarted := false
		DeferCleanup(func() {
			if !restarted {
				Expect(redisSrv.Start()).To(Succeed())
			}
		})
		Eventually(func(g Gomega) {
			c := condition(g, ctx, ns, "p", v1alpha1.ConditionProgrammed)
			g.Expect(c.Status).To(Equal(metav1.ConditionFalse))
			g.Expect(c.Reason).To(Equal("RedisUnavailable"))
		}, timeout, interval).Should(Succeed())
		Eventually(func(g Gomega) {
			g.Expect(eventReasons(ctx, ns, "p")).To(ContainElement("RedisUnavailable"))
		}, timeout, interval).Should(Succeed())
		// A policy created during the outage is still compiled: sidecars need it for their
		// failure mode.
		Expect(k8s.Create(ctx, policy(ns, "during-outage", 7))).To(Succeed())
		Eventually(func(g Gomega) {
			doc, _ := document(g, ctx, ns)
			g.Expect(policyNames(doc)).To(Equal([]string{"during-outage", "p"}))
			g.Expect(condition(g, ctx, ns, "during-outage", v1alpha1.ConditionProgrammed).Reason).To(Equal("RedisUnavailable"))
		}, timeout, interval).Should(Succeed())

		// A restarted Redis is empty: the scripts must be loaded again.
		Expect(redisSrv.Start()).To(Succeed())
		restarted = true
		expectProgrammed(ctx, ns, "p")
		expectProgrammed(ctx, ns, "during-outage")
		for _, s := range scripts.All() {
			Expect(rdb.ScriptExists(ctx, s.SHA).Val()).To(Equal([]bool{true}), "script %s reloaded", s.Name)
		}
	})
})

func eventReasons(ctx context.Context, ns, name string) []string {
	var list eventsv1.EventList
	Expect(k8s.List(ctx, &list, client.InNamespace(ns))).To(Succeed())
	var out []string
	for _, e := range list.Items {
		if e.Regarding.Name == name {
			out = append(out, e.Reason)
		}
	}
	return out
}

// policyRef names a policy for edit; Get fills in the rest.
func policyRef(ns, name string) *v1alpha1.RateLimitPolicy {
	return &v1alpha1.RateLimitPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
}

// edit changes an object the way `kubectl patch` does: a merge patch of what mutate changed,
// without the resourceVersion. Three reconcilers write a policy's status (Programmed, the
// connection budget, tenant isolation) whenever their passes end, and each write bumps the
// resourceVersion, so a read followed by an Update races them and conflicts.
func edit[T client.Object](ctx context.Context, obj T, mutate func(T)) {
	GinkgoHelper()
	Expect(k8s.Get(ctx, client.ObjectKeyFromObject(obj), obj)).To(Succeed())
	before := obj.DeepCopyObject().(T)
	mutate(obj)
	Expect(k8s.Patch(ctx, obj, client.MergeFrom(before))).To(Succeed())
}
