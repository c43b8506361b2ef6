package controller_test

import (
	"context"
	"os"
	"path/filepath"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	authorizationv1 "k8s.io/api/authorization/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/redline-dev/redline/internal/policydoc"
)

// The manager may write, read and delete the one ConfigMap it owns in each namespace and no
// other: a tenant's own ConfigMaps are out of its reach. Only create, list and watch are not
// limited by name, which RBAC cannot do for them.
var _ = Describe("The generated ClusterRole on ConfigMaps", func() {
	ctx := context.Background()
	const user = "redline-configmaps"

	It("is limited to redline-policies wherever RBAC can limit by name", func() {
		raw, err := os.ReadFile(filepath.Join("..", "..", "config", "rbac", "role.yaml"))
		Expect(err).NotTo(HaveOccurred())
		role := &rbacv1.ClusterRole{}
		Expect(yaml.Unmarshal(raw, role)).To(Succeed())
		role.ObjectMeta = metav1.ObjectMeta{GenerateName: "redline-configmaps-under-test-"}
		Expect(k8s.Create(ctx, role)).To(Succeed())
		DeferCleanup(func() { _ = k8s.Delete(ctx, role) })
		binding := &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{GenerateName: "redline-configmaps-under-test-"},
			RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: role.Name},
			Subjects:   []rbacv1.Subject{{Kind: "User", Name: user}},
		}
		Expect(k8s.Create(ctx, binding)).To(Succeed())
		DeferCleanup(func() { _ = k8s.Delete(ctx, binding) })

		allowed := func(verb, name string) bool {
			sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
				User: user,
				ResourceAttributes: &authorizationv1.ResourceAttributes{
					Verb: verb, Resource: "configmaps", Namespace: "tenant-a", Name: name,
				},
			}}
			Expect(k8s.Create(ctx, sar)).To(Succeed())
			return sar.Status.Allowed
		}
		Eventually(func() bool { return allowed("list", "") }, timeout, interval).Should(BeTrue(), "the binding takes effect")
		for _, verb := range []string{"get", "update", "patch", "delete"} {
			Expect(allowed(verb, policydoc.ConfigMapName)).To(BeTrue(), "%s %s", verb, policydoc.ConfigMapName)
			Expect(allowed(verb, "app-settings")).To(BeFalse(), "%s of a tenant's own ConfigMap must be refused", verb)
		}
		for _, verb := range []string{"create", "list", "watch"} {
			Expect(allowed(verb, "")).To(BeTrue(), verb)
		}
		Expect(allowed("deletecollection", "")).To(BeFalse())
	})
})
