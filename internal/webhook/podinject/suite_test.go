package podinject_test

import (
	"context"
	"flag"
	"os"
	"path/filepath"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/redline-dev/redline/internal/testutil/apiwarn"
	"github.com/redline-dev/redline/internal/webhook/podinject"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata from the current output")

var (
	restCfg   *rest.Config
	k8s       client.Client
	warnings  *apiwarn.Recorder
	warnK8s   client.Client // k8s, with admission warnings recorded in warnings
	testEnv   *envtest.Environment
	cancelMgr context.CancelFunc
	scheme    = runtime.NewScheme()
)

func TestPodInject(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "Pod Injection Webhook Suite")
}

var _ = BeforeSuite(func() {
	logf.SetLogger(zap.New(zap.WriteTo(GinkgoWriter), zap.UseDevMode(true)))
	Expect(os.Getenv("KUBEBUILDER_ASSETS")).NotTo(BeEmpty(),
		"KUBEBUILDER_ASSETS is not set: run the tests with `make test`, which installs etcd and kube-apiserver (hack/setup-envtest.sh)")
	Expect(clientgoscheme.AddToScheme(scheme)).To(Succeed())

	testEnv = &envtest.Environment{
		WebhookInstallOptions: envtest.WebhookInstallOptions{
			Paths: []string{filepath.Join("..", "..", "..", "config", "webhook")},
		},
	}
	var err error
	restCfg, err = testEnv.Start()
	Expect(err).NotTo(HaveOccurred())
	k8s, err = client.New(restCfg, client.Options{Scheme: scheme})
	Expect(err).NotTo(HaveOccurred())
	warnings = &apiwarn.Recorder{}
	wcfg := rest.CopyConfig(restCfg)
	wcfg.WarningHandler = warnings
	warnK8s, err = client.New(wcfg, client.Options{Scheme: scheme})
	Expect(err).NotTo(HaveOccurred())

	wio := &testEnv.WebhookInstallOptions
	mgr, err := ctrl.NewManager(restCfg, ctrl.Options{
		Scheme:         scheme,
		Metrics:        metricsserver.Options{BindAddress: "0"},
		LeaderElection: false,
		WebhookServer: webhook.NewServer(webhook.Options{
			Host: wio.LocalServingHost, Port: wio.LocalServingPort, CertDir: wio.LocalServingCertDir,
		}),
	})
	Expect(err).NotTo(HaveOccurred())
	// auto: the envtest API server is 1.29+, so this also checks that discovery picks native.
	Expect(podinject.Setup(mgr, testConfig(podinject.NativeSidecarsAuto))).To(Succeed())

	ctx, cancel := context.WithCancel(context.Background())
	cancelMgr = cancel
	go func() {
		defer GinkgoRecover()
		Expect(mgr.Start(ctx)).To(Succeed())
	}()

	// The webhook is up once a probe pod in a scratch namespace comes back injected.
	createNamespace("webhook-probe")
	Eventually(func(g Gomega) {
		pod := annotatedPod("webhook-probe", "")
		g.Expect(k8s.Create(ctx, pod)).To(Succeed())
		g.Expect(pod.Annotations).To(HaveKey("redline.dev/injected"))
	}).WithTimeout(30 * time.Second).WithPolling(200 * time.Millisecond).Should(Succeed())
})

var _ = AfterSuite(func() {
	if cancelMgr != nil {
		cancelMgr()
	}
	if testEnv != nil {
		Expect(testEnv.Stop()).To(Succeed())
	}
})

// testConfig is the webhook configuration of the tests (and of the golden files).
func testConfig(native string) podinject.Config {
	cfg := podinject.DefaultConfig()
	cfg.SidecarImage = "example.test/redline-sidecar:v0.1.0"
	cfg.RedisURL = "redis://redis.redline-system.svc:6379"
	cfg.RedisSecret = "redline-redis"
	cfg.NativeSidecars = native
	cfg.Namespace = "redline-system"
	return cfg
}

func createNamespace(name string) {
	GinkgoHelper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	Expect(client.IgnoreAlreadyExists(k8s.Create(context.Background(), ns))).To(Succeed())
}

// annotatedPod is an application pod that opts in, with the given extra annotations as
// key, value pairs.
func annotatedPod(namespace, name string, kv ...string) *corev1.Pod {
	pod := plainPod(namespace, name)
	if name == "" {
		pod.GenerateName = "pod-"
	}
	pod.Annotations = map[string]string{"redline.dev/inject": "true", "redline.dev/upstream-port": "8080"}
	for i := 0; i+1 < len(kv); i += 2 {
		if kv[i+1] == "" {
			delete(pod.Annotations, kv[i])
			continue
		}
		pod.Annotations[kv[i]] = kv[i+1]
	}
	return pod
}

// plainPod is an application pod without Redline annotations.
func plainPod(namespace, name string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name, Labels: map[string]string{"app": "checkout"}},
		Spec: corev1.PodSpec{
			Containers: []corev1.Container{{
				Name:  "app",
				Image: "example.test/checkout:1.0",
				Ports: []corev1.ContainerPort{{ContainerPort: 8080}},
				VolumeMounts: []corev1.VolumeMount{{
					Name: "data", MountPath: "/data",
				}},
			}},
			Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}},
		},
	}
}
