package controller_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	v1alpha1 "github.com/redline-dev/redline/api/v1alpha1"
	"github.com/redline-dev/redline/internal/policydoc"
)

// deprecationWarning is what the API server says of a policy using match.pathPrefix, through
// config/deprecations (the chart ships the same objects).
const deprecationWarning = "spec.rules[].match.pathPrefix is deprecated"

// installDeprecationWarnings creates the ValidatingAdmissionPolicy and binding of
// config/deprecations, as kustomize and the chart install them, and waits until the API
// server applies them (it loads them asynchronously).
func installDeprecationWarnings(ctx context.Context) {
	data, err := os.ReadFile(filepath.Join("..", "..", "config", "deprecations", "ratelimitpolicy.yaml"))
	Expect(err).NotTo(HaveOccurred())
	docs := strings.Split(string(data), "\n---\n")
	Expect(docs).To(HaveLen(2))
	var vap admissionregistrationv1.ValidatingAdmissionPolicy
	var binding admissionregistrationv1.ValidatingAdmissionPolicyBinding
	Expect(yaml.UnmarshalStrict([]byte(docs[0]), &vap)).To(Succeed())
	Expect(yaml.UnmarshalStrict([]byte(docs[1]), &binding)).To(Succeed())
	Expect(k8s.Create(ctx, &vap)).To(Succeed())
	Expect(k8s.Create(ctx, &binding)).To(Succeed())

	ns := &corev1.Namespace{}
	ns.GenerateName = "vap-probe-"
	Expect(k8s.Create(ctx, ns)).To(Succeed())
	Eventually(func(g Gomega) {
		warnings.Take()
		g.Expect(warnK8s.Create(ctx, pathPolicy(ns.Name, "probe", map[string]any{"pathPrefix": "/x"}), client.DryRunAll)).To(Succeed())
		g.Expect(warnings.Take()).To(ContainElement(ContainSubstring(deprecationWarning)))
	}, timeout, interval).Should(Succeed())
	Expect(k8s.Delete(ctx, ns)).To(Succeed())
}

var _ = Describe("match.path", func() {
	ctx := context.Background()

	DescribeTable("stores what it accepts, defaulting type to PathPrefix, and the controller compiles it",
		func(match map[string]any, want policydoc.Match) {
			ns := newNamespace(ctx)
			u := pathPolicy(ns, "p", match)
			Expect(k8s.Create(ctx, u)).To(Succeed(), "match %v", match)
			p := expectProgrammed(ctx, ns, "p")
			if _, ok := match["path"]; ok {
				Expect(p.Spec.Rules[0].Match.Path.Type).NotTo(BeEmpty(), "the API server defaults type")
			}
			Eventually(func(g Gomega) {
				doc := readDocument(g, ctx, ns)
				g.Expect(doc.Policies).To(HaveLen(1))
				g.Expect(*doc.Policies[0].Rules[0].Match).To(Equal(want))
			}, timeout, interval).Should(Succeed())
		},
		Entry("a prefix, type defaulted", pathValue("", "/api"), policydoc.Match{PathPrefix: "/api"}),
		Entry("a prefix with a trailing slash", pathValue("PathPrefix", "/api/"), policydoc.Match{PathPrefix: "/api/"}),
		Entry("the root", pathValue("", "/"), policydoc.Match{PathPrefix: "/"}),
		Entry("an exact path", pathValue("Exact", "/login"), policydoc.Match{ExactPath: "/login"}),
		Entry("escapes, decoded", pathValue("Exact", "/a%20b/caf%C3%A9"), policydoc.Match{ExactPath: "/a b/caf\u00e9"}),
		Entry("sub-delims and dots inside segments", pathValue("", "/~u/a.b/..c/x;v=1/@me"), policydoc.Match{PathPrefix: "/~u/a.b/..c/x;v=1/@me"}),
		Entry("the deprecated pathPrefix", map[string]any{"pathPrefix": "/api/"}, policydoc.Match{PathPrefix: "/api/"}),
		Entry("an exact path ignoring case and a trailing slash",
			map[string]any{"path": map[string]any{"type": "Exact", "value": "/login", "ignoreCase": true, "trailingSlash": "Ignore"}},
			policydoc.Match{ExactPath: "/login", IgnoreCase: true, IgnoreTrailingSlash: true}),
		Entry("a prefix ignoring case", map[string]any{"path": map[string]any{"value": "/api", "ignoreCase": true, "trailingSlash": "Strict"}},
			policydoc.Match{PathPrefix: "/api", IgnoreCase: true}),
	)

	It("refuses encoded dot segments the schema cannot see, as Accepted=False with the reason", func() {
		ns := newNamespace(ctx)
		Expect(k8s.Create(ctx, pathPolicy(ns, "p", pathValue("", "/a/%2e%2e/admin")))).To(Succeed())
		Eventually(func(g Gomega) {
			c := condition(g, ctx, ns, "p", v1alpha1.ConditionAccepted)
			g.Expect(c.Status).To(BeEquivalentTo("False"))
			g.Expect(c.Message).To(ContainSubstring("must not contain a '.' or '..' segment, encoded or not"))
		}, timeout, interval).Should(Succeed())
	})

	It("warns, through the API server, of the deprecated pathPrefix and of nothing else", func() {
		ns := newNamespace(ctx)
		warnings.Take()
		Expect(warnK8s.Create(ctx, pathPolicy(ns, "old", map[string]any{"pathPrefix": "/api/"}))).To(Succeed())
		Expect(warnings.Take()).To(ConsistOf(And(
			ContainSubstring("redline-ratelimitpolicy-deprecations"),
			ContainSubstring(deprecationWarning+" (rules r): write match.path: {type: PathPrefix, value: <the prefix>}"),
		)))
		Expect(warnK8s.Create(ctx, pathPolicy(ns, "new", pathValue("", "/api/")))).To(Succeed())
		Expect(warnings.Take()).To(BeEmpty())
		// The controller's own status writes go to the status subresource, which the policy
		// does not match: no warning on every reconcile.
		expectProgrammed(ctx, ns, "old")
	})
})

// readDocument reads the namespace's compiled document.
func readDocument(g Gomega, ctx context.Context, ns string) *policydoc.Document {
	var cm corev1.ConfigMap
	g.Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: policydoc.ConfigMapName}, &cm)).To(Succeed())
	doc, err := policydoc.Parse([]byte(cm.Data[policydoc.DataKey]))
	g.Expect(err).NotTo(HaveOccurred())
	return doc
}
