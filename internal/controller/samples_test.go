package controller_test

import (
	"bytes"
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	v1alpha1 "github.com/redline-dev/redline/api/v1alpha1"
	"github.com/redline-dev/redline/internal/sidecar/contract"
)

// yamlBlock is a fenced YAML block of a Markdown page.
var yamlBlock = regexp.MustCompile("(?ms)^```yaml\n(.*?)^```")

// documentedPolicies are the RateLimitPolicies the README and docs/ show whole, by page.
func documentedPolicies() map[string][][]byte {
	pages := []string{filepath.Join("..", "..", "README.md")}
	Expect(filepath.WalkDir(filepath.Join("..", "..", "docs"), func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(p, ".md") {
			pages = append(pages, p)
		}
		return err
	})).To(Succeed())
	out := map[string][][]byte{}
	for _, p := range pages {
		data, err := os.ReadFile(p)
		Expect(err).NotTo(HaveOccurred())
		for _, m := range yamlBlock.FindAllSubmatch(data, -1) {
			if regexp.MustCompile(`(?m)^kind: RateLimitPolicy$`).Match(m[1]) {
				out[p] = append(out[p], m[1])
			}
		}
	}
	return out
}

// samplesDir is config/samples, which docs/getting-started.md applies.
var samplesDir = filepath.Join("..", "..", "config", "samples")

// sampleDocuments reads every YAML document of the files a glob under config/samples names
// (documents separated by "---" lines), each with the file it came from.
func sampleDocuments(glob string) (docs [][]byte, from []string) {
	files, err := filepath.Glob(filepath.Join(samplesDir, glob))
	Expect(err).NotTo(HaveOccurred())
	Expect(files).NotTo(BeEmpty(), "config/samples/%s", glob)
	for _, f := range files {
		data, err := os.ReadFile(f)
		Expect(err).NotTo(HaveOccurred())
		for d := range bytes.SplitSeq(data, []byte("\n---\n")) {
			if len(bytes.TrimSpace(d)) > 0 {
				docs, from = append(docs, d), append(from, f)
			}
		}
	}
	return docs, from
}

// decodeSample decodes one sample strictly into the object its kind names.
func decodeSample(data []byte, file string) client.Object {
	var tm metav1.TypeMeta
	Expect(yaml.Unmarshal(data, &tm)).To(Succeed(), file)
	var obj client.Object
	switch tm.Kind {
	case "Deployment":
		obj = &appsv1.Deployment{}
	case "Service":
		obj = &corev1.Service{}
	case "ClusterRole":
		obj = &rbacv1.ClusterRole{}
	case "RoleBinding":
		obj = &rbacv1.RoleBinding{}
	case "RateLimitPolicy":
		obj = &v1alpha1.RateLimitPolicy{}
	default:
		Fail(file + ": a sample of kind " + tm.Kind + " this suite does not apply")
	}
	Expect(yaml.UnmarshalStrict(data, obj)).To(Succeed(), file)
	return obj
}

var _ = Describe("config/samples", func() {
	// kubectl apply -f config/samples/ takes every file of the folder, so it holds policies only;
	// workloads, RBAC and NetworkPolicies have folders of their own.
	It("are accepted by the API server and programmed", func() {
		ctx := context.Background()
		files, err := filepath.Glob(filepath.Join(samplesDir, "*.yaml"))
		Expect(err).NotTo(HaveOccurred())
		ns := newNamespace(ctx)
		var names []string
		for _, f := range files {
			data, err := os.ReadFile(f)
			Expect(err).NotTo(HaveOccurred())
			var p v1alpha1.RateLimitPolicy
			Expect(yaml.UnmarshalStrict(data, &p)).To(Succeed(), f)
			p.Namespace = ns
			warnings.Take()
			Expect(warnK8s.Create(ctx, &p)).To(Succeed(), f)
			Expect(warnings.Take()).To(BeEmpty(), "%s: samples use no deprecated field", f)
			names = append(names, p.Name)
		}
		Expect(names).To(HaveLen(3))
		for _, n := range names {
			expectProgrammed(ctx, ns, n)
		}
	})

	// A policy the docs show whole is one a reader can apply as it stands.
	It("the docs show are accepted by the API server and programmed", func() {
		ctx := context.Background()
		docs := documentedPolicies()
		Expect(docs).To(HaveKey(filepath.Join("..", "..", "README.md")), "the README shows a minimal policy")
		for page, blocks := range docs {
			for _, b := range blocks {
				ns := newNamespace(ctx)
				var p v1alpha1.RateLimitPolicy
				Expect(yaml.UnmarshalStrict(b, &p)).To(Succeed(), page)
				p.Namespace = ns
				warnings.Take()
				Expect(warnK8s.Create(ctx, &p)).To(Succeed(), page)
				Expect(warnings.Take()).To(BeEmpty(), "%s: the docs' policies use no deprecated field", page)
				expectProgrammed(ctx, ns, p.Name)
			}
		}
	})

	// What docs/getting-started.md does: the workload, then the policy. The sample Deployment's
	// pods are the ones the sample policy selects, the injector gives them a sidecar, and the
	// Service reaches them through it.
	It("pair the sample workload with the sample policy", func() {
		ctx := context.Background()
		ns := newNamespace(ctx)
		docs, from := sampleDocuments(filepath.Join("workload", "*.yaml"))
		var deploy *appsv1.Deployment
		var svc *corev1.Service
		for i, d := range docs {
			obj := decodeSample(d, from[i])
			obj.SetNamespace(ns)
			Expect(k8s.Create(ctx, obj)).To(Succeed(), from[i])
			switch o := obj.(type) {
			case *appsv1.Deployment:
				deploy = o
				// The connection budget is cluster-wide: a workload left behind changes the
				// shares the budget specs expect.
				DeferCleanup(func(ctx context.Context) { Expect(k8s.Delete(ctx, o)).To(Succeed()) })
			case *corev1.Service:
				svc = o
			}
		}
		Expect(deploy).NotTo(BeNil(), "config/samples/workload has a Deployment")
		Expect(svc).NotTo(BeNil(), "config/samples/workload has a Service")

		// In Shadow first, as the page applies it, then the enforcing sample over it.
		data, err := os.ReadFile(filepath.Join(samplesDir, "shadow", "checkout_per_api_key.yaml"))
		Expect(err).NotTo(HaveOccurred())
		shadow := decodeSample(data, "shadow/checkout_per_api_key.yaml").(*v1alpha1.RateLimitPolicy)
		shadow.Namespace = ns
		Expect(k8s.Create(ctx, shadow)).To(Succeed())
		expectProgrammed(ctx, ns, shadow.Name)
		Eventually(func(g Gomega) string {
			doc, _ := document(g, ctx, ns)
			g.Expect(doc.Policies).To(HaveLen(1))
			return doc.Policies[0].Rules[0].Mode
		}, timeout, interval).Should(Equal(string(v1alpha1.Shadow)))

		data, err = os.ReadFile(filepath.Join(samplesDir, "checkout_per_api_key.yaml"))
		Expect(err).NotTo(HaveOccurred())
		p := decodeSample(data, "checkout_per_api_key.yaml").(*v1alpha1.RateLimitPolicy)
		Expect(p.Name).To(Equal(shadow.Name), "the enforcing sample replaces the Shadow one")
		edit(ctx, shadow, func(cur *v1alpha1.RateLimitPolicy) { cur.Spec = p.Spec })
		p = shadow
		Eventually(func(g Gomega) string {
			doc, _ := document(g, ctx, ns)
			return doc.Policies[0].Rules[0].Mode
		}, timeout, interval).Should(Equal(string(v1alpha1.Enforce)))
		expectProgrammed(ctx, ns, p.Name)

		// The policy selects the Deployment's pods, and so does the Service.
		sel, err := metav1.LabelSelectorAsSelector(&p.Spec.TargetSelector)
		Expect(err).NotTo(HaveOccurred())
		tmpl := deploy.Spec.Template
		Expect(sel.Matches(labels.Set(tmpl.Labels))).To(BeTrue(), "policy %s selects %v", sel, tmpl.Labels)
		Expect(labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(tmpl.Labels))).To(BeTrue())
		Expect(svc.Spec.Ports).To(HaveLen(1))
		Expect(svc.Spec.Ports[0].TargetPort).To(Equal(intstr.Parse(tmpl.Annotations[contract.AnnotationListenPort])),
			"the Service targets the sidecar's listen port")

		// A pod of that template, as the ReplicaSet would create it, gets the sidecar.
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, GenerateName: "checkout-", Labels: tmpl.Labels, Annotations: tmpl.Annotations},
			Spec:       tmpl.Spec,
		}
		Expect(k8s.Create(ctx, pod)).To(Succeed())
		var sidecars []string
		for _, c := range append(pod.Spec.InitContainers, pod.Spec.Containers...) {
			sidecars = append(sidecars, c.Name)
		}
		Expect(sidecars).To(ContainElement(contract.ContainerName), "the sample pod is injected")
		Expect(sel.Matches(labels.Set(pod.Labels))).To(BeTrue())

		// No sidecar heartbeats in this suite: Enforced says so, and not that the Service
		// goes around the sidecar.
		Eventually(func(g Gomega) {
			c := condition(g, ctx, ns, p.Name, v1alpha1.ConditionEnforced)
			g.Expect(c.Reason).To(Equal(v1alpha1.ReasonNoSidecars), "%s: %s", c.Reason, c.Message)
		}, timeout, interval).Should(Succeed())
		// The same Service sent to the application's port would: the check reads this Service.
		edit(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: svc.Name}}, func(s *corev1.Service) {
			s.Spec.Ports[0].TargetPort = intstr.Parse(tmpl.Annotations[contract.AnnotationUpstreamPort])
		})
		Eventually(func(g Gomega) {
			c := condition(g, ctx, ns, p.Name, v1alpha1.ConditionEnforced)
			g.Expect(c.Reason).To(Equal(v1alpha1.ReasonServiceBypassesSidecar), "%s: %s", c.Reason, c.Message)
		}, timeout, interval).Should(Succeed())
	})

	// docs/operations/security.md hands these roles to app teams: what each lets its holder do,
	// asked of the API server's RBAC authorizer.
	It("give app teams their namespace's policies and nothing else", func() {
		ctx := context.Background()
		ns, other := newNamespace(ctx), newNamespace(ctx)
		docs, from := sampleDocuments(filepath.Join("rbac", "*.yaml"))
		for i, d := range docs {
			obj := decodeSample(d, from[i])
			if _, namespaced := obj.(*rbacv1.RoleBinding); namespaced {
				obj.SetNamespace(ns)
			}
			Expect(k8s.Create(ctx, obj)).To(Succeed(), from[i])
			DeferCleanup(func(ctx context.Context) { Expect(k8s.Delete(ctx, obj)).To(Succeed()) })
		}
		// The viewer and the backend admin are bound here as an admin would bind them.
		for _, b := range []client.Object{
			&rbacv1.RoleBinding{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "auditors-view"},
				Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.GroupKind, Name: "auditors"}},
				RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "redline-policy-viewer"},
			},
			&rbacv1.ClusterRoleBinding{
				ObjectMeta: metav1.ObjectMeta{Name: "redline-samples-backend-admins"},
				Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.GroupKind, Name: "platform"}},
				RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "redline-backend-admin"},
			},
		} {
			Expect(k8s.Create(ctx, b)).To(Succeed())
			DeferCleanup(func(ctx context.Context) { Expect(k8s.Delete(ctx, b)).To(Succeed()) })
		}

		can := func(g Gomega, group, verb, resource, namespace string) bool {
			sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
				User: "someone-of-" + group, Groups: []string{group},
				ResourceAttributes: &authorizationv1.ResourceAttributes{
					Group: v1alpha1.GroupVersion.Group, Resource: resource, Verb: verb, Namespace: namespace,
				},
			}}
			g.Expect(k8s.Create(ctx, sar)).To(Succeed())
			return sar.Status.Allowed
		}
		cases := []struct {
			group, verb, resource, namespace string
			allowed                          bool
		}{
			{"shop-team", "create", "ratelimitpolicies", ns, true},
			{"shop-team", "delete", "ratelimitpolicies", ns, true},
			{"shop-team", "create", "ratelimitpolicies", other, false},
			{"shop-team", "update", "ratelimitpolicies/status", ns, false},
			{"shop-team", "create", "redisbackends", "", false},
			{"auditors", "list", "ratelimitpolicies", ns, true},
			{"auditors", "create", "ratelimitpolicies", ns, false},
			{"platform", "create", "redisbackends", "", true},
			{"platform", "create", "ratelimitpolicies", ns, false},
		}
		// RBAC's authorizer reads bindings from its own cache: wait until it has them.
		Eventually(func(g Gomega) {
			for _, c := range cases {
				g.Expect(can(g, c.group, c.verb, c.resource, c.namespace)).To(Equal(c.allowed),
					"%s %s %s in %q", c.group, c.verb, c.resource, c.namespace)
			}
		}, timeout, interval).Should(Succeed())
	})
})
