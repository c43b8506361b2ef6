package controller

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/redis/go-redis/v9"
	"sigs.k8s.io/controller-runtime/pkg/event"

	"github.com/redline-dev/redline/internal/limiter/scripts"
	"github.com/redline-dev/redline/internal/redisacl"
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
	// Nodes runs a function on every node, replicas included (redisconn.Nodes.Each); nil:
	// Client's masters only.
	Nodes func(ctx context.Context, fn func(context.Context, *redis.Client) error) error
	// Log receives the replicas that could not be given the scripts.
	Log logr.Logger
}

// Ensure checks with SCRIPT EXISTS and loads with SCRIPT LOAD only what is missing, so a
// reconcile costs one round trip per node when nothing changed.
//
// Redis replicates neither SCRIPT LOAD nor the script cache: a replica holds none of its
// master's scripts, and after a failover (Sentinel, a Cluster shard) every sidecar on its
// namespace's user, which may not load scripts, met NOSCRIPT and decided by its failure mode
// until this ran again (measured: 8.0-11.4 s after the kill, for a switch of 2.2 s). So the
// scripts go on every node, replicas too (SCRIPT LOAD is allowed on a replica), and a promoted
// replica answers at once. Only the masters' answer decides the result: a replica that cannot
// be reached now is logged, and given the scripts at a later pass.
func (s *RedisScripts) Ensure(ctx context.Context) (map[string]string, error) {
	if s.Nodes != nil {
		if err := s.Nodes(ctx, func(ctx context.Context, node *redis.Client) error {
			if err := ensureSidecarScripts(ctx, node); err != nil {
				return err
			}
			if missing, err := scripts.Missing(ctx, node); err != nil || len(missing) > 0 {
				_, err = scripts.Load(ctx, node)
				return err
			}
			return nil
		}); err != nil {
			s.Log.V(1).Info("redis scripts not on every node yet", "error", err.Error())
		}
	}
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
	// Scripts is checked when Backends is nil; otherwise every backend's scripts are, at once.
	Scripts  ScriptStore
	Backends *Backends
	Interval time.Duration
	Log      logr.Logger
	// Events receives one GenericEvent when the scripts' health changes; the reconciler
	// turns it into a reconcile of every namespace.
	Events chan<- event.GenericEvent

	mu      sync.Mutex
	healthy *string
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
	healthy := w.ensure(cctx)
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

// ensure loads what is missing on every backend and returns which ones are healthy, as a
// string that changes when any backend's health does (or a backend comes or goes).
func (w *ScriptWatcher) ensure(ctx context.Context) string {
	if w.Backends == nil {
		_, err := w.Scripts.Ensure(ctx)
		if err != nil {
			w.Log.V(1).Info("redis scripts unavailable", "error", err.Error())
		}
		return strconv.FormatBool(err == nil)
	}
	var mu sync.Mutex
	health := map[string]bool{}
	_ = w.Backends.Each(ctx, func(ctx context.Context, be *Backend) error {
		_, err := be.Scripts.Ensure(ctx)
		if err != nil {
			w.Log.V(1).Info("redis scripts unavailable", "backend", be.Label(), "error", err.Error())
		}
		mu.Lock()
		health[be.id()] = err == nil
		mu.Unlock()
		return nil
	})
	var b strings.Builder
	for _, id := range slicesSortedKeys(health) {
		b.WriteString(id + "=" + strconv.FormatBool(health[id]) + ";")
	}
	return b.String()
}

// ensureSidecarScripts loads, on every master, the scripts a sidecar runs besides the
// algorithms (the lease return, the heartbeat) where SCRIPT EXISTS says they are missing.
func ensureSidecarScripts(ctx context.Context, c redis.UniversalClient) error {
	var extra []scripts.Script
	for _, sc := range redisacl.SidecarScripts() {
		if _, ok := scripts.For(sc.Name); !ok {
			extra = append(extra, sc)
		}
	}
	shas := make([]string, len(extra))
	for i, sc := range extra {
		shas[i] = sc.SHA
	}
	load := func(ctx context.Context, node redis.UniversalClient) error {
		exists, err := node.ScriptExists(ctx, shas...).Result()
		if err != nil {
			return fmt.Errorf("checking scripts: %w", err)
		}
		for i, ok := range exists {
			if ok {
				continue
			}
			if err := node.ScriptLoad(ctx, extra[i].Source).Err(); err != nil {
				return fmt.Errorf("loading script %s: %w", extra[i].Name, err)
			}
		}
		return nil
	}
	if cc, ok := c.(*redis.ClusterClient); ok {
		return cc.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error {
			if err := load(ctx, node); err != nil {
				return fmt.Errorf("on %s: %w", node.Options().Addr, err)
			}
			return nil
		})
	}
	return load(ctx, c)
}
