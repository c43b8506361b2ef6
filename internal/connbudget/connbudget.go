// Package connbudget sizes the sidecars' Redis pools from Redis's connection budget. The pod
// injector and the controller's budget reconciler both use it, so that what the controller
// counts is what the injector injects.
//
// The rule: what Redis allows, minus a reserve, is shared evenly by the namespaces that run
// injected workloads, each namespace's share evenly by its workloads that can run pods, and each
// pod gets a pool of its workload's share divided by the workload's maxReplicas, between
// contract.MinRedisPoolSize and a ceiling: the manager's --sidecar-redis-pool-size, by default
// contract.DefaultRedisPoolSize. Sharing by namespace first makes
// what a tenant creates in its namespace (a hundred empty Deployments, an absurd maxReplicas)
// shrink only its own pools: the other namespaces' shares depend on how many namespaces there
// are, never on what is in them.
package connbudget

import (
	"maps"
	"slices"
	"sync"
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

// NamespaceShare is one namespace's even share of maxclients: (maxclients - reserve) /
// namespaces. With no namespace counted yet the asking one is alone. It is 0 when the reserve
// takes everything.
func NamespaceShare(maxClients, reserve int64, namespaces int) int64 {
	free := maxClients - reserve
	if free <= 0 {
		return 0
	}
	return free / int64(max(namespaces, 1))
}

// Share is one workload's even share: its namespace's share divided by the workloads of that
// namespace (at least 1).
func Share(maxClients, reserve int64, namespaces, workloads int) int64 {
	return NamespaceShare(maxClients, reserve, namespaces) / int64(max(workloads, 1))
}

// PoolSize is the pool of each pod of a workload that can run maxReplicas pods, among
// workloads in its namespace and namespaces sharing Redis: share / maxReplicas, never below
// contract.MinRedisPoolSize (fewer connections stop the sidecar working: a blocked call would
// stall batching and heartbeats) and never above ceiling (the manager's
// --sidecar-redis-pool-size; 0 or less is contract.DefaultRedisPoolSize, which leases make more
// than a sidecar needs). maxClients 0 means unknown, and gives the ceiling. It is the one
// sizing function: the injector and the budget reconciler both call it (through
// Snapshot.PoolSize), so that what is counted is what is injected.
func PoolSize(maxClients, reserve int64, namespaces, workloads int, maxReplicas, ceiling int64) int64 {
	if ceiling <= 0 {
		ceiling = contract.DefaultRedisPoolSize
	}
	// A ceiling below the floor cannot be configured (the manager refuses it); the floor wins.
	ceiling = max(ceiling, contract.MinRedisPoolSize)
	if maxClients <= 0 {
		return ceiling
	}
	if maxReplicas < 1 {
		maxReplicas = 1
	}
	return min(max(Share(maxClients, reserve, namespaces, workloads)/maxReplicas, contract.MinRedisPoolSize), ceiling)
}

// Snapshot is what the budget reconciler last computed, for the injector. It must not be
// changed once published.
type Snapshot struct {
	// MaxClients is the smallest maxclients among Redis's masters; 0 when it is not known.
	MaxClients int64
	// Reserve is Reserve(MaxClients, manager connections).
	Reserve int64
	// Workloads are the injected workloads sharing Redis that can run pods.
	Workloads map[Workload]struct{}
	// PoolCeiling is the largest pool PoolSize gives (the manager's --sidecar-redis-pool-size);
	// 0 is contract.DefaultRedisPoolSize.
	PoolCeiling int64

	once       sync.Once
	perNS      map[string]int // workloads in each namespace
	namespaces int
}

func (s *Snapshot) index() {
	s.once.Do(func() {
		s.perNS = map[string]int{}
		for w := range s.Workloads {
			s.perNS[w.Namespace]++
		}
		s.namespaces = len(s.perNS)
	})
}

// Known reports whether the snapshot can size pools.
func (s *Snapshot) Known() bool { return s != nil && s.MaxClients > 0 }

// Namespaces is the number of namespaces sharing Redis, w's among them: a workload the
// reconciler has not seen yet (its pods come right after it) is added, not left out of the
// division.
func (s *Snapshot) Namespaces(w Workload) int {
	s.index()
	if s.perNS[w.Namespace] == 0 {
		return s.namespaces + 1
	}
	return s.namespaces
}

// Count is the number of workloads of w's namespace sharing its share, w among them.
func (s *Snapshot) Count(w Workload) int {
	s.index()
	n := s.perNS[w.Namespace]
	if _, ok := s.Workloads[w]; !ok {
		n++
	}
	return n
}

// NamespaceShare is the share of w's namespace (see NamespaceShare).
func (s *Snapshot) NamespaceShare(w Workload) int64 {
	return NamespaceShare(s.MaxClients, s.Reserve, s.Namespaces(w))
}

// Share is w's even share within its namespace's (see Share).
func (s *Snapshot) Share(w Workload) int64 {
	return Share(s.MaxClients, s.Reserve, s.Namespaces(w), s.Count(w))
}

// PoolSize is the pool of each pod of w (see PoolSize); the ceiling when s is not Known.
func (s *Snapshot) PoolSize(w Workload, maxReplicas int64) int64 {
	if !s.Known() {
		return s.Ceiling()
	}
	return PoolSize(s.MaxClients, s.Reserve, s.Namespaces(w), s.Count(w), maxReplicas, s.PoolCeiling)
}

// Ceiling is the largest pool s gives: PoolCeiling, or contract.DefaultRedisPoolSize.
func (s *Snapshot) Ceiling() int64 {
	if s == nil || s.PoolCeiling <= 0 {
		return contract.DefaultRedisPoolSize
	}
	return max(s.PoolCeiling, contract.MinRedisPoolSize)
}

// Publisher hands the latest Snapshot from the budget reconciler to the injector, which run in
// the same manager process. The zero value holds no snapshot.
type Publisher struct {
	p atomic.Pointer[Snapshot]

	mu   sync.Mutex
	subs []func(*Snapshot)
}

// Publish replaces the snapshot. s must not be changed afterwards. When s sizes pools
// differently from the snapshot before it, every subscriber is called.
func (p *Publisher) Publish(s *Snapshot) {
	if old := p.p.Swap(s); old.sizesAs(s) {
		return
	}
	p.mu.Lock()
	subs := p.subs
	p.mu.Unlock()
	for _, fn := range subs {
		fn(s)
	}
}

// Subscribe calls fn with every published snapshot that sizes pools differently from the one
// before, from the publisher's goroutine: fn must not block nor change it. A subscriber that
// must not miss a change subscribes before it loads the snapshot it computes from.
func (p *Publisher) Subscribe(fn func(*Snapshot)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.subs = append(slices.Clip(p.subs), fn)
}

// sizesAs reports whether s and o give every workload the same pool.
func (s *Snapshot) sizesAs(o *Snapshot) bool {
	if s == nil || o == nil {
		return s == o
	}
	return s.MaxClients == o.MaxClients && s.Reserve == o.Reserve && s.PoolCeiling == o.PoolCeiling && maps.Equal(s.Workloads, o.Workloads)
}

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

// RunsPods reports whether a workload can run pods, and so takes a share: spec.replicas 0
// (nil means 1) runs none unless an HPA with a minReplicas above 0 (nil means the API's
// default, 1) bounds it. Empty workloads count for nothing, so creating them changes no pool.
func RunsPods(replicas *int32, hpa *autoscalingv2.HorizontalPodAutoscaler) bool {
	if replicas == nil || *replicas > 0 {
		return true
	}
	return hpa != nil && (hpa.Spec.MinReplicas == nil || *hpa.Spec.MinReplicas > 0) && hpa.Spec.MaxReplicas > 0
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
