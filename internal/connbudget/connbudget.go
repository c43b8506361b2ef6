// Package connbudget sizes the sidecars' Redis pools from Redis's connection budget. The pod
// injector and the controller's budget reconciler both use it, so that what the controller
// counts is what the injector injects.
//
// The rule: every injected workload gets an even share of what Redis allows, minus a reserve,
// and each of its pods a pool of that share divided by the workload's maxReplicas, between
// contract.MinRedisPoolSize and contract.DefaultRedisPoolSize.
package connbudget

import (
	"sync/atomic"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/redline-dev/redline/internal/sidecar/contract"
)

// HeadroomDivisor keeps 1/20 (5%) of maxclients out of the pods' shares, for the clients the
// sum does not know about: redis-cli, exporters, replicas, and the extra pods of a rolling
// update, which run beside the old ones for a while.
const HeadroomDivisor = 20

// Workload names a Deployment, StatefulSet or ReplicaSet without a Deployment.
type Workload struct {
	Kind, Namespace, Name string
}

func (w Workload) String() string { return w.Kind + " " + w.Namespace + "/" + w.Name }

// Reserve is what is kept out of the pods' shares on each Redis node: the manager's own
// connections and a headroom of 5% of maxclients.
func Reserve(maxClients, manager int64) int64 {
	return manager + maxClients/HeadroomDivisor
}

// Share is one workload's even share of maxclients: (maxclients - reserve) / workloads. With
// no workload counted yet the asking one is alone. It is 0 when the reserve takes everything.
func Share(maxClients, reserve int64, workloads int) int64 {
	if workloads < 1 {
		workloads = 1
	}
	free := maxClients - reserve
	if free <= 0 {
		return 0
	}
	return free / int64(workloads)
}

// PoolSize is the pool of each pod of a workload that can run maxReplicas pods:
// share / maxReplicas, never below contract.MinRedisPoolSize (fewer connections stop the
// sidecar working: a blocked call would stall batching and heartbeats) and never above
// contract.DefaultRedisPoolSize (a larger pool buys nothing the sidecar needs). maxClients 0
// means unknown, and gives the default.
func PoolSize(maxClients, reserve int64, workloads int, maxReplicas int64) int64 {
	if maxClients <= 0 {
		return contract.DefaultRedisPoolSize
	}
	if maxReplicas < 1 {
		maxReplicas = 1
	}
	return min(max(Share(maxClients, reserve, workloads)/maxReplicas, contract.MinRedisPoolSize), contract.DefaultRedisPoolSize)
}

// Snapshot is what the budget reconciler last computed, for the injector.
type Snapshot struct {
	// MaxClients is the smallest maxclients among Redis's masters; 0 when it is not known.
	MaxClients int64
	// Reserve is Reserve(MaxClients, manager connections).
	Reserve int64
	// Workloads are the injected workloads sharing Redis.
	Workloads map[Workload]struct{}
}

// Known reports whether the snapshot can size pools.
func (s *Snapshot) Known() bool { return s != nil && s.MaxClients > 0 }

// Count is the number of workloads sharing Redis, w among them: a workload the reconciler has
// not seen yet (its pods come right after it) is added, not left out of the division.
func (s *Snapshot) Count(w Workload) int {
	n := len(s.Workloads)
	if _, ok := s.Workloads[w]; !ok {
		n++
	}
	return n
}

// Share is w's even share (see Share).
func (s *Snapshot) Share(w Workload) int64 {
	return Share(s.MaxClients, s.Reserve, s.Count(w))
}

// PoolSize is the pool of each pod of w (see PoolSize); the default when s is not Known.
func (s *Snapshot) PoolSize(w Workload, maxReplicas int64) int64 {
	if !s.Known() {
		return contract.DefaultRedisPoolSize
	}
	return PoolSize(s.MaxClients, s.Reserve, s.Count(w), maxReplicas)
}

// Publisher hands the latest Snapshot from the budget reconciler to the injector, which run in
// the same manager process. The zero value holds no snapshot.
type Publisher struct {
	p atomic.Pointer[Snapshot]
}

// Publish replaces the snapshot. s must not be changed afterwards.
func (p *Publisher) Publish(s *Snapshot) { p.p.Store(s) }

// Load returns the latest snapshot, nil before the first. It must not be changed.
func (p *Publisher) Load() *Snapshot {
	if p == nil {
		return nil
	}
	return p.p.Load()
}

// ScaleTarget is the workload an HPA scales, when it is one of the apps group's.
func ScaleTarget(h *autoscalingv2.HorizontalPodAutoscaler) (Workload, bool) {
	t := h.Spec.ScaleTargetRef
	gv, err := schema.ParseGroupVersion(t.APIVersion)
	if err != nil || gv.Group != appsv1.GroupName {
		return Workload{}, false
	}
	return Workload{Kind: t.Kind, Namespace: h.Namespace, Name: t.Name}, true
}

// Scalers maps each workload to the HPA that bounds it. Two HPAs on one workload are a
// misconfiguration; the larger maxReplicas is the worst case.
func Scalers(hpas []autoscalingv2.HorizontalPodAutoscaler) map[Workload]*autoscalingv2.HorizontalPodAutoscaler {
	out := map[Workload]*autoscalingv2.HorizontalPodAutoscaler{}
	for i := range hpas {
		h := &hpas[i]
		w, ok := ScaleTarget(h)
		if !ok {
			continue
		}
		if old, seen := out[w]; !seen || h.Spec.MaxReplicas > old.Spec.MaxReplicas {
			out[w] = h
		}
	}
	return out
}

// MaxReplicas is the largest replica count of a workload: its HPA's maxReplicas, else its
// spec.replicas (nil means 1).
func MaxReplicas(replicas *int32, hpa *autoscalingv2.HorizontalPodAutoscaler) int64 {
	switch {
	case hpa != nil:
		return int64(hpa.Spec.MaxReplicas)
	case replicas == nil:
		return 1
	}
	return int64(*replicas)
}
