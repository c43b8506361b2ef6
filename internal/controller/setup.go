package controller

import (
	"context"
	"fmt"
	"maps"
	"time"

	"github.com/redis/go-redis/v9"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"

	"github.com/redline-dev/redline/internal/connbudget"
	"github.com/redline-dev/redline/internal/fleet"
)

// DefaultCheckInterval is how often the manager checks, on every Redis node, that the scripts
// are loaded and that the node did not restart (--script-check-interval): a second, so that a
// Redis restarted empty is given its scripts and its ACL users within a second of answering
// again. Each check is one SCRIPT EXISTS and one INFO server per node.
const DefaultCheckInterval = time.Second

// Config wires the controller to Redis.
type Config struct {
	// Redis is the client used for SCRIPT LOAD / SCRIPT EXISTS (standalone or cluster).
	Redis redis.UniversalClient
	// RedisTimeout bounds the script check of one reconcile (default 5s).
	RedisTimeout time.Duration
	// CheckInterval is how often the scripts are re-checked in Redis (default
	// DefaultCheckInterval).
	CheckInterval time.Duration
	// MaxBackoff caps the retry delay while Redis is down (default 30s).
	MaxBackoff time.Duration
	// HeartbeatTTL is how long a sidecar counts as live after its last heartbeat (default
	// fleet.TTL of the sidecars' default interval, 15s).
	HeartbeatTTL time.Duration
	// ResyncInterval is how often each namespace is re-read to follow sidecar heartbeats into
	// the Enforced condition (default 15s).
	ResyncInterval time.Duration
	// RedisMaxClients, when positive, is Redis's maxclients, for a Redis that refuses CONFIG GET.
	RedisMaxClients int64
	// ManagerConnections are the manager's own connections per Redis node, counted in the
	// budget (default ManagerRedisPoolSize).
	ManagerConnections int64
	// BudgetInterval is how often the connection budget is recomputed without an event
	// (default 30s).
	BudgetInterval time.Duration
	// SidecarRedisPoolSize is the manager's --sidecar-redis-pool-size, the injector's
	// podinject.Config.SidecarRedisPoolSize: the largest pool the budget gives (0:
	// contract.DefaultRedisPoolSize).
	SidecarRedisPoolSize int64
	// Nodes runs a function on every Redis node, replicas included (redisconn.Nodes.Each),
	// for what each node keeps of its own (maxmemory-policy); nil: Redis alone, which is
	// right for a single server.
	Nodes func(ctx context.Context, fn func(context.Context, *redis.Client) error) error
	// Budget receives every computed budget of Redis, for the pod injector to size pools
	// from; nil: a Publisher of the default backend's own.
	Budget *connbudget.Publisher
	// Backends, when set, are the namespaces' backends, and Redis, Nodes, RedisMaxClients and
	// Budget are not read: its Default is the manager's Redis.
	Backends *Backends
	// Dial, when set, serves RedisBackends: their Redis is dialed with it (DialBackend).
	Dial BackendDialer
	// Namespace is the manager's, where RedisBackends' credentials Secrets live.
	Namespace string
	// TopKeysInterval is how often the sidecars' top-keys summaries are merged into the
	// policies' status (default DefaultTopKeysInterval); negative turns it off.
	TopKeysInterval time.Duration
}

// CacheOptions restricts the manager's cache to what it reads (see slimByObject): ConfigMaps
// by name, workloads and HPAs without what a tenant can grow.
func CacheOptions(opts cache.Options) cache.Options {
	if opts.ByObject == nil {
		opts.ByObject = map[client.Object]cache.ByObject{}
	}
	maps.Copy(opts.ByObject, slimByObject())
	return opts
}

// Setup adds the policy reconciler, the script watcher, the connection budget, the memory
// policy check and, with Config.Dial, the RedisBackend reconciler to mgr. It returns the
// namespaces' backends, for the tenant ACL reconciler and the injector.
func Setup(mgr ctrl.Manager, cfg Config) (*Backends, error) {
	if cfg.CheckInterval == 0 {
		cfg.CheckInterval = DefaultCheckInterval
	}
	if cfg.HeartbeatTTL == 0 {
		cfg.HeartbeatTTL = fleet.TTL(fleet.DefaultInterval)
	}
	backends := cfg.Backends
	if backends == nil {
		nodes := cfg.Nodes
		if nodes == nil {
			c, ok := cfg.Redis.(*redis.Client)
			if !ok {
				return nil, fmt.Errorf("controller setup: Config.Nodes is needed for a %T", cfg.Redis)
			}
			nodes = func(ctx context.Context, fn func(context.Context, *redis.Client) error) error { return fn(ctx, c) }
		}
		def := NewBackend("", "", cfg.Redis, nodes, nil, cfg.RedisMaxClients, cfg.HeartbeatTTL, nil)
		if cfg.Budget != nil {
			def.Budget = cfg.Budget
		}
		var reader client.Reader
		if cfg.Dial != nil {
			reader = mgr.GetCache()
		}
		backends = NewBackends(def, reader)
	}
	for _, be := range backends.All() {
		be.Scripts.Log = mgr.GetLogger().WithName("scripts")
	}
	if cfg.Dial != nil {
		br := &RedisBackendReconciler{
			Client: mgr.GetClient(), Reader: mgr.GetCache(), APIReader: mgr.GetAPIReader(),
			Backends: backends, Namespace: cfg.Namespace, Dial: cfg.Dial,
			RedisTimeout: cfg.RedisTimeout, Elected: mgr.Elected(),
		}
		if err := br.SetupWithManager(mgr); err != nil {
			return nil, err
		}
	}
	events := make(chan event.GenericEvent, 1)
	if err := mgr.Add(&ScriptWatcher{
		Backends: backends,
		Interval: cfg.CheckInterval,
		Log:      mgr.GetLogger().WithName("scripts"),
		Events:   events,
	}); err != nil {
		return nil, err
	}
	r := &NamespaceReconciler{
		Client:         mgr.GetClient(),
		Direct:         mgr.GetAPIReader(),
		Policies:       mgr.GetCache(),
		Backends:       backends,
		Recorder:       mgr.GetEventRecorder("redline-controller"),
		RedisTimeout:   cfg.RedisTimeout,
		ScriptEvents:   events,
		MaxBackoff:     cfg.MaxBackoff,
		ResyncInterval: cfg.ResyncInterval,
	}
	if err := mgr.AddReadyzCheck("policies", r.ReadyCheck(mgr.GetCache())); err != nil {
		return nil, fmt.Errorf("adding readiness check: %w", err)
	}
	if err := r.SetupWithManager(mgr); err != nil {
		return nil, err
	}
	if cfg.ManagerConnections == 0 {
		cfg.ManagerConnections = ManagerRedisPoolSize
	}
	b := &BudgetReconciler{
		Client:             mgr.GetClient(),
		Policies:           mgr.GetCache(),
		Backends:           backends,
		Recorder:           mgr.GetEventRecorder("redline-controller"),
		ManagerConnections: cfg.ManagerConnections,
		PoolCeiling:        cfg.SidecarRedisPoolSize,
		RedisTimeout:       cfg.RedisTimeout,
		Interval:           cfg.BudgetInterval,
		MaxBackoff:         cfg.MaxBackoff,
		Elected:            mgr.Elected(),
	}
	if err := b.SetupWithManager(mgr); err != nil {
		return nil, err
	}
	if cfg.TopKeysInterval >= 0 {
		if err := mgr.Add(&TopKeysWriter{
			Client: mgr.GetClient(), Policies: mgr.GetCache(), Direct: mgr.GetAPIReader(), Backends: backends,
			Interval: cfg.TopKeysInterval, RedisTimeout: cfg.RedisTimeout,
			Log: mgr.GetLogger().WithName("topkeys"),
		}); err != nil {
			return nil, err
		}
	}
	m := &MemoryPolicyReconciler{
		Client: mgr.GetClient(), Policies: mgr.GetCache(), Backends: backends,
		Recorder: mgr.GetEventRecorder("redline-controller"),
		Interval: cfg.BudgetInterval, RedisTimeout: cfg.RedisTimeout, MaxBackoff: cfg.MaxBackoff,
	}
	return backends, m.SetupWithManager(mgr)
}
