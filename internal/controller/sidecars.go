package controller

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/redis/go-redis/v9"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/redline-dev/redline/internal/fleet"
)

// SidecarReports tells which sidecars enforce a policy and which configuration each applies.
type SidecarReports interface {
	// Members returns the live sidecars of a policy (pod name -> configuration hash applied)
	// and how many times they said Redis lost counts of it (fleet.Report.Losses).
	Members(ctx context.Context, namespace, policy string) (map[string]string, int64, error)
}

// RedisSidecars reads the heartbeats sidecars write to Redis (fleet.Announce).
type RedisSidecars struct {
	Client redis.UniversalClient
	// TTL is how long a sidecar counts as live after its last heartbeat; it must match the
	// sidecars' heartbeat TTL.
	TTL time.Duration
}

// Members implements SidecarReports.
func (s *RedisSidecars) Members(ctx context.Context, namespace, policy string) (map[string]string, int64, error) {
	r, err := fleet.Read(ctx, s.Client, namespace, policy, s.TTL)
	return r.Members, r.Losses, err
}

// enforcement is what the sidecars of one policy report.
type enforcement struct {
	err     error
	members map[string]string
	losses  int64
}

// condition turns the reports into the Enforced condition for the configuration hash the
// controller last wrote.
func (e enforcement) condition(hash string) (metav1.ConditionStatus, string, string) {
	if e.err != nil {
		return metav1.ConditionUnknown, ReasonRedisUnavailable,
			truncate("cannot read sidecar heartbeats from Redis: " + e.err.Error())
	}
	if len(e.members) == 0 {
		return metav1.ConditionUnknown, ReasonNoSidecars,
			"no live sidecar enforces this policy: no injected pod matches spec.targetSelector yet"
	}
	var stale []string
	for pod, h := range e.members {
		if h != hash {
			stale = append(stale, pod)
		}
	}
	if len(stale) == 0 {
		return metav1.ConditionTrue, ReasonEnforced,
			fmt.Sprintf("%d of %d live sidecars apply configuration %.12s", len(e.members), len(e.members), hash)
	}
	sort.Strings(stale)
	if len(stale) > 5 {
		stale = append(stale[:5], "...")
	}
	return metav1.ConditionFalse, ReasonPropagating,
		fmt.Sprintf("%d of %d live sidecars apply configuration %.12s; still on an older one: %v",
			len(e.members)-len(stale), len(e.members), hash, stale)
}
