package policies

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/redline-dev/redline/api/v1alpha1"
)

// The label names of the manager's per-namespace and per-policy series.
const (
	labelNamespace = "namespace"
	labelPolicy    = "policy"
)

// policyCondition is each policy's Accepted, Programmed and Enforced on the manager's /metrics,
// so that an alert can say a policy has not been enforced for minutes. One series per policy
// and condition: its cardinality is the policies', which the manager holds anyway. A condition
// that is Unknown (Enforced with no sidecar yet) has no series.
var policyCondition = prometheus.NewGaugeVec(prometheus.GaugeOpts{
	Name: "redline_policy_condition",
	Help: "1 when the RateLimitPolicy's condition is True, 0 when False (Unknown: no series), as the leader last computed it.",
}, []string{labelNamespace, labelPolicy, "condition"})

// policyBypasses is each policy's count of Service ports that reach its pods around the
// sidecar (see bypass.go), so that a dashboard can say which policy and an alert can fire.
var policyBypasses = prometheus.NewGaugeVec(prometheus.GaugeOpts{
	Name: "redline_policy_service_bypasses",
	Help: "Service ports whose targetPort is the application's port of pods the RateLimitPolicy targets: their traffic goes around the sidecar.",
}, []string{labelNamespace, labelPolicy})

// policyPodsWithoutSidecar is each policy's count of Ready pods it selects that run without the
// sidecar (see podcheck.go).
var policyPodsWithoutSidecar = prometheus.NewGaugeVec(prometheus.GaugeOpts{
	Name: "redline_policy_pods_without_sidecar",
	Help: "Ready pods the RateLimitPolicy selects that run without the Redline sidecar: their traffic is not limited.",
}, []string{labelNamespace, labelPolicy})

// findings are the counts a policy's Enforced condition was computed from that have series of
// their own.
type findings struct{ bypasses, podsWithoutSidecar int }

// conditionMetrics remembers which policies of each namespace have series, so that a deleted
// policy's series go with it.
type conditionMetrics struct {
	mu   sync.Mutex
	seen map[string]map[string]bool // namespace -> policy
}

var exportedConditions = []string{v1alpha1.ConditionAccepted, v1alpha1.ConditionProgrammed, v1alpha1.ConditionEnforced}

// record sets the series of a namespace's policies to their conditions and drops those of
// policies it no longer has; nil drops the namespace's every series.
func (m *conditionMetrics) record(ns string, conditions map[string][]metav1.Condition, counts map[string]findings) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.seen == nil {
		m.seen = map[string]map[string]bool{}
	}
	for p := range m.seen[ns] {
		if _, ok := conditions[p]; !ok {
			policyCondition.DeletePartialMatch(prometheus.Labels{labelNamespace: ns, labelPolicy: p})
			policyBypasses.DeleteLabelValues(ns, p)
			policyPodsWithoutSidecar.DeleteLabelValues(ns, p)
		}
	}
	if len(conditions) == 0 {
		delete(m.seen, ns)
		return
	}
	now := make(map[string]bool, len(conditions))
	for p, cs := range conditions {
		now[p] = true
		policyBypasses.WithLabelValues(ns, p).Set(float64(counts[p].bypasses))
		policyPodsWithoutSidecar.WithLabelValues(ns, p).Set(float64(counts[p].podsWithoutSidecar))
		for _, t := range exportedConditions {
			var c *metav1.Condition
			for i := range cs {
				if cs[i].Type == t {
					c = &cs[i]
				}
			}
			switch {
			case c != nil && c.Status == metav1.ConditionTrue:
				policyCondition.WithLabelValues(ns, p, t).Set(1)
			case c != nil && c.Status == metav1.ConditionFalse:
				policyCondition.WithLabelValues(ns, p, t).Set(0)
			default:
				policyCondition.DeleteLabelValues(ns, p, t)
			}
		}
	}
	m.seen[ns] = now
}

// Collectors are this loop's collectors, registered on controller-runtime's registry (which
// serves /metrics); the manager's list (controller.Collectors) is the metrics reference's.
var Collectors = []prometheus.Collector{policyCondition, policyBypasses, policyPodsWithoutSidecar}

func init() { ctrlmetrics.Registry.MustRegister(Collectors...) }
