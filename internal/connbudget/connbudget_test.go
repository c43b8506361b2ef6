package connbudget

import (
	"fmt"
	"math"
	"testing"

	. "github.com/onsi/gomega"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestPoolSize(t *testing.T) {
	tests := []struct {
		name        string
		maxClients  int64
		workloads   int
		maxReplicas int64
		ceiling     int64
		want        int64
	}{
		// docs/operations/connection-budget.md's worked example: maxclients 10,000, reserve 4 + 500, three workloads: a
		// share of 3,165 each.
		{"share split over maxReplicas", 10000, 3, 500, 0, 6},
		{"share split over fewer replicas", 10000, 3, 200, 0, 15},
		{"few replicas: capped at the default", 10000, 3, 75, 0, 16},
		{"unknown maxclients: the default", 0, 3, 500, 0, 16},
		{"no workload counted yet: the asking one is alone", 200, 0, 10, 0, 16},
		{"no workload counted yet, many replicas", 200, 0, 100, 0, 2},
		{"huge maxReplicas: the floor", 10000, 3, math.MaxInt32, 0, 2},
		{"tiny maxclients: the floor", 10, 3, 2, 0, 2},
		{"reserve takes everything: the floor", 4, 1, 1, 0, 2},
		{"maxReplicas 0 (a scaled-down workload) counts as 1", 1000, 1, 0, 0, 16},
		{"exact division", 1000 + 50 + 4 + 6, 2, 100, 0, 5},
		// The manager's --sidecar-redis-pool-size moves the ceiling, never the floor.
		{"a higher ceiling: few replicas get more", 10000, 3, 75, 64, 42},
		{"a lower ceiling: few replicas get less", 10000, 3, 75, 8, 8},
		{"a lower ceiling, many replicas: the share still decides", 10000, 3, 500, 8, 6},
		{"a ceiling, unknown maxclients: the ceiling", 0, 3, 500, 32, 32},
		{"a ceiling, huge maxReplicas: the floor", 10000, 3, math.MaxInt32, 64, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			g.Expect(PoolSize(tt.maxClients, Reserve(tt.maxClients, 4), 1, tt.workloads, tt.maxReplicas, tt.ceiling)).To(Equal(tt.want))
		})
	}
}

func TestReserveAndShare(t *testing.T) {
	g := NewWithT(t)
	g.Expect(Reserve(10000, 4)).To(Equal(int64(504)))
	g.Expect(Reserve(200, 4)).To(Equal(int64(14)))
	g.Expect(Share(10000, 504, 1, 3)).To(Equal(int64(3165)))
	g.Expect(Share(10, 14, 1, 1)).To(BeZero())
	g.Expect(Share(200, 14, 0, 0)).To(Equal(int64(186)))
	g.Expect(NamespaceShare(10000, 504, 2)).To(Equal(int64(4748)))
	g.Expect(Share(10000, 504, 2, 3)).To(Equal(int64(1582)), "the namespace's share, then its workloads'")
}

func TestSnapshotCountsTheAskingWorkload(t *testing.T) {
	g := NewWithT(t)
	a := Workload{Kind: "Deployment", Namespace: "shop", Name: "a"}
	b := Workload{Kind: "Deployment", Namespace: "shop", Name: "b"}
	s := &Snapshot{MaxClients: 200, Reserve: 14, Workloads: map[Workload]struct{}{a: {}}}
	g.Expect(s.Share(a)).To(Equal(int64(186)))
	g.Expect(s.Share(b)).To(Equal(int64(93)), "b is not counted yet: it shares with a")
	g.Expect(s.PoolSize(a, 20)).To(Equal(int64(9)))
	g.Expect(s.PoolSize(b, 20)).To(Equal(int64(4)))

	var unknown *Snapshot
	g.Expect(unknown.Known()).To(BeFalse())
	g.Expect(unknown.PoolSize(a, 20)).To(Equal(int64(16)))
	g.Expect((&Snapshot{PoolCeiling: 40}).PoolSize(a, 20)).To(Equal(int64(40)), "maxclients unknown: the manager's ceiling")
	capped := &Snapshot{MaxClients: 200, Reserve: 14, Workloads: map[Workload]struct{}{a: {}}, PoolCeiling: 64}
	g.Expect(capped.PoolSize(a, 2)).To(Equal(int64(64)), "186 / 2 = 93, capped at the manager's 64 instead of 16")
	var p *Publisher
	g.Expect(p.Load()).To(BeNil())
	p = &Publisher{}
	g.Expect(p.Load()).To(BeNil())
	p.Publish(s)
	g.Expect(p.Load()).To(BeIdenticalTo(s))
}

func TestScalers(t *testing.T) {
	g := NewWithT(t)
	hpa := func(name, apiVersion, kind, target string, maxReplicas int32) autoscalingv2.HorizontalPodAutoscaler {
		return autoscalingv2.HorizontalPodAutoscaler{
			ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: name},
			Spec: autoscalingv2.HorizontalPodAutoscalerSpec{
				ScaleTargetRef: autoscalingv2.CrossVersionObjectReference{APIVersion: apiVersion, Kind: kind, Name: target},
				MaxReplicas:    maxReplicas,
			},
		}
	}
	m := Scalers([]autoscalingv2.HorizontalPodAutoscaler{
		hpa("a", "apps/v1", "Deployment", "checkout", 5),
		hpa("b", "apps/v1", "Deployment", "checkout", 9),
		hpa("c", "example.com/v1", "Deployment", "search", 50),
		hpa("d", "apps/v1", "ReplicaSet", "bare", 3),
	})
	checkout := Workload{Kind: "Deployment", Namespace: "shop", Name: "checkout"}
	g.Expect(m).To(HaveLen(2))
	g.Expect(MaxReplicas(nil, m[checkout])).To(Equal(int64(9)), "the larger of two HPAs")
	g.Expect(m).To(HaveKey(Workload{Kind: "ReplicaSet", Namespace: "shop", Name: "bare"}))
	three := int32(3)
	g.Expect(MaxReplicas(&three, nil)).To(Equal(int64(3)))
	g.Expect(MaxReplicas(nil, nil)).To(Equal(int64(1)))
}

// Issue 18: a tenant's 100 empty Deployments cut a 50-replica victim's pool from 16 to 2,
// because every injected workload of the cluster divided one budget. Shares now go to
// namespaces first, and only workloads that can run pods count.
func TestOneNamespaceCannotShrinkAnothersPools(t *testing.T) {
	g := NewWithT(t)
	victim := Workload{Kind: "Deployment", Namespace: "victim", Name: "api"}
	own := Workload{Kind: "Deployment", Namespace: "attacker", Name: "real"}
	before := &Snapshot{MaxClients: 10000, Reserve: Reserve(10000, 4), Workloads: map[Workload]struct{}{victim: {}, own: {}}}
	g.Expect(before.PoolSize(victim, 50)).To(Equal(int64(16)))

	after := &Snapshot{MaxClients: 10000, Reserve: Reserve(10000, 4), Workloads: map[Workload]struct{}{victim: {}, own: {}}}
	for i := range 100 {
		after.Workloads[Workload{Kind: "Deployment", Namespace: "attacker", Name: fmt.Sprintf("filler-%d", i)}] = struct{}{}
	}
	g.Expect(after.PoolSize(victim, 50)).To(Equal(before.PoolSize(victim, 50)), "the victim's pool does not depend on the attacker's workloads")
	g.Expect(after.Share(victim)).To(Equal(before.Share(victim)))
	g.Expect(after.Share(own)).To(BeNumerically("<", before.Share(own)), "the attacker's own workloads share its namespace's budget")
	g.Expect(after.Namespaces(victim)).To(Equal(2))
	g.Expect(after.Count(own)).To(Equal(101))
	newcomer := Workload{Kind: "Deployment", Namespace: "third", Name: "x"}
	g.Expect(after.Namespaces(newcomer)).To(Equal(3), "a namespace not counted yet is added")
	g.Expect(after.Count(newcomer)).To(Equal(1))

	// An absurd maxReplicas gets its own workload the floor; the victim keeps its pool.
	g.Expect(after.PoolSize(own, math.MaxInt32)).To(Equal(int64(2)))
	g.Expect(after.PoolSize(victim, 50)).To(Equal(int64(16)))
}

func TestRunsPods(t *testing.T) {
	g := NewWithT(t)
	zero, one := int32(0), int32(1)
	hpa := func(minReplicas *int32, maxReplicas int32) *autoscalingv2.HorizontalPodAutoscaler {
		return &autoscalingv2.HorizontalPodAutoscaler{Spec: autoscalingv2.HorizontalPodAutoscalerSpec{MinReplicas: minReplicas, MaxReplicas: maxReplicas}}
	}
	g.Expect(RunsPods(nil, nil)).To(BeTrue(), "nil replicas means 1")
	g.Expect(RunsPods(&one, nil)).To(BeTrue())
	g.Expect(RunsPods(&zero, nil)).To(BeFalse(), "replicas 0 runs no pod")
	g.Expect(RunsPods(&zero, hpa(&zero, 10))).To(BeFalse(), "an HPA that may scale to 0")
	g.Expect(RunsPods(&zero, hpa(&one, 10))).To(BeTrue(), "an HPA with minReplicas 1 brings it up")
	g.Expect(RunsPods(&zero, hpa(nil, 10))).To(BeTrue(), "minReplicas defaults to 1")
}

// Subscribers hear of a snapshot that sizes pools differently, not of a pass that computed
// the same budget again.
func TestPublisherTellsSubscribersOfChanges(t *testing.T) {
	g := NewWithT(t)
	var p Publisher
	heard := 0
	p.Subscribe(func(*Snapshot) { heard++ })
	shop := map[Workload]struct{}{{Kind: "Deployment", Namespace: "shop", Name: "checkout"}: {}}
	p.Publish(&Snapshot{MaxClients: 200, Reserve: 14, Workloads: shop})
	g.Expect(heard).To(Equal(1), "the first snapshot")
	p.Publish(&Snapshot{MaxClients: 200, Reserve: 14, Workloads: map[Workload]struct{}{{Kind: "Deployment", Namespace: "shop", Name: "checkout"}: {}}})
	g.Expect(heard).To(Equal(1), "the same budget again")
	p.Publish(&Snapshot{MaxClients: 200, Reserve: 14, Workloads: map[Workload]struct{}{}})
	g.Expect(heard).To(Equal(2), "a workload gone")
	p.Publish(&Snapshot{MaxClients: 300, Reserve: 19, Workloads: map[Workload]struct{}{}})
	g.Expect(heard).To(Equal(3), "maxclients changed")
}
