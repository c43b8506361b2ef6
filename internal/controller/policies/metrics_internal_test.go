package policies

import (
	"testing"

	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/redline-dev/redline/api/v1alpha1"
)

// series returns the value of every series of policyCondition in namespace ns, by
// "namespace/policy/condition" (the envtest suite's manager records its own namespaces).
func series(t *testing.T, ns string) map[string]float64 {
	ch := make(chan prometheus.Metric, 64)
	policyCondition.Collect(ch)
	close(ch)
	out := map[string]float64{}
	for m := range ch {
		var d dto.Metric
		if err := m.Write(&d); err != nil {
			t.Fatalf("reading a series: %v", err)
		}
		l := map[string]string{}
		for _, p := range d.GetLabel() {
			l[p.GetName()] = p.GetValue()
		}
		if l["namespace"] == ns {
			out[l["namespace"]+"/"+l["policy"]+"/"+l["condition"]] = d.GetGauge().GetValue()
		}
	}
	return out
}

// Each policy's conditions are series of redline_policy_condition: 1 True, 0 False, none for
// Unknown; a policy that goes, or a namespace with none left, takes its series with it.
func TestPolicyConditionSeriesFollowThePolicies(t *testing.T) {
	g := NewWithT(t)
	var m conditionMetrics
	cond := func(typ string, s metav1.ConditionStatus) metav1.Condition {
		return metav1.Condition{Type: typ, Status: s}
	}
	m.record("metrics-a", map[string][]metav1.Condition{
		"p": {cond(v1alpha1.ConditionAccepted, metav1.ConditionTrue), cond(v1alpha1.ConditionProgrammed, metav1.ConditionTrue), cond(v1alpha1.ConditionEnforced, metav1.ConditionFalse)},
		"q": {cond(v1alpha1.ConditionAccepted, metav1.ConditionTrue), cond(v1alpha1.ConditionEnforced, metav1.ConditionUnknown)},
	}, map[string]findings{"p": {bypasses: 2, podsWithoutSidecar: 3}})
	g.Expect(series(t, "metrics-a")).To(Equal(map[string]float64{
		"metrics-a/p/Accepted": 1, "metrics-a/p/Programmed": 1, "metrics-a/p/Enforced": 0, "metrics-a/q/Accepted": 1,
	}), "q's Enforced is Unknown: no series")

	var bypassed dto.Metric
	g.Expect(policyBypasses.WithLabelValues("metrics-a", "p").Write(&bypassed)).To(Succeed())
	g.Expect(bypassed.GetGauge().GetValue()).To(Equal(2.0))
	var bare dto.Metric
	g.Expect(policyPodsWithoutSidecar.WithLabelValues("metrics-a", "p").Write(&bare)).To(Succeed())
	g.Expect(bare.GetGauge().GetValue()).To(Equal(3.0))
	m.record("metrics-a", map[string][]metav1.Condition{"q": {cond(v1alpha1.ConditionAccepted, metav1.ConditionTrue)}}, nil)
	g.Expect(series(t, "metrics-a")).To(Equal(map[string]float64{"metrics-a/q/Accepted": 1}), "p's series went with p")

	m.record("metrics-a", nil, nil)
	g.Expect(series(t, "metrics-a")).To(BeEmpty())
}
