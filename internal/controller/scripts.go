package controller

import (
	"context"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/redis/go-redis/v9"
	"sigs.k8s.io/controller-runtime/pkg/event"

	"github.com/redline-dev/redline/internal/limiter/scripts"
)

// ScriptStore makes sure Redis holds the limiter's scripts.
type ScriptStore interface {
	// Ensure loads whatever script is missing (on every master) and returns the SHAs by
	// algorithm. An error means the scripts cannot be relied on.
	Ensure(ctx context.Context) (map[string]string, error)
}

// RedisScripts is the ScriptStore backed by a Redis client (standalone or cluster).
type RedisScripts struct {
	Client redis.UniversalClient
}

// Ensure checks with SCRIPT EXISTS and loads with SCRIPT LOAD only what is missing, so a
// reconcile costs one round trip per node when nothing changed.
func (s *RedisScripts) Ensure(ctx context.Context) (map[string]string, error) {
	// A namespace's Redis user may not load scripts (package redisacl), so every script a
	// sidecar runs is the manager's to load, not only the algorithms'.
	if err := ensureSidecarScripts(ctx, s.Client); err != nil {
		return nil, err
	}
	missing, err := scripts.Missing(ctx, s.Client)
	if err != nil {
		return nil, err
	}
	if len(missing) == 0 {
		return scripts.SHAs(), nil
	}
	return scripts.Load(ctx, s.Client)
}

// ScriptWatcher re-checks the scripts in Redis on a period, so that a Redis restart, a failover
// or a SCRIPT FLUSH is repaired and reflected in the policies' Programmed condition without
// waiting for a policy to change. On every change of health it asks for a reconcile of every
// namespace with policies.
type ScriptWatcher struct {
	Scripts  ScriptStore
	Interval time.Duration
	Log      logr.Logger
	// Events receives one GenericEvent when the scripts' health changes; the reconciler
	// turns it into a reconcile of every namespace.
	Events chan<- event.GenericEvent

	mu      sync.Mutex
	healthy *bool
}

// Start runs until ctx ends. It implements manager.Runnable.
func (w *ScriptWatcher) Start(ctx context.Context) error {
	t := time.NewTicker(w.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			w.check(ctx)
		}
	}
}

func (w *ScriptWatcher) check(ctx context.Context) {
	cctx, cancel := context.WithTimeout(ctx, w.Interval)
	defer cancel()
	// Ensure reloads a script that a restart, failover or SCRIPT FLUSH removed, here and now.
	// A sidecar on a shared credential loads it on NOSCRIPT itself; one on its namespace's ACL
	// user may not (SCRIPT LOAD and EVAL would let a tenant run any Lua), so this check is what
	// heals it, within one Interval.
	_, err := w.Scripts.Ensure(cctx)
	healthy := err == nil
	if err != nil {
		w.Log.V(1).Info("redis scripts unavailable", "error", err.Error())
	}
	w.mu.Lock()
	changed := w.healthy == nil || *w.healthy != healthy
	w.healthy = &healthy
	w.mu.Unlock()
	if changed {
		select {
		case w.Events <- event.GenericEvent{}:
		case <-ctx.Done():
		}
	}
}
