// Command manager runs Redline's control plane in one process: the controllers (policies
// compiled into per-namespace ConfigMaps, the scripts kept loaded in Redis and a restarted node's
// users set again, the connection budget, the memory policy check, each namespace's Redis user
// and RedisBackends, the sidecars' top keys written to status) and the pod injection webhook
// with its serving certificate.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	v1alpha1 "github.com/redline-dev/redline/api/v1alpha1"
	"github.com/redline-dev/redline/internal/backend"
	"github.com/redline-dev/redline/internal/controller"
	"github.com/redline-dev/redline/internal/controller/tenantacl"
	"github.com/redline-dev/redline/internal/manager"
	"github.com/redline-dev/redline/internal/redisconn"
	"github.com/redline-dev/redline/internal/sidecar/contract"
	"github.com/redline-dev/redline/internal/webhook/podinject"
)

func main() {
	if err := run(); err != nil {
		ctrl.Log.WithName("setup").Error(err, "manager stopped")
		os.Exit(1)
	}
}

func run() error {
	fs := flag.NewFlagSet(os.Args[0], flag.ExitOnError)
	o := manager.BindFlags(fs, os.Getenv)
	_ = fs.Parse(os.Args[1:]) // ExitOnError: a bad flag exits with its message
	zapOpts := o.Zap
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&zapOpts)))
	log := ctrl.Log.WithName("setup")
	if err := checkSidecarDefaults(o); err != nil {
		return err
	}
	tlsFileError := func(err error) { log.Error(err, "redis TLS files changed but cannot be used") }
	def, err := dialManagerRedis(o, tlsFileError)
	if err != nil {
		return err
	}
	defer func() { _ = def.Close() }()
	// Before the manager, which reaches the API server: a Redis that refuses ACLs stops it at once.
	if err := probeTenantACL(o.TenantACL, def); err != nil {
		return err
	}
	mgr, err := newManager(o)
	if err != nil {
		return err
	}
	if err := setup(mgr, o, def, tlsFileError); err != nil {
		return err
	}
	log.Info("starting manager", "redis", redisconn.RedactURL(o.RedisURL), "leaderElection", o.LeaderElect)
	return mgr.Start(ctrl.SetupSignalHandler())
}

// checkSidecarDefaults completes and checks what the injector gives sidecars, before anything
// connects: a bad sidecar default would be injected into every pod.
func checkSidecarDefaults(o *manager.Options) error {
	webhookCfg := &o.Webhook
	if webhookCfg.RedisURL == "" {
		// Sidecars use the manager's Redis, under the same name and versions (their CA and
		// certificate come from their namespace's Secret, --sidecar-redis-tls-secret).
		webhookCfg.RedisURL = o.RedisURL
		webhookCfg.SidecarRedisTLS.DefaultFrom(o.RedisTLS)
	}
	if err := webhookCfg.Validate(); err != nil {
		return fmt.Errorf("checking the webhook and sidecar flags: %w", err)
	}
	// A password in the URL sidecars get would be every tenant's (their pods' environment). A
	// sentinel URL's is no exception: with the sentinels' credential a tenant can SENTINEL
	// MONITOR the group at a server of its own and collect every client's password there.
	// Sidecars get a read-only sentinel user in their namespace's Secret instead.
	if o.TenantACL != tenantacl.ModeOff && redisconn.RedactURL(webhookCfg.RedisURL) != webhookCfg.RedisURL {
		return errors.New("the Redis URL given to sidecars (--sidecar-redis-url, default --redis-url) carries credentials every tenant could read: put the admin password in --redis-password-file (and the sentinels' in --redis-sentinel-password-file)")
	}
	return nil
}

// dialManagerRedis builds the manager's clients for its own Redis, the backend of every
// namespace no RedisBackend selects; its URL for sidecars is the injector's.
func dialManagerRedis(o *manager.Options, tlsFileError func(error)) (*backend.Backend, error) {
	password, err := redisPassword(o.RedisPasswordFile)
	if err != nil {
		return nil, err
	}
	sentinelPassword := ""
	if o.SentinelPasswordFile != "" {
		if sentinelPassword, err = readSecretFile(o.SentinelPasswordFile); err != nil {
			return nil, fmt.Errorf("reading the sentinel password file: %w", err)
		}
	}
	creds := backend.Credentials{
		Username: o.RedisUsername, Password: password, SentinelUsername: o.SentinelUser, SentinelPassword: sentinelPassword,
	}
	opts := backend.ManagerOptions(creds, o.RedisTLS, tlsFileError)
	// The nodes' clients (a node's own commands, the sentinels) keep redisconn's pool defaults.
	nodeOpts := opts
	nodeOpts.VerifyMaster, nodeOpts.PoolSize, nodeOpts.PoolTimeout = false, 0, 0
	def, err := backend.DialURL("", o.RedisURL, o.RedisMaxClients, opts, nodeOpts, o.HeartbeatTTL)
	if err != nil {
		return nil, fmt.Errorf("configuring redis: %w", err)
	}
	def.URL = o.Webhook.RedisURL
	return def, nil
}

// probeTenantACL stops the manager at once, with --redis-tenant-acl=required, when its Redis
// (or sentinels) refuse ACLs.
func probeTenantACL(mode string, def *backend.Backend) error {
	if mode != tenantacl.ModeRequired {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := tenantacl.Probe(ctx, def.Nodes)
	if err == nil && def.Sentinels != nil {
		err = tenantacl.ProbeSentinels(ctx, def.Sentinels)
	}
	if err != nil {
		return fmt.Errorf("--redis-tenant-acl=required: %w", err)
	}
	return nil
}

// newManager is the controller-runtime manager with the webhook server and the slim cache.
func newManager(o *manager.Options) (ctrl.Manager, error) {
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return nil, err
	}
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	mgr, err := ctrl.NewManager(ctrl.GetConfigOrDie(), ctrl.Options{
		Scheme:                  scheme,
		Metrics:                 metricsserver.Options{BindAddress: o.MetricsAddr},
		HealthProbeBindAddress:  o.ProbeAddr,
		LeaderElection:          o.LeaderElect,
		LeaderElectionID:        "redline-manager.redline.dev",
		LeaderElectionNamespace: o.LeaderElectionNamespace,
		// Stepping down at once on shutdown lets the next replica take over without waiting
		// for the lease to expire.
		LeaderElectionReleaseOnCancel: true,
		Cache:                         controller.CacheOptions(cache.Options{}),
		WebhookServer:                 podinject.NewServer(o.Webhook),
	})
	if err != nil {
		return nil, fmt.Errorf("creating manager: %w", err)
	}
	return mgr, nil
}

// setup adds the controllers, the tenant ACL reconciler and the injector to mgr, all on one
// registry of backends: the manager's Redis serves every namespace no RedisBackend selects.
// Each backend's budget reconciler publishes its connection budget; the injector sizes new
// pods' Redis pools from their namespace's, in this process, and gives them its URL.
func setup(mgr ctrl.Manager, o *manager.Options, def *backend.Backend, tlsFileError func(error)) error {
	webhookCfg := &o.Webhook
	backends := backend.NewRegistry(def, mgr.GetCache())
	webhookCfg.Backends = backends
	if err := controller.Setup(mgr, controller.Config{
		Backends: backends, RedisTimeout: o.RedisTimeout, CheckInterval: o.CheckInterval, MaxBackoff: o.MaxBackoff,
		ResyncInterval: o.Resync, BudgetInterval: o.BudgetInterval,
		TopKeysInterval: topKeysInterval(o.TopKeysInterval),
		// The injector's ceiling, so that the budget counts the pools it gives.
		SidecarRedisPoolSize: int64(webhookCfg.SidecarRedisPoolSize),
		Namespace:            webhookCfg.Namespace,
		// A RedisBackend over TLS is verified with the manager's CA bundle and given its client
		// certificate, under the backend's own server name.
		Dial: func(name string, spec v1alpha1.RedisBackendSpec, creds backend.Credentials) (*backend.Backend, error) {
			return backend.Dial(name, spec, creds, o.HeartbeatTTL, o.RedisTLS, tlsFileError)
		},
	}); err != nil {
		return fmt.Errorf("setting up controller: %w", err)
	}
	if err := controller.SetupTenantACL(mgr, controller.TenantACLConfig{
		Mode: o.TenantACL, Backends: backends, SecretName: webhookCfg.RedisSecret,
		KeySecret: types.NamespacedName{Namespace: webhookCfg.Namespace, Name: o.ACLKeySecret},
		Rotation:  o.CredentialRotation, RedisTimeout: o.RedisTimeout, MaxBackoff: o.MaxBackoff, CheckInterval: o.CheckInterval,
	}); err != nil {
		return fmt.Errorf("setting up tenant redis users: %w", err)
	}
	if err := podinject.Setup(mgr, *webhookCfg); err != nil {
		return fmt.Errorf("setting up pod injection webhook: %w", err)
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		return err
	}
	return mgr.AddReadyzCheck("readyz", healthz.Ping)
}

// redisPassword reads the password from a file (trailing newline dropped) or from the
// environment. It is never accepted as a flag value, which would show in process listings.
func redisPassword(file string) (string, error) {
	if file == "" {
		return os.Getenv(contract.EnvRedisPassword), nil
	}
	pw, err := readSecretFile(file)
	if err != nil {
		return "", fmt.Errorf("reading redis password file: %w", err)
	}
	return pw, nil
}

// readSecretFile reads a password file, trailing newline dropped; empty is an error.
func readSecretFile(file string) (string, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return "", err
	}
	pw := strings.TrimRight(string(data), "\r\n")
	if pw == "" {
		return "", fmt.Errorf("%s is empty", file)
	}
	return pw, nil
}

// topKeysInterval is the flag as controller.Config takes it: off is negative there.
func topKeysInterval(d time.Duration) time.Duration {
	if d <= 0 {
		return -1
	}
	return d
}
