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
	// Budget receives every computed budget, for the pod injector to size pools from (the
	// manager gives the same Publisher to podinject.Config.Budget); nil publishes nothing.
	Budget *connbudget.Publisher
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

// Setup adds the policy reconciler, the script watcher and the connection budget to mgr.
func Setup(mgr ctrl.Manager, cfg Config) error {
	if cfg.CheckInterval == 0 {
		cfg.CheckInterval = DefaultCheckInterval
	}
	if cfg.HeartbeatTTL == 0 {
		cfg.HeartbeatTTL = fleet.TTL(fleet.DefaultInterval)
	}
	store := &RedisScripts{Client: cfg.Redis, Nodes: cfg.Nodes, Log: mgr.GetLogger().WithName("scripts")}
	events := make(chan event.GenericEvent, 1)
	if err := mgr.Add(&ScriptWatcher{
		Scripts:  store,
		Interval: cfg.CheckInterval,
		Log:      mgr.GetLogger().WithName("scripts"),
		Events:   events,
	}); err != nil {
		return err
	}
	r := &NamespaceReconciler{
		Client:         mgr.GetClient(),
		Direct:         mgr.GetAPIReader(),
		Policies:       mgr.GetCache(),
		Scripts:        store,
		Recorder:       mgr.GetEventRecorder("redline-controller"),
		RedisTimeout:   cfg.RedisTimeout,
		ScriptEvents:   events,
		MaxBackoff:     cfg.MaxBackoff,
		Sidecars:       &RedisSidecars{Client: cfg.Redis, TTL: cfg.HeartbeatTTL},
		ResyncInterval: cfg.ResyncInterval,
	}
	if err := mgr.AddReadyzCheck("policies", r.ReadyCheck(mgr.GetCache())); err != nil {
		return fmt.Errorf("adding readiness check: %w", err)
	}
	if err := r.SetupWithManager(mgr); err != nil {
		return err
	}
	if cfg.ManagerConnections == 0 {
		cfg.ManagerConnections = ManagerRedisPoolSize
	}
	b := &BudgetReconciler{
		Client:             mgr.GetClient(),
		Policies:           mgr.GetCache(),
		Redis:              &RedisClients{Client: cfg.Redis, MaxClients: cfg.RedisMaxClients},
		Recorder:           mgr.GetEventRecorder("redline-controller"),
		ManagerConnections: cfg.ManagerConnections,
		PoolCeiling:        cfg.SidecarRedisPoolSize,
		RedisTimeout:       cfg.RedisTimeout,
		Interval:           cfg.BudgetInterval,
		MaxBackoff:         cfg.MaxBackoff,
		Budget:             cfg.Budget,
		Elected:            mgr.Elected(),
	}
	if err := b.SetupWithManager(mgr); err != nil {
		return err
	}
	nodes := cfg.Nodes
	if nodes == nil {
		c, ok := cfg.Redis.(*redis.Client)
		if !ok {
			return fmt.Errorf("controller setup: Config.Nodes is needed for a %T", cfg.Redis)
		}
		nodes = func(ctx context.Context, fn func(context.Context, *redis.Client) error) error { return fn(ctx, c) }
	}
	m := &MemoryPolicyReconciler{
		Client: mgr.GetClient(), Policies: mgr.GetCache(), Nodes: nodes,
		Recorder: mgr.GetEventRecorder("redline-controller"),
		Interval: cfg.BudgetInterval, RedisTimeout: cfg.RedisTimeout, MaxBackoff: cfg.MaxBackoff,
	}
	return m.SetupWithManager(mgr)
}
