package helm

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"helm.sh/helm/v3/pkg/action"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redline-dev/redline/internal/sidecar/contract"
	"github.com/redline-dev/redline/internal/testutil/redistest"
	"github.com/redline-dev/redline/internal/testutil/tlstest"
)

// TestManagerFromChartOverTLS installs the chart with redis.tls (a private CA, client
// certificates) into a real kube-apiserver and runs the manager from the rendered pod spec,
// its TLS Secret mounted as kubelet mounts it, against a redis-server that speaks TLS only and
// requires client certificates: the manager loads the shop policy's scripts there (Programmed,
// the SHAs in Redis), and the pod it injects mounts the namespace's TLS Secret into the
// sidecar, with flags that name the mounted files.
func TestManagerFromChartOverTLS(t *testing.T) {
	g := NewWithT(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	ca, err := tlstest.NewCA("redis-ca")
	g.Expect(err).NotTo(HaveOccurred())
	node, err := ca.Node("127.0.0.1")
	g.Expect(err).NotTo(HaveOccurred())
	files, err := tlstest.Write(filepath.Join(t.TempDir(), "redis"), ca, node)
	g.Expect(err).NotTo(HaveOccurred())
	redis, err := redistest.StartTLS(redistest.TLSServer{CertFile: files.Cert, KeyFile: files.Key, CAFile: files.CA, AuthClients: true})
	g.Expect(err).NotTo(HaveOccurred(), "starting redis-server with TLS")
	t.Cleanup(func() { _ = redis.Close() })

	env := startAPIServer(t)
	admin, err := client.New(env.Config, client.Options{})
	g.Expect(err).NotTo(HaveOccurred())
	ch, err := LoadChart()
	g.Expect(err).NotTo(HaveOccurred())
	const tlsSecret = "redline-redis-tls"
	install := action.NewInstall(helmConfig(t, env))
	install.ReleaseName, install.Namespace, install.CreateNamespace = ReleaseName, Namespace, true
	install.Timeout = time.Minute
	_, err = install.RunWithContext(ctx, ch, map[string]any{
		"redis": map[string]any{"url": redis.URL(), "tls": map[string]any{
			"secretName": tlsSecret, "sidecarSecretName": tlsSecret, "clientCertificate": true, "minVersion": "1.3",
		}},
		"webhook": map[string]any{"certificates": "selfSigned"},
	})
	g.Expect(err).NotTo(HaveOccurred(), "helm install")

	// The manager's certificate, as cert-manager writes a Certificate's Secret.
	pair, err := ca.Client("redline-manager")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(admin.Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: Namespace, Name: tlsSecret},
		Type:       corev1.SecretTypeTLS,
		Data:       map[string][]byte{"ca.crt": ca.PEM, corev1.TLSCertKey: pair.CertPEM, corev1.TLSPrivateKeyKey: pair.KeyPEM},
	})).To(Succeed())
	g.Expect(admin.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop"}})).To(Succeed())
	policy := samplePolicy(t)
	policy.SetNamespace("shop")
	g.Expect(admin.Create(ctx, policy)).To(Succeed())

	mgr := startManagerFromChart(t, ctx, env, admin)
	var shas []string
	g.Eventually(func(g Gomega) {
		got := &unstructured.Unstructured{}
		got.SetGroupVersionKind(policyGVK)
		g.Expect(admin.Get(ctx, client.ObjectKeyFromObject(policy), got)).To(Succeed())
		conds, _, _ := unstructured.NestedSlice(got.Object, "status", "conditions")
		programmed := ""
		for _, c := range conds {
			if m := c.(map[string]any); m["type"] == "Programmed" {
				programmed = m["status"].(string) + " " + m["reason"].(string) + ": " + m["message"].(string)
			}
		}
		g.Expect(programmed).To(HavePrefix("True"))
		scripts, _, _ := unstructured.NestedSlice(got.Object, "status", "scripts")
		shas = nil
		for _, s := range scripts {
			shas = append(shas, s.(map[string]any)["sha"].(string))
		}
		g.Expect(shas).NotTo(BeEmpty())
	}).WithTimeout(time.Minute).Should(Succeed(), "the manager loads the scripts over TLS; manager log:\n%s", func() string { return mgr.Proc.LogTail(3000) })
	rc := redis.Client("")
	t.Cleanup(func() { _ = rc.Close() })
	g.Expect(rc.ScriptExists(ctx, shas...).Val()).To(HaveEach(BeTrue()), "the scripts are in the TLS Redis")

	// The injected sidecar mounts the namespace's Secret, and its flags name the files there.
	labels := map[string]string{"app": "checkout"}
	pod := &corev1.Pod{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "checkout-0", Labels: labels,
			Annotations: map[string]string{contract.AnnotationInject: "true", contract.AnnotationUpstreamPort: "8080"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "example.test/checkout:1"}}},
	}
	injected := admit(g, ctx, mgr, webhookCABundle(g, ctx, admin), pod)
	var sidecar *corev1.Container
	for _, list := range [][]corev1.Container{injected.Spec.InitContainers, injected.Spec.Containers} {
		for i := range list {
			if list[i].Name == contract.ContainerName {
				sidecar = &list[i]
			}
		}
	}
	g.Expect(sidecar).NotTo(BeNil(), "the manager injected no sidecar")
	g.Expect(sidecar.Args).To(ContainElements(
		"--redis-tls-ca-file=/etc/redline/redis-tls/ca.crt", "--redis-tls-cert-file=/etc/redline/redis-tls/tls.crt",
		"--redis-tls-key-file=/etc/redline/redis-tls/tls.key", "--redis-tls-min-version=1.3"))
	g.Expect(sidecar.VolumeMounts).To(ContainElement(corev1.VolumeMount{Name: contract.RedisTLSVolume, MountPath: contract.RedisTLSDir, ReadOnly: true}))
	var vol *corev1.Volume
	for i := range injected.Spec.Volumes {
		if injected.Spec.Volumes[i].Name == contract.RedisTLSVolume {
			vol = &injected.Spec.Volumes[i]
		}
	}
	g.Expect(vol).NotTo(BeNil())
	g.Expect(vol.Secret.SecretName).To(Equal(tlsSecret))
	// Optional in every namespace's pods, so that the patch does not tell whether a namespace's
	// own Redis uses TLS; a sidecar whose TLS files are missing exits and says so.
	g.Expect(vol.Secret.Optional).To(HaveValue(BeTrue()))
}
