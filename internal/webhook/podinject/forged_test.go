package podinject_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"github.com/go-logr/logr"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	admissionv1 "k8s.io/api/admission/v1"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/redline-dev/redline/internal/backend"
	"github.com/redline-dev/redline/internal/connbudget"
	"github.com/redline-dev/redline/internal/sidecar/app"
	"github.com/redline-dev/redline/internal/sidecar/contract"
	"github.com/redline-dev/redline/internal/webhook/podinject"
)

// serveWebhook runs the webhook server of cfg on a free port, with the envtest serving
// certificate, until the spec ends, and returns its pod injection URL.
func serveWebhook(cfg podinject.Config) string {
	GinkgoHelper()
	cfg.Port = freePort()
	cfg.CertDir = testEnv.WebhookInstallOptions.LocalServingCertDir
	srv := podinject.NewServer(cfg)
	srv.Register(podinject.Path, &webhook.Admission{Handler: podinject.NewHandler(podinject.NewInjector(cfg, true), scheme, logr.Discard())})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Start(ctx) }()
	DeferCleanup(func() {
		cancel()
		Expect(<-done).To(Succeed())
	})
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(cfg.Port))
	Eventually(func() error {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			_ = c.Close()
		}
		return err
	}).WithTimeout(10 * time.Second).WithPolling(20 * time.Millisecond).Should(Succeed())
	return "https://" + addr + podinject.Path
}

// review is an AdmissionReview of the creation of the annotated pod name in namespace ns.
func review(ns, name string) []byte {
	GinkgoHelper()
	return reviewOf(annotatedPod(ns, name))
}

// reviewOf is an AdmissionReview of the creation of p.
func reviewOf(p *corev1.Pod) []byte {
	GinkgoHelper()
	ns, name := p.Namespace, p.Name
	pod, err := json.Marshal(p)
	Expect(err).NotTo(HaveOccurred())
	raw, err := json.Marshal(admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{
			UID: types.UID("forged-" + name), Operation: admissionv1.Create, Namespace: ns, Name: name,
			Kind:     metav1.GroupVersionKind{Version: "v1", Kind: "Pod"},
			Resource: metav1.GroupVersionResource{Version: "v1", Resource: "pods"},
			Object:   runtime.RawExtension{Raw: pod},
		},
	})
	Expect(err).NotTo(HaveOccurred())
	return raw
}

// send posts body to url with client and returns the review's response, or the error of the
// request (a refused handshake).
func send(client *http.Client, url string, body []byte) (*admissionv1.AdmissionResponse, error) {
	resp, err := client.Post(url, "application/json", bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("status %d", resp.StatusCode)
	}
	var out admissionv1.AdmissionReview
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return nil, err
	}
	return out.Response, nil
}

// anyClient trusts any server and presents certs (none: no client certificate).
func anyClient(certs ...tls.Certificate) *http.Client {
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true, Certificates: certs}, //nolint:gosec // any client, as an attacker's
	}}
}

// patchOps are the operations of a JSON patch, each as its bytes, sorted: the order the
// webhook lists them in is the patch library's map order.
func patchOps(patch []byte) []string {
	GinkgoHelper()
	var ops []json.RawMessage
	Expect(json.Unmarshal(patch, &ops)).To(Succeed())
	out := make([]string, 0, len(ops))
	for _, op := range ops {
		out = append(out, string(op))
	}
	slices.Sort(out)
	return out
}

var _ = Describe("A review anyone can send", func() {
	const victim = "forged-victim"
	victimRedis := backend.NamespaceRedis{URL: "rediss://victim-orders.redis.example:6380", Backend: true, TLSServerName: "victim-orders.internal", TLSMinVersion: "1.3"}

	It("of another namespace's pod gets the patch of any namespace, whichever Redis serves it", func(ctx SpecContext) {
		const bystander = "forged-bystander"
		createNamespace(victim)
		createNamespace(bystander)
		cfg := tlsConfig()
		cfg.SidecarRedisTLS.MinVersion = "1.2"
		cfg.Backends = nsBackends{victim: victimRedis}
		url := serveWebhook(cfg)
		// The same namespace's review, sent to a webhook for which no RedisBackend serves it.
		noBackends := cfg
		noBackends.Backends = nsBackends{}
		plainURL := serveWebhook(noBackends)

		resp, err := send(anyClient(), url, review(victim, "forged"))
		Expect(err).NotTo(HaveOccurred())
		Expect(resp.Allowed).To(BeTrue())
		Expect(resp.Patch).NotTo(BeEmpty(), "the pod is injected")
		said := append([]string{string(resp.Patch)}, resp.Warnings...)
		if resp.Result != nil {
			said = append(said, resp.Result.Message)
		}
		for _, secret := range []string{"victim-orders", "1.3"} {
			Expect(said).NotTo(ContainElement(ContainSubstring(secret)), "the response reveals the backend's %s", secret)
		}
		Expect(string(resp.Patch)).To(ContainSubstring(podinject.RedisConfigMapName), "it names the ConfigMap of the pod's namespace")
		plain, err := send(anyClient(), plainURL, review(victim, "forged"))
		Expect(err).NotTo(HaveOccurred())
		// The patch's operations come in map order: the same operations, byte for byte.
		Expect(patchOps(resp.Patch)).To(Equal(patchOps(plain.Patch)), "the patch of a namespace the cluster's Redis serves")
		Expect(resp.Warnings).To(Equal(plain.Warnings))
		other, err := send(anyClient(), url, review(bystander, "forged"))
		Expect(err).NotTo(HaveOccurred())
		Expect(patchOps(resp.Patch)).To(Equal(patchOps(other.Patch)), "and of another namespace without a backend")

		By("a real pod of that namespace: its sidecar gets the backend's settings")
		reconcileRedisConfigMap(ctx, cfg, victim)
		out, _, err := podinject.NewInjector(cfg, true).Inject(ctx, annotatedPod(victim, "real"))
		Expect(err).NotTo(HaveOccurred())
		env, args := kubeletView(ctx, out)
		env[contract.EnvPodNamespace] = victim
		sc, err := app.ParseConfig(args, func(k string) string { return env[k] }, GinkgoWriter)
		Expect(err).NotTo(HaveOccurred())
		Expect(sc.RedisURL).To(Equal(victimRedis.URL))
		Expect(sc.RedisTLS.ServerName).To(Equal("victim-orders.internal"))
		Expect(sc.RedisTLS.MinVersion).To(Equal("1.3"))

		By("a real pod of the bystander's namespace, before any ConfigMap there: the cluster's Redis")
		out, _, err = podinject.NewInjector(cfg, true).Inject(ctx, annotatedPod(bystander, "real"))
		Expect(err).NotTo(HaveOccurred())
		env, args = kubeletView(ctx, out)
		env[contract.EnvPodNamespace] = bystander
		sc, err = app.ParseConfig(args, func(k string) string { return env[k] }, GinkgoWriter)
		Expect(err).NotTo(HaveOccurred())
		Expect(sc.RedisURL).To(Equal(cfg.RedisURL))
		Expect(sc.RedisTLS.MinVersion).To(Equal("1.2"))
	})

	It("of another namespace's Deployment's pod learns neither its pool nor its replicas", func(ctx SpecContext) {
		const ns = "forged-workload"
		createNamespace(ns)
		budget := &connbudget.Publisher{}
		budget.Publish(&connbudget.Snapshot{MaxClients: 1000, Reserve: 14})
		cfg := testConfig(podinject.NativeSidecarsAuto)
		cfg.Backends = nsBackends{ns: {Budget: budget}}
		url := serveWebhook(cfg)
		deploymentPod := func(name string, kv ...string) *corev1.Pod {
			pod := annotatedPod(ns, name, kv...)
			pod.Labels = map[string]string{appsv1.DefaultDeploymentUniqueLabelKey: "5d8f"}
			pod.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "checkout-5d8f", UID: "u", Controller: new(true)}}
			return pod
		}
		// The operations of the patches, in any order (the patch's order is not stable).
		forge := func() [2][]any {
			GinkgoHelper()
			var out [2][]any
			for i, pod := range []*corev1.Pod{deploymentPod("forged"), deploymentPod("forged", contract.AnnotationRedisPoolSize, "50")} {
				resp, err := send(anyClient(), url, reviewOf(pod))
				Expect(err).NotTo(HaveOccurred())
				Expect(resp.Allowed).To(BeTrue())
				Expect(resp.Warnings).To(BeEmpty(), "no warning tells an unverified caller of the workload's share")
				Expect(json.Unmarshal(resp.Patch, &out[i])).To(Succeed())
				if i == 0 {
					Expect(string(resp.Patch)).To(ContainSubstring("pool-size.deployment.checkout"), "it names the key of the pod's own workload")
				}
			}
			return out
		}
		before := forge()

		By("the workload existing, with an HPA and a pool sized from the budget: the same patches")
		injected := corev1.PodTemplateSpec{
			ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "checkout"}, Annotations: map[string]string{contract.AnnotationInject: "true"}},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "app"}}},
		}
		selector := &metav1.LabelSelector{MatchLabels: map[string]string{"app": "checkout"}}
		deployment := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "checkout"}, Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](2), Selector: selector, Template: injected,
		}}
		Expect(k8s.Create(ctx, deployment)).To(Succeed())
		Expect(k8s.Create(ctx, &appsv1.ReplicaSet{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "checkout-5d8f", OwnerReferences: []metav1.OwnerReference{{
			APIVersion: "apps/v1", Kind: "Deployment", Name: "checkout", UID: deployment.UID, Controller: new(true),
		}}}, Spec: appsv1.ReplicaSetSpec{Replicas: ptr.To[int32](2), Selector: selector, Template: injected}})).To(Succeed())
		Expect(k8s.Create(ctx, &autoscalingv2.HorizontalPodAutoscaler{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "checkout"},
			Spec: autoscalingv2.HorizontalPodAutoscalerSpec{
				ScaleTargetRef: autoscalingv2.CrossVersionObjectReference{APIVersion: "apps/v1", Kind: "Deployment", Name: "checkout"}, MaxReplicas: 200,
			}})).To(Succeed())
		reconcileRedisConfigMap(ctx, cfg, ns)
		after := forge()
		for i := range after {
			Expect(after[i]).To(ConsistOf(before[i]...), "the patches say nothing the reviews did not")
		}

		By("a real pod of the Deployment: its sidecar gets the pool and replicas from the namespace's ConfigMap")
		out, _, err := podinject.NewInjector(cfg, true).Inject(ctx, deploymentPod("real"))
		Expect(err).NotTo(HaveOccurred())
		env, _ := kubeletView(ctx, out)
		// maxclients 1000 - 14 reserved, one namespace, one workload: 986 / 200 = 4.
		Expect(env).To(HaveKeyWithValue(contract.EnvBudgetRedisPoolSize, "4"))
		Expect(env).To(HaveKeyWithValue(contract.EnvFallbackReplicas, "200"))
	})

	It("is answered only with a client certificate the configured CA signed, under a configured name", func(ctx SpecContext) {
		createNamespace(victim)
		ca, caKey := newCA("cluster client CA")
		other, otherKey := newCA("some other CA")
		apiserver := clientCert("kube-apiserver-admission", ca, caKey)
		dir := GinkgoT().TempDir()
		caFile := filepath.Join(dir, "ca.crt")
		Expect(os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Raw}), 0o600)).To(Succeed())

		cfg := testConfig(podinject.NativeSidecarsTrue)
		cfg.ClientCAFile, cfg.ClientNames = caFile, []string{"kube-apiserver-admission"}
		Expect(cfg.Validate()).To(Succeed())
		url := serveWebhook(cfg)

		resp, err := send(anyClient(apiserver), url, review(victim, "from-apiserver"))
		Expect(err).NotTo(HaveOccurred())
		Expect(resp.Allowed).To(BeTrue())
		Expect(resp.Patch).NotTo(BeEmpty())

		for what, client := range map[string]*http.Client{
			"no certificate":                   anyClient(),
			"a certificate of another CA":      anyClient(clientCert("kube-apiserver-admission", other, otherKey)),
			"the CA's certificate of any name": anyClient(clientCert("alice", ca, caKey)),
		} {
			_, err := send(client, url, review(victim, "forged"))
			Expect(err).To(HaveOccurred(), "a client with %s is answered", what)
		}

		By("a CA file that is not one: the manager does not start")
		Expect(os.WriteFile(caFile, []byte("not a certificate"), 0o600)).To(Succeed())
		Expect(cfg.Validate()).To(MatchError(ContainSubstring("--webhook-client-ca-file")))
		cfg.ClientCAFile = ""
		Expect(cfg.Validate()).To(MatchError(ContainSubstring("--webhook-client-names needs --webhook-client-ca-file")))
	})
})

func newCA(name string) (*x509.Certificate, *ecdsa.PrivateKey) {
	GinkgoHelper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	Expect(err).NotTo(HaveOccurred())
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	Expect(err).NotTo(HaveOccurred())
	cert, err := x509.ParseCertificate(der)
	Expect(err).NotTo(HaveOccurred())
	return cert, key
}

func clientCert(name string, ca *x509.Certificate, caKey *ecdsa.PrivateKey) tls.Certificate {
	GinkgoHelper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	Expect(err).NotTo(HaveOccurred())
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	Expect(err).NotTo(HaveOccurred())
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}
