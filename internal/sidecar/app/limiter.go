package app

import (
	"fmt"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redline-dev/redline/internal/limiter"
	"github.com/redline-dev/redline/internal/redisconn"
	"github.com/redline-dev/redline/internal/sidecar/metrics"
	"github.com/redline-dev/redline/internal/sidecar/ruleset"
)

// newLimiter makes the sidecar's limiter. Its shares' restorations are counted in the
// metrics m will hold, and start a heartbeat at once (beat), which tells the other replicas.
func newLimiter(client redis.UniversalClient, conns *redisconn.ConnStats, cfg *Config, store *ruleset.Store, beat chan<- struct{},
	m *atomic.Pointer[metrics.Metrics]) (*limiter.Limiter, error) {
	leaseHorizon := cfg.LeaseHorizon
	if leaseHorizon <= 0 {
		leaseHorizon = -1 // off: every decision asks Redis
	}
	lim, err := limiter.New(client, limiter.Options{LeaseHorizon: leaseHorizon, LeaseSize: cfg.LeaseKeys,
		// A script that runs after the client's read timeout would count units for a caller
		// already answered by the failure mode; a quarter of the timeout is left for its reply.
		CallDeadline: cfg.RedisTimeout * 3 / 4,
		// A fresh id per process: a restarted sidecar knows none of its old grants anyway.
		ReplicaID: limiter.NewReplicaID(), ShareKeys: cfg.ShareKeys, SlotExpiry: cfg.InFlightExpiry,
		FallbackReplicas: cfg.FallbackReplicas,
		// In-flight slots take a node the client switched to as they take a failed call.
		NodeChanges: conns.NodeChanges,
		// The other replicas hear of a loss at their next heartbeat (the restoring one beats
		// at once) and re-assert within a round trip: a second beyond the interval.
		RestoreHold: cfg.HeartbeatInterval + time.Second,
		OnRestore: func(policy string, units int64) {
			if mm := m.Load(); mm != nil {
				mm.Restored(policyLabel(store.Current(), policy), units)
			}
			select { // tell the other replicas at once: they re-assert when they hear of it
			case beat <- struct{}{}:
			default:
			}
		}})
	if err != nil {
		return nil, fmt.Errorf("creating limiter: %w", err)
	}
	return lim, nil
}

// policyLabel is policy as a metric label: "unknown" for one that is not among the policies of
// set (a limit of a document reloaded since), so that the label's values are bounded by the
// document's policies.
func policyLabel(set *ruleset.Set, policy string) string {
	if set == nil {
		return "unknown"
	}
	for _, p := range set.Policies {
		if p.Name == policy {
			return p.Name
		}
	}
	return "unknown"
}
