package memorypolicy

import (
	"errors"
	"testing"

	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/redline-dev/redline/api/v1alpha1"
)

// One evicting node is enough for False, whatever the others do (a cluster's keys live on all
// of them, and a replica with its own policy evicts once promoted); many are named in part.
func TestMemoryCondition(t *testing.T) {
	safe := NodeMemory{Addr: "a:1", MaxMemory: 1 << 30, Policy: "noeviction"}
	unbounded := NodeMemory{Addr: "b:1", Policy: "allkeys-lru"}
	for _, tc := range []struct {
		name   string
		nodes  []NodeMemory
		err    error
		status metav1.ConditionStatus
		reason string
		text   string
	}{
		{"all noeviction", []NodeMemory{safe, safe}, nil, metav1.ConditionTrue, v1alpha1.ReasonNoEviction, "on all 2 Redis nodes"},
		{"no maxmemory evicts nothing", []NodeMemory{safe, unbounded}, nil, metav1.ConditionTrue, v1alpha1.ReasonNoMaxmemory, "maxmemory 0 on b:1"},
		{"one volatile node", []NodeMemory{safe, {Addr: "c:1", MaxMemory: 10, Policy: "volatile-lru"}}, nil,
			metav1.ConditionFalse, v1alpha1.ReasonEvictionPossible, "c:1 (maxmemory-policy volatile-lru, maxmemory 10 bytes) evicts"},
		{"many named in part", []NodeMemory{
			{Addr: "n1:1", MaxMemory: 1, Policy: "allkeys-lfu"}, {Addr: "n2:1", MaxMemory: 1, Policy: "allkeys-lfu"},
			{Addr: "n3:1", MaxMemory: 1, Policy: "allkeys-lfu"}, {Addr: "n4:1", MaxMemory: 1, Policy: "allkeys-lfu"},
			{Addr: "n5:1", MaxMemory: 1, Policy: "allkeys-random"},
		}, nil, metav1.ConditionFalse, v1alpha1.ReasonEvictionPossible, "and 2 more"},
		{"unreadable", nil, errors.New("boom"), metav1.ConditionUnknown, v1alpha1.ReasonMemoryUnknown, "boom"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			status, reason, msg := memoryCondition(tc.nodes, tc.err)
			g.Expect(status).To(Equal(tc.status))
			g.Expect(reason).To(Equal(tc.reason))
			g.Expect(msg).To(ContainSubstring(tc.text))
		})
	}
}
