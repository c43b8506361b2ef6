package controller_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/redline-dev/redline/api/v1alpha1"
	"github.com/redline-dev/redline/internal/policydoc"
)

var _ = Describe("One namespace cannot stop the others", Ordered, func() {
	ctx := context.Background()

	// A policy stored under the previous release's schema (window format: duration, which takes
	// 1d) is never validated again after an upgrade: a typed informer then fails to list every
	// policy of the cluster. The test stores one the same way, through the old schema.
	It("keeps reconciling other namespaces while a stored policy does not decode", func() {
		bad := newNamespace(ctx)
		// A scheme of its own: adding to client-go's global one races with the manager's
		// Event sink, which decodes with it.
		extScheme := runtime.NewScheme()
		Expect(apiextensionsv1.AddToScheme(extScheme)).To(Succeed())
		ext, err := client.New(cfg, client.Options{Scheme: extScheme})
		Expect(err).NotTo(HaveOccurred())
		var crd apiextensionsv1.CustomResourceDefinition
		Expect(ext.Get(ctx, client.ObjectKey{Name: "ratelimitpolicies.redline.dev"}, &crd)).To(Succeed())
		released := crd.DeepCopy()
		window := func(c *apiextensionsv1.CustomResourceDefinition) *apiextensionsv1.JSONSchemaProps {
			spec := c.Spec.Versions[0].Schema.OpenAPIV3Schema.Properties["spec"]
			rules := spec.Properties["rules"]
			limit := rules.Items.Schema.Properties["limit"]
			w := limit.Properties["window"]
			set := func(w apiextensionsv1.JSONSchemaProps) {
				limit.Properties["window"] = w
				rules.Items.Schema.Properties["limit"] = limit
				spec.Properties["rules"] = rules
				c.Spec.Versions[0].Schema.OpenAPIV3Schema.Properties["spec"] = spec
			}
			w.XValidations, w.Format = nil, "duration"
			set(w)
			// The rule's rules on window (its length by algorithm) came with calendars, after
			// the release that stored window as a "duration".
			rule := rules.Items.Schema
			rule.XValidations = slices.DeleteFunc(slices.Clone(rule.XValidations), func(v apiextensionsv1.ValidationRule) bool {
				return strings.Contains(v.Rule, "limit.window")
			})
			rules.Items.Schema = rule
			spec.Properties["rules"] = rules
			c.Spec.Versions[0].Schema.OpenAPIV3Schema.Properties["spec"] = spec
			return &w
		}
		_ = window(&crd)
		Expect(ext.Update(ctx, &crd)).To(Succeed())
		Eventually(func() error {
			return k8s.Create(ctx, rawPolicy(bad, "poisoned", rawRule("1d")))
		}, timeout, interval).Should(Succeed())
		Expect(ext.Get(ctx, client.ObjectKey{Name: crd.Name}, &crd)).To(Succeed())
		crd.Spec = released.Spec
		Expect(ext.Update(ctx, &crd)).To(Succeed())
		Eventually(func() error {
			return k8s.Create(ctx, rawPolicy(bad, "again", rawRule("1d")), client.DryRunAll)
		}, timeout, interval).Should(HaveOccurred())
		DeferCleanup(func() { _ = k8s.Delete(ctx, newPolicyObject(bad, "poisoned")) })
		var typed v1alpha1.RateLimitPolicy
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: bad, Name: "poisoned"}, &typed)).NotTo(Succeed(),
			"the stored object must not decode into v1alpha1 for this test to mean anything")

		good := newNamespace(ctx)
		Expect(k8s.Create(ctx, policy(good, "p", 100))).To(Succeed())
		p := expectProgrammed(ctx, good, "p")
		edit(ctx, p, func(p *v1alpha1.RateLimitPolicy) { p.Spec.Rules[0].Limit.Requests = 200 })
		Eventually(func(g Gomega) {
			doc, _ := document(g, ctx, good)
			g.Expect(doc.Policies[0].Rules[0].Requests).To(BeEquivalentTo(200))
		}, timeout, interval).Should(Succeed())
		expectProgrammed(ctx, good, "p")

		// The bad object is reported on itself.
		Eventually(func(g Gomega) {
			g.Expect(eventReasons(ctx, bad, "poisoned")).To(ContainElement(v1alpha1.ReasonUndecodable))
		}, timeout, interval).Should(Succeed())
	})

	It("keeps the last good ConfigMap of a namespace whose policies outgrow it, and says why", func() {
		ns := newNamespace(ctx)
		Expect(k8s.Create(ctx, policy(ns, "small", 10))).To(Succeed())
		expectProgrammed(ctx, ns, "small")
		var inForce string
		Eventually(func(g Gomega) {
			doc, _ := document(g, ctx, ns)
			g.Expect(policyNames(doc)).To(Equal([]string{"small"}))
			inForce = doc.Hash
		}, timeout, interval).Should(Succeed())

		// Random printable header values hardly compress: two policies of 16 rules of 16 x 4000
		// bytes are over 1 MiB either way, while each object stays within what etcd stores.
		const printable = "!#$%&'*+-.0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ^_`abcdefghijklmnopqrstuvwxyz|~"
		var bigs []*v1alpha1.RateLimitPolicy
		for _, name := range []string{"big", "bigger"} {
			big := policy(ns, name, 10)
			big.Spec.Rules = nil
			for i := range 16 {
				var headers []v1alpha1.HeaderMatch
				for j := range 16 {
					buf := make([]byte, 4000)
					_, _ = rand.Read(buf)
					for k := range buf {
						buf[k] = printable[int(buf[k])%len(printable)]
					}
					v := string(buf)
					headers = append(headers, v1alpha1.HeaderMatch{Name: fmt.Sprintf("X-H%d", j), Value: &v})
				}
				r := policy(ns, "x", 10).Spec.Rules[0]
				r.Name = fmt.Sprintf("r%d", i)
				r.Match.Headers = headers
				big.Spec.Rules = append(big.Spec.Rules, r)
			}
			Expect(k8s.Create(ctx, big)).To(Succeed())
			bigs = append(bigs, big)
		}
		Eventually(func(g Gomega) {
			c := condition(g, ctx, ns, "big", v1alpha1.ConditionProgrammed)
			g.Expect(c.Status).To(Equal(metav1.ConditionFalse))
			g.Expect(c.Reason).To(Equal(v1alpha1.ReasonDocumentTooLarge))
			g.Expect(c.Message).To(ContainSubstring("the policies of namespace " + ns + " compile to"))
			g.Expect(c.Message).To(ContainSubstring(fmt.Sprintf("over the %d bytes a sidecar loads within its default memory limit", policydoc.MaxDocumentBytes)))
			g.Expect(c.Message).To(ContainSubstring("these policies do not fit (the oldest are kept first): big, bigger."))
			doc, _ := document(g, ctx, ns)
			inForce = doc.Hash
			g.Expect(c.Message).To(ContainSubstring("keeps the last configuration that fit (hash %.12s) in force", inForce))
			g.Expect(c.Message).To(ContainSubstring("Remove or merge policies or rules (3 policies, 33 rules now)"))
		}, timeout, interval).Should(Succeed())
		Consistently(func(g Gomega) {
			doc, _ := document(g, ctx, ns)
			g.Expect(doc.Hash).To(Equal(inForce))
			g.Expect(policyNames(doc)).NotTo(ContainElement("bigger"))
			g.Expect(policyNames(doc)).To(ContainElement("small"))
		}, time.Second, interval).Should(Succeed())

		for _, big := range bigs {
			Expect(k8s.Delete(ctx, big)).To(Succeed())
		}
		expectProgrammed(ctx, ns, "small")
	})

	It("is unready while its caches cannot sync", func() {
		// A manager whose user may not list policies cannot sync its cache.
		readyz := startManagerAs(ctx, "redline-unprivileged")
		Eventually(readyz, timeout, interval).Should(Equal(http.StatusInternalServerError))
		Consistently(readyz, 2*time.Second, interval).Should(Equal(http.StatusInternalServerError))

		binding := &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{GenerateName: "redline-unprivileged-"},
			RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "cluster-admin"},
			Subjects:   []rbacv1.Subject{{Kind: "User", Name: "redline-unprivileged"}},
		}
		Expect(k8s.Create(ctx, binding)).To(Succeed())
		DeferCleanup(func() { _ = k8s.Delete(ctx, binding) })
		Eventually(readyz, timeout, interval).Should(Equal(http.StatusOK))
	})
})

func newPolicyObject(ns, name string) client.Object {
	p := &v1alpha1.RateLimitPolicy{}
	p.Namespace, p.Name = ns, name
	return p
}
