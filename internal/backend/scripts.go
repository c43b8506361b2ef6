package backend

import (
	"context"
	"fmt"

	"github.com/go-logr/logr"
	"github.com/redis/go-redis/v9"

	"github.com/redline-dev/redline/internal/limiter/scripts"
	"github.com/redline-dev/redline/internal/redisacl"
)

// Scripts keeps the limiter's scripts, and every other script a sidecar runs, loaded in one
// Redis (standalone, cluster or Sentinel).
type Scripts struct {
	Client redis.UniversalClient
	// Nodes runs a function on every node, replicas included (redisconn.Nodes.Each); nil:
	// Client's masters only.
	Nodes NodeFunc
	// Log receives the replicas that could not be given the scripts.
	Log logr.Logger
}

// Ensure loads whatever script is missing and returns the algorithms' SHAs by algorithm; an
// error means the scripts cannot be relied on. It checks with SCRIPT EXISTS and loads with SCRIPT
// LOAD only what is missing, so a reconcile costs one round trip per node when nothing changed.
//
// Redis replicates neither SCRIPT LOAD nor the script cache: a replica holds none of its
// master's scripts, and after a failover (Sentinel, a Cluster shard) every sidecar on its
// namespace's user, which may not load scripts, met NOSCRIPT and decided by its failure mode
// until this ran again (measured: 8.0-11.4 s after the kill, for a switch of 2.2 s). So the
// scripts go on every node, replicas too (SCRIPT LOAD is allowed on a replica), and a promoted
// replica answers at once. Only the masters' answer decides the result: a replica that cannot
// be reached now is logged, and given the scripts at a later pass.
func (s *Scripts) Ensure(ctx context.Context) (map[string]string, error) {
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
