package podinject_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/open-policy-agent/cert-controller/pkg/rotator"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/redline-dev/redline/internal/testutil/kubeletdir"
	"github.com/redline-dev/redline/internal/testutil/redistest"
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

// mountSecret plays the kubelet's part for a Secret volume at dir: it lays the Secret's keys
// out as the kubelet does, again whenever they change, until ctx ends. The real kubelet syncs
// within a minute or so; this one polls fast to keep the tests short.
func mountSecret(ctx context.Context, key client.ObjectKey, dir string) {
	defer GinkgoRecover()
	var mounted map[string][]byte
	for {
		s := &corev1.Secret{}
		if err := k8s.Get(ctx, key, s); err == nil && !maps.EqualFunc(s.Data, mounted, bytes.Equal) {
			Expect(kubeletdir.Write(dir, s.Data)).To(Succeed())
			mounted = s.Data
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// runManager starts mgr and, with it, the kubelet's mount of the certificate Secret at dir
// (none when dir is empty); both stop when the spec ends.
func runManager(mgr ctrl.Manager, secret client.ObjectKey, dir string) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer GinkgoRecover()
		defer close(done)
		Expect(mgr.Start(ctx)).To(Succeed())
	}()
	if dir != "" {
		go mountSecret(ctx, secret, dir)
	}
	DeferCleanup(func() {
		cancel()
		Eventually(done).WithTimeout(30 * time.Second).Should(BeClosed())
	})
}

// replica is one manager process in self-signed mode, reduced to the rotator. Replicas elect a
// leader, as in the Deployment, and every one of them must still get its certificate.
type replica struct {
	cfg   podinject.Config
	ready chan struct{}
	rot   *rotator.CertRotator
	mgr   ctrl.Manager
}

var rotatorSeq atomic.Int32

func newReplica(cfg podinject.Config) *replica {
	GinkgoHelper()
	r := &replica{cfg: cfg, ready: make(chan struct{})}
	r.cfg.CertDir = GinkgoT().TempDir()
	var err error
	r.mgr, err = ctrl.NewManager(restCfg, ctrl.Options{
		Scheme: scheme, Metrics: metricsserver.Options{BindAddress: "0"},
		LeaderElection: true, LeaderElectionID: "rotator-test.redline.dev", LeaderElectionNamespace: cfg.Namespace,
		LeaderElectionReleaseOnCancel: true,
	})
	Expect(err).NotTo(HaveOccurred())
	r.rot = podinject.NewCertRotator(r.cfg, r.ready)
	// Controller names are unique within a process; real replicas are separate processes.
	r.rot.ControllerName = fmt.Sprintf("webhook-cert-rotator-%d", rotatorSeq.Add(1))
	Expect(rotator.AddRotator(r.mgr, r.rot)).To(Succeed())
	return r
}

func (r *replica) start() { runManager(r.mgr, r.rot.SecretKey, r.cfg.CertDir) }

func freePort() int {
	GinkgoHelper()
	p, err := redistest.FreePort()
	Expect(err).NotTo(HaveOccurred())
	return p
}

var _ = Describe("Self-signed webhook certificates", func() {
	var (
		ctx    context.Context
		cfg    podinject.Config
		secret client.ObjectKey
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
	createSecret := func(data map[string][]byte) {
		GinkgoHelper()
		Expect(k8s.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: secret.Namespace, Name: secret.Name}, Data: data})).To(Succeed())
	}
	served := func(dir string) []byte {
		b, _ := os.ReadFile(filepath.Join(dir, "tls.crt"))
		return b
	}
	// seed writes a CA and a serving certificate that end at the given times, made the way the
	// rotator makes them.
	seed := func(r *replica, caEnd, servingEnd time.Time) (caPEM, certPEM []byte) {
		GinkgoHelper()
		begin := time.Now().Add(-time.Hour)
		ca, err := r.rot.CreateCACert(begin, caEnd)
		Expect(err).NotTo(HaveOccurred())
		cert, key, err := r.rot.CreateCertPEM(ca, begin, servingEnd)
		Expect(err).NotTo(HaveOccurred())
		createSecret(map[string][]byte{"ca.crt": ca.CertPEM, "ca.key": ca.KeyPEM, "tls.crt": cert, "tls.key": key})
		return ca.CertPEM, cert
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
	})

	It("gives racing replicas one CA, each serving the Secret's certificate, and patches the caBundle", func() {
		createSecret(nil)
		replicas := []*replica{newReplica(cfg), newReplica(cfg)}
		for _, r := range replicas {
			r.start()
		}
		for _, r := range replicas {
			Eventually(r.ready).WithTimeout(time.Minute).Should(BeClosed())
		}

		data := secretData()
		Expect(data).To(HaveKey("tls.key"))
		Expect(data).To(HaveKey("ca.key"))
		Expect(caBundle()).To(Equal(data["ca.crt"]))
		for _, r := range replicas {
			Eventually(served).WithArguments(r.cfg.CertDir).Should(Equal(data["tls.crt"]), "every replica serves the Secret's certificate")
			servedCertVerifies(r.cfg.CertDir, caBundle(), cfg, time.Now())
		}
	})

	It("renews a serving certificate near its end, under the same CA", func() {
		r := newReplica(cfg)
		soon := time.Now().Add(10 * 24 * time.Hour)
		ca, old := seed(r, time.Now().Add(10*365*24*time.Hour), soon)
		r.start()
		Eventually(r.ready).WithTimeout(time.Minute).Should(BeClosed())

		after := secretData()
		Expect(after["ca.crt"]).To(Equal(ca))
		Expect(after["tls.crt"]).NotTo(Equal(old))
		Expect(notAfter(after["tls.crt"])).To(BeTemporally(">", time.Now().Add(300*24*time.Hour)))
		Expect(caBundle()).To(Equal(ca))
		Eventually(served).WithArguments(r.cfg.CertDir).Should(Equal(after["tls.crt"]))
		servedCertVerifies(r.cfg.CertDir, caBundle(), cfg, soon.Add(24*time.Hour))
	})

	It("replaces a CA near its end, and restores a caBundle someone changed", func() {
		r := newReplica(cfg)
		soon := time.Now().Add(10 * 24 * time.Hour)
		oldCA, _ := seed(r, soon, soon)
		r.start()
		Eventually(r.ready).WithTimeout(time.Minute).Should(BeClosed())
		newCA := secretData()["ca.crt"]
		Expect(newCA).NotTo(Equal(oldCA))
		Expect(notAfter(newCA)).To(BeTemporally(">", time.Now().Add(9*365*24*time.Hour)))
		Expect(caBundle()).To(Equal(newCA))

		mwc := &admissionregistrationv1.MutatingWebhookConfiguration{}
		Expect(k8s.Get(ctx, client.ObjectKey{Name: cfg.WebhookConfigName}, mwc)).To(Succeed())
		mwc.Webhooks[0].ClientConfig.CABundle = []byte("not a CA")
		Expect(k8s.Update(ctx, mwc)).To(Succeed())
		Eventually(caBundle).WithTimeout(30 * time.Second).Should(Equal(newCA))
		Eventually(served).WithArguments(r.cfg.CertDir).Should(Equal(secretData()["tls.crt"]))
		servedCertVerifies(r.cfg.CertDir, newCA, cfg, time.Now())
	})

	It("creates the Secret in Setup and serves only once the certificate is mounted", func() {
		c := cfg
		c.CertDir = GinkgoT().TempDir()
		c.Port = freePort()
		probes := fmt.Sprintf("127.0.0.1:%d", freePort())
		mgr, err := ctrl.NewManager(restCfg, ctrl.Options{
			Scheme: scheme, Metrics: metricsserver.Options{BindAddress: "0"},
			HealthProbeBindAddress: probes, WebhookServer: podinject.NewServer(c),
		})
		Expect(err).NotTo(HaveOccurred())
		Expect(podinject.Setup(mgr, c)).To(Succeed())
		Expect(k8s.Get(ctx, secret, &corev1.Secret{})).To(Succeed(), "Setup creates the Secret the rotator fills")

		readyz := func() int {
			resp, err := http.Get("http://" + probes + "/readyz")
			if err != nil {
				return 0
			}
			_ = resp.Body.Close()
			return resp.StatusCode
		}
		runManager(mgr, secret, "")
		Eventually(secretData).WithTimeout(30 * time.Second).Should(HaveKey("tls.crt"))
		Consistently(readyz).WithTimeout(3*time.Second).ShouldNot(Equal(http.StatusOK), "not ready while the certificate is not mounted")

		mountCtx, stopMount := context.WithCancel(context.Background())
		DeferCleanup(stopMount)
		go mountSecret(mountCtx, secret, c.CertDir)
		Eventually(readyz).WithTimeout(time.Minute).WithPolling(500 * time.Millisecond).Should(Equal(http.StatusOK))

		// The API server's view: a TLS handshake for the Service's name, trusting the caBundle.
		roots := x509.NewCertPool()
		Expect(roots.AppendCertsFromPEM(caBundle())).To(BeTrue())
		conn, err := tls.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", c.Port), &tls.Config{
			RootCAs: roots, ServerName: podinject.ServiceDNSNames(c.ServiceName, c.Namespace)[0], MinVersion: tls.VersionTLS12,
		})
		Expect(err).NotTo(HaveOccurred())
		defer func() { _ = conn.Close() }()
		block, _ := pem.Decode(secretData()["tls.crt"])
		Expect(conn.ConnectionState().PeerCertificates[0].Raw).To(Equal(block.Bytes), "the server serves the Secret's certificate")
	})
})
