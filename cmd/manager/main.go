// Command manager runs Redline's controller: it compiles RateLimitPolicies into per-namespace
// ConfigMaps and keeps the limiter's scripts loaded in Redis.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	v1alpha1 "github.com/redline-dev/redline/api/v1alpha1"
	"github.com/redline-dev/redline/internal/controller"
	"github.com/redline-dev/redline/internal/fleet"
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
	var (
		metricsAddr, probeAddr       string
		leaderElect                  bool
		leaderElectionNamespace      string
		redisURL, redisPasswordFile  string
		redisTimeout, checkInterval  time.Duration
		maxBackoff                   time.Duration
		heartbeatTTL, resync         time.Duration
		redisMaxClients              int64
		budgetInterval               time.Duration
		tenantACL, aclKeySecret      string
		sentinelUser, sentinelPWFile string
		credentialRotation           time.Duration
		redisTLS                     redisconn.TLSOptions
	)
	flag.StringVar(&metricsAddr, "metrics-bind-address", ":8080", "Address of the Prometheus metrics endpoint; 0 turns it off.")
	flag.StringVar(&probeAddr, "health-probe-bind-address", ":8081", "Address of /healthz and /readyz.")
	flag.BoolVar(&leaderElect, "leader-elect", false, "Elect a leader, so that only one of several replicas writes.")
	flag.StringVar(&leaderElectionNamespace, "leader-election-namespace", "", "Namespace of the leader election Lease (default: the pod's).")
	flag.StringVar(&redisURL, "redis-url", envOr(contract.EnvRedisURL, "redis://127.0.0.1:6379"),
		"Redis to load scripts into: redis://host:port, rediss://host:port (TLS), redis://h1:p,h2:p,h3:p (cluster) "+
			"or redis+sentinel://s1:p,s2:p/master. Env "+contract.EnvRedisURL+". Put no password here: use --redis-password-file.")
	flag.StringVar(&redisPasswordFile, "redis-password-file", "", "File holding the Redis password (e.g. a mounted Secret). Env "+contract.EnvRedisPassword+" is read otherwise.")
	flag.StringVar(&sentinelUser, "redis-sentinel-username", "", "With redis+sentinel://: the sentinels' ACL user the manager authenticates as (empty: the default user). It must be able to run ACL SETUSER and SENTINEL on every sentinel.")
	flag.StringVar(&sentinelPWFile, "redis-sentinel-password-file", "", "With redis+sentinel://: file holding the sentinels' admin password (e.g. a mounted Secret). Never given to sidecars: they get a read-only sentinel user in their namespace's Secret.")
	flag.StringVar(&redisTLS.CAFile, "redis-tls-ca-file", "", "With rediss:// (or rediss+sentinel://): PEM file of the CAs that sign Redis's and the sentinels' certificates, instead of the system's (e.g. ca.crt of a mounted Secret).")
	flag.StringVar(&redisTLS.CertFile, "redis-tls-cert-file", "", "With rediss://: PEM file of the manager's client certificate, for a Redis that requires one (tls-auth-clients); with --redis-tls-key-file. Read again at a new connection when it changed.")
	flag.StringVar(&redisTLS.KeyFile, "redis-tls-key-file", "", "With rediss://: PEM file of the client certificate's private key.")
	flag.StringVar(&redisTLS.ServerName, "redis-tls-server-name", "", "With rediss://: the name Redis's certificates must carry (empty: the host each connection dials, as the URL, the cluster or the sentinels name it).")
	flag.StringVar(&redisTLS.MinVersion, "redis-tls-min-version", "", "With rediss://: oldest TLS version accepted, 1.2 or 1.3 (empty: 1.2).")
	flag.DurationVar(&redisTimeout, "redis-timeout", 5*time.Second, "Bound on the script check of one reconcile.")
	flag.DurationVar(&checkInterval, "script-check-interval", controller.DefaultCheckInterval, "How often every Redis node, replicas included, is checked for the scripts and for a restart (which lost them and the ACL users): after restarts, failovers, SCRIPT FLUSH.")
	flag.DurationVar(&maxBackoff, "max-backoff", 30*time.Second, "Longest retry delay while Redis is unavailable.")
	flag.DurationVar(&heartbeatTTL, "heartbeat-ttl", fleet.TTL(fleet.DefaultInterval), "How long a sidecar counts as live after its last heartbeat (match the sidecars').")
	flag.DurationVar(&resync, "resync-interval", 15*time.Second, "How often each namespace is re-read to follow sidecar heartbeats into the Enforced condition.")
	flag.Int64Var(&redisMaxClients, "redis-maxclients", 0, "Redis's maxclients, for a Redis that refuses CONFIG GET (managed services); 0 reads it with CONFIG GET.")
	flag.DurationVar(&budgetInterval, "budget-interval", 30*time.Second, "How often the Redis connection budget is recomputed without a workload change (follows connected_clients).")
	flag.StringVar(&tenantACL, "redis-tenant-acl", controller.TenantACLAuto, "Per-namespace Redis users: auto (an ACL user per namespace with policies, limited to its keys; where Redis refuses ACL commands, the admin's shared credential and TenantIsolation=False), required (auto, but do not start when Redis refuses ACLs) or off (the admin's shared credential everywhere).")
	flag.StringVar(&aclKeySecret, "redis-acl-key-secret", "redline-redis-acl", "Secret in the manager's namespace holding the key namespaces' Redis passwords are derived from (created on first use).")
	flag.DurationVar(&credentialRotation, "redis-credential-rotation", 24*time.Hour, "How often each namespace's Redis password changes; the previous one stays valid one more period.")
	// Pod injection webhook flags (--sidecar-*, --webhook-*, --native-sidecars).
	webhookCfg := podinject.DefaultConfig()
	webhookCfg.BindFlags(flag.CommandLine)
	zapOpts := zap.Options{}
	zapOpts.BindFlags(flag.CommandLine)
	flag.Parse()
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&zapOpts)))
	log := ctrl.Log.WithName("setup")
	if webhookCfg.RedisURL == "" {
		// Sidecars use the manager's Redis, under the same name and versions (their CA and
		// certificate come from their namespace's Secret, --sidecar-redis-tls-secret).
		webhookCfg.RedisURL = redisURL
		webhookCfg.SidecarRedisTLS.DefaultFrom(redisTLS)
	}
	// Before anything connects: a bad sidecar default would be injected into every pod.
	if err := webhookCfg.Validate(); err != nil {
		return fmt.Errorf("checking the webhook and sidecar flags: %w", err)
	}

	// A password in the URL sidecars get would be every tenant's (their pods' environment). A
	// sentinel URL's is no exception: with the sentinels' credential a tenant can SENTINEL
	// MONITOR the group at a server of its own and collect every client's password there.
	// Sidecars get a read-only sentinel user in their namespace's Secret instead.
	if tenantACL != controller.TenantACLOff && redisconn.RedactURL(webhookCfg.RedisURL) != webhookCfg.RedisURL {
		return errors.New("the Redis URL given to sidecars (--sidecar-redis-url, default --redis-url) carries credentials every tenant could read: put the admin password in --redis-password-file (and the sentinels' in --redis-sentinel-password-file)")
	}
	password, err := redisPassword(redisPasswordFile)
	if err != nil {
		return err
	}
	sentinelPassword := ""
	if sentinelPWFile != "" {
		if sentinelPassword, err = readSecretFile(sentinelPWFile); err != nil {
			return fmt.Errorf("reading the sentinel password file: %w", err)
		}
	}
	tlsFileError := func(err error) { log.Error(err, "redis TLS files changed but cannot be used") }
	// The manager's calls are not on a request path: timeouts of seconds, a small pool.
	rdb, err := redisconn.NewClient(redisURL, redisconn.Options{
		PoolSize: controller.ManagerRedisPoolSize, DialTimeout: 2 * time.Second, ReadTimeout: 2 * time.Second, WriteTimeout: 2 * time.Second,
		PoolTimeout: 3 * time.Second, Password: password, ClientName: "redline-manager",
		SentinelUsername: sentinelUser, SentinelPassword: sentinelPassword,
		TLS: redisTLS, TLSFileError: tlsFileError,
		// The admin's password goes to the master in the handshake: only to one the sentinels
		// agree on, not to whatever one sentinel answers.
		VerifyMaster: true,
	})
	if err != nil {
		return fmt.Errorf("configuring redis: %w", err)
	}
	defer func() { _ = rdb.Close() }()

	nodes, err := redisconn.NewNodes(redisURL, redisconn.Options{
		DialTimeout: 2 * time.Second, ReadTimeout: 2 * time.Second, WriteTimeout: 2 * time.Second,
		Password: password, ClientName: "redline-manager",
		SentinelUsername: sentinelUser, SentinelPassword: sentinelPassword,
		TLS: redisTLS, TLSFileError: tlsFileError,
	}, rdb)
	if err != nil {
		return fmt.Errorf("configuring redis nodes: %w", err)
	}
	defer func() { _ = nodes.Close() }()
	// Before the manager, which reaches the API server: a Redis that refuses ACLs stops it at once.
	if tenantACL == controller.TenantACLRequired {
		pctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := controller.ProbeTenantACL(pctx, nodes.Each)
		if err == nil && nodes.IsSentinel() {
			err = controller.ProbeSentinels(pctx, nodes.EachSentinel)
		}
		cancel()
		if err != nil {
			return fmt.Errorf("--redis-tenant-acl=required: %w", err)
		}
	}

	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return err
	}
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		return err
	}
	mgr, err := ctrl.NewManager(ctrl.GetConfigOrDie(), ctrl.Options{
		Scheme:                  scheme,
		Metrics:                 metricsserver.Options{BindAddress: metricsAddr},
		HealthProbeBindAddress:  probeAddr,
		LeaderElection:          leaderElect,
		LeaderElectionID:        "redline-manager.redline.dev",
		LeaderElectionNamespace: leaderElectionNamespace,
		// Stepping down at once on shutdown lets the next replica take over without waiting
		// for the lease to expire.
		LeaderElectionReleaseOnCancel: true,
		Cache:                         controller.CacheOptions(cache.Options{}),
		WebhookServer:                 podinject.NewServer(webhookCfg),
	})
	if err != nil {
		return fmt.Errorf("creating manager: %w", err)
	}
	var sentinels func(context.Context, func(context.Context, *redis.Client) error) error
	if nodes.IsSentinel() {
		sentinels = nodes.EachSentinel
	}
	// The manager's Redis serves every namespace no RedisBackend selects. Each backend's
	// budget reconciler publishes its connection budget; the injector sizes new pods' Redis
	// pools from their namespace's, in this process, and gives them its URL.
	backends := controller.NewBackends(
		controller.NewBackend("", webhookCfg.RedisURL, rdb, nodes.Each, sentinels, redisMaxClients, heartbeatTTL, nil),
		mgr.GetCache())
	webhookCfg.Backends = backends
	if _, err := controller.Setup(mgr, controller.Config{
		Backends: backends, RedisTimeout: redisTimeout, CheckInterval: checkInterval, MaxBackoff: maxBackoff,
		HeartbeatTTL: heartbeatTTL, ResyncInterval: resync, BudgetInterval: budgetInterval,
		// The injector's ceiling, so that the budget counts the pools it gives.
		SidecarRedisPoolSize: int64(webhookCfg.SidecarRedisPoolSize),
		Namespace:            webhookCfg.Namespace,
		// A RedisBackend over TLS is verified with the manager's CA bundle and given its client
		// certificate, under the backend's own server name.
		Dial: func(name string, spec v1alpha1.RedisBackendSpec, creds controller.BackendCredentials) (*controller.Backend, error) {
			return controller.DialBackend(name, spec, creds, heartbeatTTL, redisTLS, tlsFileError)
		},
	}); err != nil {
		return fmt.Errorf("setting up controller: %w", err)
	}
	if err := controller.SetupTenantACL(mgr, controller.TenantACLConfig{
		Mode: tenantACL, Backends: backends, SecretName: webhookCfg.RedisSecret,
		KeySecret: types.NamespacedName{Namespace: webhookCfg.Namespace, Name: aclKeySecret},
		Rotation:  credentialRotation, RedisTimeout: redisTimeout, MaxBackoff: maxBackoff, CheckInterval: checkInterval,
	}); err != nil {
		return fmt.Errorf("setting up tenant redis users: %w", err)
	}
	if err := podinject.Setup(mgr, webhookCfg); err != nil {
		return fmt.Errorf("setting up pod injection webhook: %w", err)
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		return err
	}
	if err := mgr.AddReadyzCheck("readyz", healthz.Ping); err != nil {
		return err
	}
	log.Info("starting manager", "redis", redisconn.RedactURL(redisURL), "leaderElection", leaderElect)
	return mgr.Start(ctrl.SetupSignalHandler())
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
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
