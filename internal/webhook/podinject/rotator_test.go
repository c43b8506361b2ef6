package podinject_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/redline-dev/redline/internal/webhook/podinject"
)

// unusedWebhookConfig is a webhook configuration that never matches a request: the rotator
// patches its caBundle, while the suite's real webhook keeps envtest's CA.
func unusedWebhookConfig(name string) *admissionregistrationv1.MutatingWebhookConfiguration {
	return &admissionregistrationv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Webhooks: []admissionregistrationv1.MutatingWebhook{{
			Name:                    "unused.redline.dev",
			AdmissionReviewVersions: []string{"v1"},
			ClientConfig:            admissionregistrationv1.WebhookClientConfig{URL: new("https://127.0.0.1:1/mutate-v1-pod")},
			FailurePolicy:           ptr.To(admissionregistrationv1.Ignore),
			SideEffects:             ptr.To(admissionregistrationv1.SideEffectClassNone),
			NamespaceSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{"redline.dev/never": "true"}},
			Rules: []admissionregistrationv1.RuleWithOperations{{
				Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
				Rule:       admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"}},
			}},
		}},
	}
}

// servedCertVerifies checks that the certificate in dir verifies, for the Service's DNS names,
// against the caBundle the API server would use, at time at.
func servedCertVerifies(dir string, caBundle []byte, cfg podinject.Config, at time.Time) {
	GinkgoHelper()
	pair, err := tls.LoadX509KeyPair(filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"))
	Expect(err).NotTo(HaveOccurred())
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	Expect(err).NotTo(HaveOccurred())
	roots := x509.NewCertPool()
	Expect(roots.AppendCertsFromPEM(caBundle)).To(BeTrue())
	for _, name := range podinject.ServiceDNSNames(cfg.ServiceName, cfg.Namespace) {
		_, err := leaf.Verify(x509.VerifyOptions{DNSName: name, Roots: roots, CurrentTime: at})
		Expect(err).NotTo(HaveOccurred(), "verifying for %s", name)
	}
}

func notAfter(certPEM []byte) time.Time {
	GinkgoHelper()
	block, _ := pem.Decode(certPEM)
	Expect(block).NotTo(BeNil())
	c, err := x509.ParseCertificate(block.Bytes)
	Expect(err).NotTo(HaveOccurred())
	return c.NotAfter
}

var _ = Describe("Self-signed webhook certificates", func() {
	var (
		ctx      context.Context
		cfg      podinject.Config
		replicas []*podinject.CertRotator
		secret   client.ObjectKey
	)
	caBundle := func() []byte {
		GinkgoHelper()
		mwc := &admissionregistrationv1.MutatingWebhookConfiguration{}
		Expect(k8s.Get(ctx, client.ObjectKey{Name: cfg.WebhookConfigName}, mwc)).To(Succeed())
		return mwc.Webhooks[0].ClientConfig.CABundle
	}
	secretData := func() map[string][]byte {
		GinkgoHelper()
		s := &corev1.Secret{}
		Expect(k8s.Get(ctx, secret, s)).To(Succeed())
		return s.Data
	}

	BeforeEach(func() {
		ctx = context.Background()
		createNamespace("redline-system")
		cfg = testConfig(podinject.NativeSidecarsAuto)
		cfg.CertMode = podinject.CertModeSelfSigned
		cfg.CertSecret = "rotator-test-cert"
		cfg.WebhookConfigName = "redline-rotator-test"
		secret = client.ObjectKey{Namespace: cfg.Namespace, Name: cfg.CertSecret}
		Expect(k8s.Create(ctx, unusedWebhookConfig(cfg.WebhookConfigName))).To(Succeed())
		DeferCleanup(func() {
			Expect(k8s.Delete(ctx, unusedWebhookConfig(cfg.WebhookConfigName))).To(Succeed())
			Expect(client.IgnoreNotFound(k8s.Delete(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: secret.Namespace, Name: secret.Name}}))).To(Succeed())
		})
		replicas = nil
		for range 2 {
			c := cfg
			c.CertDir = GinkgoT().TempDir()
			replicas = append(replicas, &podinject.CertRotator{Client: k8s, Config: c, Interval: time.Hour, Log: GinkgoLogr})
		}
	})

	It("gives racing replicas one CA, writes the serving certificate and patches the caBundle", func() {
		var wg sync.WaitGroup
		errs := make([]error, len(replicas))
		for i, r := range replicas {
			wg.Go(func() { errs[i] = r.Ensure(ctx) })
		}
		wg.Wait()
		Expect(errs).To(HaveEach(Succeed()))

		data := secretData()
		Expect(data).To(HaveKey("tls.crt"))
		Expect(data).To(HaveKey("ca.key"))
		Expect(caBundle()).To(Equal(data["ca.crt"]))
		for _, r := range replicas {
			served, err := os.ReadFile(filepath.Join(r.Config.CertDir, "tls.crt"))
			Expect(err).NotTo(HaveOccurred())
			Expect(served).To(Equal(data["tls.crt"]), "every replica serves the Secret's certificate")
			servedCertVerifies(r.Config.CertDir, caBundle(), cfg, time.Now())
		}
	})

	It("renews the serving certificate before it expires, under the same CA", func() {
		Expect(replicas[0].Ensure(ctx)).To(Succeed())
		before := secretData()
		bundle := caBundle()

		later := time.Now().Add(364 * 24 * time.Hour)
		for _, r := range replicas {
			r.Now = func() time.Time { return later }
			Expect(r.Ensure(ctx)).To(Succeed())
		}
		after := secretData()
		Expect(after["ca.crt"]).To(Equal(before["ca.crt"]))
		Expect(after["tls.crt"]).NotTo(Equal(before["tls.crt"]))
		Expect(notAfter(after["tls.crt"])).To(BeTemporally(">", later))
		Expect(caBundle()).To(Equal(bundle), "the caBundle does not change with the serving certificate")
		for _, r := range replicas {
			servedCertVerifies(r.Config.CertDir, caBundle(), cfg, later)
		}
	})

	It("replaces a CA near its end and a caBundle someone changed", func() {
		Expect(replicas[0].Ensure(ctx)).To(Succeed())
		oldCA := secretData()["ca.crt"]

		mwc := &admissionregistrationv1.MutatingWebhookConfiguration{}
		Expect(k8s.Get(ctx, client.ObjectKey{Name: cfg.WebhookConfigName}, mwc)).To(Succeed())
		mwc.Webhooks[0].ClientConfig.CABundle = []byte("not a CA")
		Expect(k8s.Update(ctx, mwc)).To(Succeed())
		Expect(replicas[0].Ensure(ctx)).To(Succeed())
		Expect(caBundle()).To(Equal(oldCA))

		replicas[0].Now = func() time.Time { return time.Now().Add(10*365*24*time.Hour - 24*time.Hour) }
		Expect(replicas[0].Ensure(ctx)).To(Succeed())
		Expect(secretData()["ca.crt"]).NotTo(Equal(oldCA))
		Expect(caBundle()).To(Equal(secretData()["ca.crt"]))
	})

	It("prepares the certificate during Setup, before the webhook server starts", func() {
		c := cfg
		c.CertDir = GinkgoT().TempDir()
		mgr, err := ctrl.NewManager(restCfg, ctrl.Options{
			Scheme: scheme, Metrics: metricsserver.Options{BindAddress: "0"}, WebhookServer: podinject.NewServer(c),
		})
		Expect(err).NotTo(HaveOccurred())
		Expect(podinject.Setup(mgr, c)).To(Succeed())
		Expect(filepath.Join(c.CertDir, "tls.crt")).To(BeAnExistingFile())
		servedCertVerifies(c.CertDir, caBundle(), cfg, time.Now())
	})
})
