package controller_test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/redis/go-redis/v9"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	v1alpha1 "github.com/redline-dev/redline/api/v1alpha1"
	"github.com/redline-dev/redline/internal/backend"
	"github.com/redline-dev/redline/internal/controller"
	"github.com/redline-dev/redline/internal/redisconn"
	"github.com/redline-dev/redline/internal/testutil/apiwarn"
	"github.com/redline-dev/redline/internal/testutil/redistest"
	"github.com/redline-dev/redline/internal/testutil/rlptest"
	"github.com/redline-dev/redline/internal/webhook/podinject"
)

var (
	cfg      *rest.Config
	k8s      client.Client
	testEnv  *envtest.Environment
	redisSrv *redistest.Server
	rdb      *redis.Client
	// suiteBackends are the suite manager's namespaces' Redis (backends_test.go).
	suiteBackends *backend.Registry
	cancelMgr     context.CancelFunc
	warnings      *apiwarn.Recorder
	warnK8s       client.Client // k8s, with admission warnings recorded in warnings
	mgrCache      cache.Cache   // the suite manager's cache, to check what it holds
)

// The policies the specs send, built as the API suite builds them (rlptest).
var (
	policy     = rlptest.Policy
	rawPolicy  = rlptest.RawPolicy
	rawRule    = rlptest.RawRule
	pathPolicy = rlptest.PathPolicy
	pathValue  = rlptest.PathValue
)

func TestController(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "Controller Suite")
}

var _ = BeforeSuite(func() {
	logf.SetLogger(zap.New(zap.WriteTo(GinkgoWriter), zap.UseDevMode(true)))
	Expect(os.Getenv("KUBEBUILDER_ASSETS")).NotTo(BeEmpty(),
		"KUBEBUILDER_ASSETS is not set: run the tests with `make test`, which installs etcd and kube-apiserver (hack/setup-envtest.sh)")

	var err error
	// A low maxclients, so that the connection budget test goes over it with a few replicas.
	redisSrv, err = redistest.Start("--maxclients", strconv.Itoa(budgetMaxClients))
	Expect(err).NotTo(HaveOccurred())
	rdb = redis.NewClient(&redis.Options{Addr: redisSrv.Addr()})

	testEnv = &envtest.Environment{
		CRDDirectoryPaths:     []string{filepath.Join("..", "..", "config", "crd", "bases")},
		ErrorIfCRDPathMissing: true,
		// The pod injector runs beside the controllers, as in cmd/manager: it sizes pools from
		// the budget they compute.
		WebhookInstallOptions: envtest.WebhookInstallOptions{Paths: []string{filepath.Join("..", "..", "config", "webhook")}},
	}
	cfg, err = testEnv.Start()
	Expect(err).NotTo(HaveOccurred())

	scheme := runtime.NewScheme()
	Expect(clientgoscheme.AddToScheme(scheme)).To(Succeed())
	Expect(v1alpha1.AddToScheme(scheme)).To(Succeed())
	k8s, err = client.New(cfg, client.Options{Scheme: scheme})
	Expect(err).NotTo(HaveOccurred())
	warnings = &apiwarn.Recorder{}
	wcfg := rest.CopyConfig(cfg)
	wcfg.WarningHandler = warnings
	warnK8s, err = client.New(wcfg, client.Options{Scheme: scheme})
	Expect(err).NotTo(HaveOccurred())
	// As the chart and config/default install them: policies are written with warnings on.
	installDeprecationWarnings(context.Background())

	wio := &testEnv.WebhookInstallOptions
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:  scheme,
		Metrics: metricsserver.Options{BindAddress: "0"},
		Cache:   controller.CacheOptions(cache.Options{}),
		WebhookServer: webhook.NewServer(webhook.Options{
			Host: wio.LocalServingHost, Port: wio.LocalServingPort, CertDir: wio.LocalServingCertDir,
		}),
	})
	Expect(err).NotTo(HaveOccurred())
	mgrCache = mgr.GetCache()

	// Short timings, so that outages and recoveries show within seconds.
	mgrRedis := redis.NewClient(&redis.Options{
		Addr: redisSrv.Addr(), DialTimeout: 200 * time.Millisecond, ReadTimeout: 500 * time.Millisecond, MaxRetries: -1,
	})
	// As cmd/manager wires them: the manager's Redis is the default backend, RedisBackends are
	// read through the manager's cache.
	backends := backend.NewRegistry(backend.New("", "", mgrRedis, nil, nil, 0, 10*time.Second, nil), mgr.GetCache())
	err = controller.Setup(mgr, controller.Config{
		Backends: backends, RedisTimeout: time.Second, CheckInterval: 300 * time.Millisecond, MaxBackoff: 2 * time.Second,
		ResyncInterval: 300 * time.Millisecond, BudgetInterval: 300 * time.Millisecond,
		// The top-keys specs run their own writer, pass by pass (topkeys_test.go).
		TopKeysInterval: -1,
		// RedisBackends are served as the manager serves them.
		Namespace: backendSecretsNamespace,
		Dial: func(name string, spec v1alpha1.RedisBackendSpec, creds backend.Credentials) (*backend.Backend, error) {
			return backend.Dial(name, spec, creds, 10*time.Second, redisconn.TLSOptions{}, nil)
		},
	})
	Expect(err).NotTo(HaveOccurred())
	suiteBackends = backends
	webhookCfg := podinject.DefaultConfig()
	webhookCfg.SidecarImage = "example.test/redline-sidecar:v0.1.0"
	webhookCfg.NativeSidecars = podinject.NativeSidecarsTrue
	webhookCfg.Backends = backends
	Expect(podinject.Setup(mgr, webhookCfg)).To(Succeed())

	ctx, cancel := context.WithCancel(context.Background())
	cancelMgr = cancel
	go func() {
		defer GinkgoRecover()
		Expect(mgr.Start(ctx)).To(Succeed())
	}()
})

var _ = AfterSuite(func() {
	if cancelMgr != nil {
		cancelMgr()
	}
	if testEnv != nil {
		Expect(testEnv.Stop()).To(Succeed())
	}
	if rdb != nil {
		_ = rdb.Close()
	}
	if redisSrv != nil {
		Expect(redisSrv.Close()).To(Succeed())
	}
})
