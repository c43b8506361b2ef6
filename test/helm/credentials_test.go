package helm

import (
	"strings"
	"testing"

	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// renderObjects renders the chart with values (YAML).
func renderObjects(t *testing.T, values string) []*unstructured.Unstructured {
	t.Helper()
	g := NewWithT(t)
	vals, err := ParseValues([]byte(values))
	g.Expect(err).NotTo(HaveOccurred())
	ch, err := LoadChart()
	g.Expect(err).NotTo(HaveOccurred())
	out, err := Render(ch, vals)
	g.Expect(err).NotTo(HaveOccurred())
	objs, err := Objects(out)
	g.Expect(err).NotTo(HaveOccurred())
	return objs
}

// secretNames are the Secret names the manager's ClusterRole grants by name, and the verbs.
func secretNames(g Gomega, objs []*unstructured.Unstructured) map[string][]string {
	role := convert[rbacv1.ClusterRole](g, Find(objs, "ClusterRole", "redline-manager"))
	out := map[string][]string{}
	for _, r := range role.Rules {
		if !strings.Contains(strings.Join(r.Resources, ","), "secrets") {
			continue
		}
		for _, n := range r.ResourceNames {
			out[n] = append(out[n], r.Verbs...)
		}
	}
	return out
}

// TestManagerRBACNamesTheSidecarSecret: the manager's ClusterRole grants the namespaces'
// credentials Secret under the name sidecar.redisSecret gives it (the manager writes that
// name, --sidecar-redis-secret), and no longer the default one; empty, no credentials Secret.
// The ACL key Secret keeps its grant.
func TestManagerRBACNamesTheSidecarSecret(t *testing.T) {
	verbs := []string{"delete", "get", "list", "patch", "update", "watch"}
	t.Run("default", func(t *testing.T) {
		g := NewWithT(t)
		names := secretNames(g, renderObjects(t, "{}"))
		g.Expect(names).To(HaveKeyWithValue("redline-redis", ConsistOf(verbs)))
		g.Expect(names).To(HaveKeyWithValue("redline-redis-acl", ConsistOf(verbs)))
	})
	t.Run("another name", func(t *testing.T) {
		g := NewWithT(t)
		objs := renderObjects(t, "sidecar: {redisSecret: shop-redis-credentials}")
		names := secretNames(g, objs)
		g.Expect(names).To(HaveKeyWithValue("shop-redis-credentials", ConsistOf(verbs)))
		g.Expect(names).To(HaveKeyWithValue("redline-redis-acl", ConsistOf(verbs)))
		g.Expect(names).NotTo(HaveKey("redline-redis"))
		dep := convert[appsv1.Deployment](g, Find(objs, "Deployment", "redline-manager"))
		g.Expect(flagMap(dep.Spec.Template.Spec.Containers[0].Args)).To(HaveKeyWithValue("--sidecar-redis-secret", "shop-redis-credentials"))
	})
	t.Run("none", func(t *testing.T) {
		g := NewWithT(t)
		names := secretNames(g, renderObjects(t, `sidecar: {redisSecret: ""}`))
		g.Expect(names).To(HaveLen(1))
		g.Expect(names).To(HaveKey("redline-redis-acl"))
	})
}

// TestRedisAdminCredentialValues: redis.existingSecretKey is the key of the mounted Secret the
// manager's password file is read from, and redis.username its --redis-username.
func TestRedisAdminCredentialValues(t *testing.T) {
	t.Run("defaults", func(t *testing.T) {
		g := NewWithT(t)
		dep := managerDeployment(t, "redis: {url: redis://r:6379, existingSecret: admin}")
		args := flagMap(dep.Spec.Template.Spec.Containers[0].Args)
		g.Expect(args).To(HaveKeyWithValue("--redis-password-file", "/etc/redline/redis/password"))
		g.Expect(args).NotTo(HaveKey("--redis-username"))
		vol := volumeNamed(dep.Spec.Template.Spec, "redis-credentials")
		g.Expect(vol).NotTo(BeNil())
		g.Expect(vol.Secret.SecretName).To(Equal("admin"))
		g.Expect(vol.Secret.Items).To(Equal([]corev1.KeyToPath{{Key: "password", Path: "password"}}))
	})
	t.Run("a key and a user", func(t *testing.T) {
		g := NewWithT(t)
		dep := managerDeployment(t, "redis: {url: redis://r:6379, existingSecret: elasticache-auth, existingSecretKey: auth-token, username: redline-admin}")
		args := flagMap(dep.Spec.Template.Spec.Containers[0].Args)
		g.Expect(args).To(HaveKeyWithValue("--redis-password-file", "/etc/redline/redis/password"))
		g.Expect(args).To(HaveKeyWithValue("--redis-username", "redline-admin"))
		vol := volumeNamed(dep.Spec.Template.Spec, "redis-credentials")
		g.Expect(vol).NotTo(BeNil())
		g.Expect(vol.Secret.Items).To(Equal([]corev1.KeyToPath{{Key: "auth-token", Path: "password"}}))
	})
}

// TestCertManagerIssuerRef: webhook.certManager.issuerRef names the issuer of the serving
// Certificate, and the chart then creates no Issuer of its own; unset, the chart's self-signed
// Issuer signs it as before.
func TestCertManagerIssuerRef(t *testing.T) {
	issuerRef := func(g Gomega, objs []*unstructured.Unstructured) map[string]any {
		cert := Find(objs, "Certificate", "redline-serving-cert")
		g.Expect(cert).NotTo(BeNil())
		ref, found, err := unstructured.NestedMap(cert.Object, "spec", "issuerRef")
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(found).To(BeTrue())
		return ref
	}
	t.Run("no issuer named", func(t *testing.T) {
		g := NewWithT(t)
		objs := renderObjects(t, "webhook: {certificates: certManager}")
		g.Expect(Find(objs, "Issuer", "redline-selfsigned-issuer")).NotTo(BeNil())
		g.Expect(issuerRef(g, objs)).To(Equal(map[string]any{"kind": "Issuer", "name": "redline-selfsigned-issuer"}))
	})
	t.Run("a ClusterIssuer", func(t *testing.T) {
		g := NewWithT(t)
		objs := renderObjects(t, "webhook: {certificates: certManager, certManager: {issuerRef: {name: corp-ca, kind: ClusterIssuer}}}")
		g.Expect(Find(objs, "Issuer", "redline-selfsigned-issuer")).To(BeNil())
		g.Expect(issuerRef(g, objs)).To(Equal(map[string]any{"group": "cert-manager.io", "kind": "ClusterIssuer", "name": "corp-ca"}))
	})
	t.Run("self-signed certificates, the default", func(t *testing.T) {
		g := NewWithT(t)
		objs := renderObjects(t, "webhook: {certManager: {issuerRef: {name: corp-ca}}}")
		g.Expect(Find(objs, "Certificate", "redline-serving-cert")).To(BeNil())
		g.Expect(Find(objs, "Issuer", "redline-selfsigned-issuer")).To(BeNil())
	})
}

// TestCredentialValuesRefused: the schema refuses what would render a broken RBAC rule,
// volume or issuer.
func TestCredentialValuesRefused(t *testing.T) {
	ch, err := LoadChart()
	if err != nil {
		t.Fatal(err)
	}
	const schemaErr = "values don't meet the specifications of the schema"
	for _, tt := range []struct{ name, values, want string }{
		{"a Secret name that is not one", "sidecar: {redisSecret: Redis_Creds}", "at '/sidecar/redisSecret'"},
		{"an empty key", `redis: {url: "redis://r:6379", existingSecret: a, existingSecretKey: ""}`, "at '/redis/existingSecretKey'"},
		{"credentials in the username", `redis: {url: "redis://r:6379", username: "admin:pw"}`, "at '/redis/username'"},
		{"an issuer kind cert-manager has not", "webhook: {certManager: {issuerRef: {name: ca, kind: Vault}}}", "at '/webhook/certManager/issuerRef/kind'"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			vals, err := ParseValues([]byte(tt.values))
			g.Expect(err).NotTo(HaveOccurred())
			_, err = Render(ch, vals)
			g.Expect(err).To(HaveOccurred())
			g.Expect(err.Error()).To(And(ContainSubstring(schemaErr), ContainSubstring(tt.want)))
		})
	}
}
