package memorypolicy

import (
	"errors"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/redline-dev/redline/api/v1alpha1"
)

// What each rule needs of the masters (replicas' own nodes are not asked for it), and the
// first unmet need decides.
func TestDurabilityCondition(t *testing.T) {
	rule := func(window time.Duration, mode v1alpha1.DurabilityMode) v1alpha1.Rule {
		r := v1alpha1.Rule{Name: "r", Limit: v1alpha1.Limit{Requests: 1, Window: metav1.Duration{Duration: window}}}
		if mode != "" {
			r.Durability = &v1alpha1.Durability{Mode: mode}
		}
		return r
	}
	v70 := NodeDurability{Addr: "m:1", Version: "7.0.15", Master: true, SaveKnown: true, BgsaveOK: true}
	v72aof := NodeDurability{Addr: "m:1", Version: "7.2.4", Master: true, AOF: true, Replicas: 1}
	replicaNode := NodeDurability{Addr: "r:1", Version: "6.2.0", Master: false}
	snapshots := NodeDurability{Addr: "m:1", Version: "7.0.15", Master: true, Save: "3600 1 300 100", SaveKnown: true, BgsaveOK: true}
	for _, tc := range []struct {
		name   string
		rule   v1alpha1.Rule
		nodes  []NodeDurability
		err    error
		status metav1.ConditionStatus
		reason string
	}{
		{"a long window without AOF", rule(time.Hour, ""), []NodeDurability{v70}, nil, metav1.ConditionFalse, v1alpha1.ReasonCountsLostOnRestart},
		{"a long window with AOF", rule(24*time.Hour, ""), []NodeDurability{v72aof}, nil, metav1.ConditionTrue, v1alpha1.ReasonDurable},
		{"WAITAOF on 7.0", rule(time.Minute, v1alpha1.DurabilityAppendOnlyFile), []NodeDurability{func() NodeDurability { n := v70; n.AOF = true; return n }()}, nil, metav1.ConditionFalse, v1alpha1.ReasonDurabilityUnsupported},
		{"WAITAOF without AOF", rule(time.Minute, v1alpha1.DurabilityAppendOnlyFile), []NodeDurability{func() NodeDurability { n := v72aof; n.AOF = false; return n }()}, nil, metav1.ConditionFalse, v1alpha1.ReasonCountsLostOnRestart},
		{"WAITAOF on 7.2 with AOF", rule(time.Minute, v1alpha1.DurabilityAppendOnlyFile), []NodeDurability{v72aof, replicaNode}, nil, metav1.ConditionTrue, v1alpha1.ReasonDurable},
		{"WAIT without a replica", rule(time.Minute, v1alpha1.DurabilityReplica), []NodeDurability{v70}, nil, metav1.ConditionFalse, v1alpha1.ReasonNoReplica},
		{"WAIT with a replica, short window, no AOF", rule(time.Minute, v1alpha1.DurabilityReplica), []NodeDurability{func() NodeDurability { n := v70; n.Replicas = 1; return n }(), replicaNode}, nil, metav1.ConditionTrue, v1alpha1.ReasonDurable},
		{"unreadable", rule(time.Hour, ""), nil, errors.New("boom"), metav1.ConditionUnknown, v1alpha1.ReasonMemoryUnknown},
		{"a long window on snapshots", rule(time.Hour, ""), []NodeDurability{snapshots}, nil, metav1.ConditionFalse, v1alpha1.ReasonCountsLostSinceSnapshot},
		{"a long window on snapshots that fail", rule(time.Hour, ""), []NodeDurability{func() NodeDurability { n := snapshots; n.BgsaveOK = false; return n }()}, nil, metav1.ConditionFalse, v1alpha1.ReasonCountsLostOnRestart},
		{"a long window, save rules unreadable", rule(time.Hour, ""), []NodeDurability{func() NodeDurability { n := snapshots; n.Save, n.SaveKnown = "", false; return n }()}, nil, metav1.ConditionFalse, v1alpha1.ReasonCountsLostOnRestart},
		{"a snapshotting master and one without", rule(time.Hour, ""), []NodeDurability{snapshots, func() NodeDurability { n := v70; n.Addr = "z:1"; return n }()}, nil, metav1.ConditionFalse, v1alpha1.ReasonCountsLostOnRestart},
		{"a long window with AOF, failing snapshots", rule(time.Hour, ""), []NodeDurability{func() NodeDurability { n := v72aof; n.Save = "3600 1"; return n }()}, nil, metav1.ConditionTrue, v1alpha1.ReasonDurable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			status, reason, msg := durabilityCondition([]v1alpha1.Rule{tc.rule}, tc.nodes, tc.err)
			g.Expect(status).To(Equal(tc.status), msg)
			g.Expect(reason).To(Equal(tc.reason), msg)
		})
	}
	g := NewWithT(t)
	g.Expect(concernsDurability([]v1alpha1.Rule{rule(59*time.Minute, "")})).To(BeFalse())
	g.Expect(concernsDurability([]v1alpha1.Rule{rule(59*time.Minute, v1alpha1.DurabilityNone)})).To(BeFalse())
	g.Expect(concernsDurability([]v1alpha1.Rule{rule(time.Minute, ""), rule(time.Hour, "")})).To(BeTrue())
	day := v1alpha1.Rule{Name: "d", Limit: v1alpha1.Limit{Requests: 1, Calendar: &v1alpha1.CalendarWindow{Unit: v1alpha1.CalendarDay}}}
	g.Expect(concernsDurability([]v1alpha1.Rule{day})).To(BeTrue(), "a calendar day is a long window")
	status, reason, msg := durabilityCondition([]v1alpha1.Rule{day}, []NodeDurability{v70}, nil)
	g.Expect(status).To(Equal(metav1.ConditionFalse), msg)
	g.Expect(reason).To(Equal(v1alpha1.ReasonCountsLostOnRestart), msg)
}
