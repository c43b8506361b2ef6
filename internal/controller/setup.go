// Package controller wires the manager's control loops, one package each: the policy
// reconciler (policies), the scripts kept loaded (scriptwatcher), the connection budget
// (budget), the memory policy check (memorypolicy), each namespace's Redis user (tenantacl),
// RedisBackends (redisbackend) and the top keys (topkeysstatus). Each namespace is served by
// its backend in internal/backend's registry, which Setup is given.
package controller

import (
	"errors"
	"fmt"
	"maps"
	"time"

	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"

	"github.com/redline-dev/redline/internal/backend"
	"github.com/redline-dev/redline/internal/controller/budget"
	"github.com/redline-dev/redline/internal/controller/memorypolicy"
	"github.com/redline-dev/redline/internal/controller/policies"
	"github.com/redline-dev/redline/internal/controller/redisbackend"
	"github.com/redline-dev/redline/internal/controller/scriptwatcher"
	"github.com/redline-dev/redline/internal/controller/tenantacl"
	"github.com/redline-dev/redline/internal/controller/topkeysstatus"
)

// Config wires the controllers to the namespaces' Redis.
type Config struct {
	// Backends are the namespaces' Redis, the manager's own as their Default; required.
	Backends *backend.Registry
	// Dial, when set, serves RedisBackends: their Redis is dialed with it (backend.Dial).
	Dial redisbackend.Dialer
	// RedisTimeout bounds the Redis calls of one reconcile (default backend.DefaultTimeout).
	RedisTimeout time.Duration
	// CheckInterval is how often the scripts are re-checked in Redis (default
	// backend.DefaultCheckInterval).
	CheckInterval time.Duration
	// MaxBackoff caps the retry delay while Redis is down (default backend.DefaultMaxBackoff).
	MaxBackoff time.Duration
	// ResyncInterval is how often each namespace is re-read to follow sidecar heartbeats into
	// the Enforced condition (default 15s).
	ResyncInterval time.Duration
	// ManagerConnections are the manager's own connections per Redis node, counted in the
	// budget (default backend.ManagerPoolSize).
	ManagerConnections int64
	// BudgetInterval is how often the connection budget is recomputed without an event
	// (default 30s).
	BudgetInterval time.Duration
	// SidecarRedisPoolSize is the manager's --sidecar-redis-pool-size, the injector's
	// podinject.Config.SidecarRedisPoolSize: the largest pool the budget gives (0:
	// contract.DefaultRedisPoolSize).
	SidecarRedisPoolSize int64
	// Namespace is the manager's, where RedisBackends' credentials Secrets live.
	Namespace string
	// TopKeysInterval is how often the sidecars' top-keys summaries are merged into the
	// policies' status (default topkeysstatus.DefaultInterval); negative turns it off.
	TopKeysInterval time.Duration
}

// CacheOptions restricts the manager's cache to what it reads (see policies.SlimByObject): ConfigMaps
// by name, workloads and HPAs without what a tenant can grow.
func CacheOptions(opts cache.Options) cache.Options {
	if opts.ByObject == nil {
		opts.ByObject = map[client.Object]cache.ByObject{}
	}
	maps.Copy(opts.ByObject, policies.SlimByObject())
	return opts
}

// Setup adds to mgr the policy reconciler, the script watcher, the connection budget, the
// memory policy check, the top-keys writer and, with Config.Dial, the RedisBackend reconciler,
// all serving each namespace from its backend in Config.Backends (which the tenant ACL
// reconciler and the injector are given too).
func Setup(mgr ctrl.Manager, cfg Config) error {
	if cfg.Backends == nil || cfg.Backends.Default == nil {
		return errors.New("controller setup: Config.Backends with the manager's Redis as its Default is required")
	}
	if cfg.CheckInterval == 0 {
		cfg.CheckInterval = backend.DefaultCheckInterval
	}
	if cfg.ManagerConnections == 0 {
		cfg.ManagerConnections = backend.ManagerPoolSize
	}
	for _, be := range cfg.Backends.All() {
		be.Scripts.Log = mgr.GetLogger().WithName("scripts")
	}
	for _, add := range []func(ctrl.Manager, Config) error{
		setupBackends, setupPolicies, setupBudget, setupTopKeys, setupMemoryPolicy,
	} {
		if err := add(mgr, cfg); err != nil {
			return err
		}
	}
	return nil
}

// setupBackends adds the RedisBackend reconciler, with Config.Dial.
func setupBackends(mgr ctrl.Manager, cfg Config) error {
	if cfg.Dial == nil {
		return nil
	}
	br := &redisbackend.Reconciler{
		Client: mgr.GetClient(), Reader: mgr.GetCache(), APIReader: mgr.GetAPIReader(),
		Backends: cfg.Backends, Namespace: cfg.Namespace, Dial: cfg.Dial,
		RedisTimeout: cfg.RedisTimeout, Elected: mgr.Elected(),
	}
	return br.SetupWithManager(mgr)
}

// setupPolicies adds the namespace reconciler, its readiness check and the script watcher
// that wakes it.
func setupPolicies(mgr ctrl.Manager, cfg Config) error {
	events := make(chan event.GenericEvent, 1)
	if err := mgr.Add(&scriptwatcher.Watcher{
		Backends: cfg.Backends,
		Interval: cfg.CheckInterval,
		Log:      mgr.GetLogger().WithName("scripts"),
		Events:   events,
	}); err != nil {
		return err
	}
	r := &policies.NamespaceReconciler{
		Client:         mgr.GetClient(),
		Direct:         mgr.GetAPIReader(),
		Policies:       mgr.GetCache(),
		Backends:       cfg.Backends,
		Recorder:       mgr.GetEventRecorder("redline-controller"),
		RedisTimeout:   cfg.RedisTimeout,
		ScriptEvents:   events,
		MaxBackoff:     cfg.MaxBackoff,
		ResyncInterval: cfg.ResyncInterval,
	}
	if err := mgr.AddReadyzCheck("policies", r.ReadyCheck(mgr.GetCache())); err != nil {
		return fmt.Errorf("adding readiness check: %w", err)
	}
	return r.SetupWithManager(mgr)
}

// setupBudget adds the connection budget reconciler.
func setupBudget(mgr ctrl.Manager, cfg Config) error {
	b := &budget.Reconciler{
		Client:             mgr.GetClient(),
		Policies:           mgr.GetCache(),
		Backends:           cfg.Backends,
		Recorder:           mgr.GetEventRecorder("redline-controller"),
		ManagerConnections: cfg.ManagerConnections,
		PoolCeiling:        cfg.SidecarRedisPoolSize,
		RedisTimeout:       cfg.RedisTimeout,
		Interval:           cfg.BudgetInterval,
		MaxBackoff:         cfg.MaxBackoff,
		Elected:            mgr.Elected(),
	}
	return b.SetupWithManager(mgr)
}

// setupTopKeys adds the top-keys writer, unless Config.TopKeysInterval turns it off.
func setupTopKeys(mgr ctrl.Manager, cfg Config) error {
	if cfg.TopKeysInterval < 0 {
		return nil
	}
	return mgr.Add(&topkeysstatus.Writer{
		Client: mgr.GetClient(), Policies: mgr.GetCache(), Direct: mgr.GetAPIReader(), Backends: cfg.Backends,
		Interval: cfg.TopKeysInterval, RedisTimeout: cfg.RedisTimeout,
		Log: mgr.GetLogger().WithName("topkeys"),
	})
}

// setupMemoryPolicy adds the memory policy check.
func setupMemoryPolicy(mgr ctrl.Manager, cfg Config) error {
	m := &memorypolicy.Reconciler{
		Client: mgr.GetClient(), Policies: mgr.GetCache(), Backends: cfg.Backends,
		Recorder: mgr.GetEventRecorder("redline-controller"),
		Interval: cfg.BudgetInterval, RedisTimeout: cfg.RedisTimeout, MaxBackoff: cfg.MaxBackoff,
	}
	return m.SetupWithManager(mgr)
}

// TenantACLConfig wires the tenant ACL reconciler (see SetupTenantACL).
type TenantACLConfig struct {
	// Mode is tenantacl.ModeAuto, tenantacl.ModeRequired or tenantacl.ModeOff.
	Mode string
	// Backends are the namespaces' Redis (see tenantacl.Reconciler.Backends); required.
	Backends *backend.Registry
	// SecretName is the credentials Secret of each namespace (the injector's).
	SecretName string
	// KeySecret holds the key passwords are derived from, in the manager's namespace.
	KeySecret types.NamespacedName
	// Rotation, RedisTimeout, MaxBackoff and CheckInterval: see tenantacl.Reconciler.
	Rotation, RedisTimeout, MaxBackoff, CheckInterval time.Duration
}

// SetupTenantACL adds the tenant ACL reconciler to mgr, on the same backends as Setup's loops.
func SetupTenantACL(mgr ctrl.Manager, cfg TenantACLConfig) error {
	switch cfg.Mode {
	case tenantacl.ModeAuto, tenantacl.ModeRequired, tenantacl.ModeOff:
	default:
		return fmt.Errorf("--redis-tenant-acl=%q: want auto, required or off", cfg.Mode)
	}
	if cfg.Backends == nil {
		return errors.New("tenant ACLs need the namespaces' backends")
	}
	if cfg.SecretName == "" && cfg.Mode != tenantacl.ModeOff {
		return errors.New("tenant ACLs need the sidecars' credentials Secret name (--sidecar-redis-secret)")
	}
	r := &tenantacl.Reconciler{
		Client: mgr.GetClient(), Policies: mgr.GetCache(), APIReader: mgr.GetAPIReader(),
		Backends: cfg.Backends, Mode: cfg.Mode, SecretName: cfg.SecretName, KeySecret: cfg.KeySecret,
		Rotation: cfg.Rotation, RedisTimeout: cfg.RedisTimeout, MaxBackoff: cfg.MaxBackoff,
		CheckInterval: cfg.CheckInterval,
	}
	return r.SetupWithManager(mgr)
}
