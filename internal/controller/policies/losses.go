package policies

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	v1alpha1 "github.com/redline-dev/redline/api/v1alpha1"
)

// reportLosses records a Warning Event on each policy of ns whose sidecars said, since the last
// reconcile, that Redis lost counts, and keeps the counts of the policies of outcomes only. The
// first reading after the manager starts only records: what happened before was told by the
// manager that ran then.
func (r *NamespaceReconciler) reportLosses(ns string, outcomes []outcome) {
	r.lossMu.Lock()
	if r.losses == nil {
		r.losses = map[string]map[types.UID]int64{}
	}
	before := r.losses[ns]
	now := make(map[types.UID]int64, len(outcomes))
	type rise struct {
		o outcome
		n int64
	}
	var rises []rise
	for _, o := range outcomes {
		if o.policy == nil || !o.inDocument() {
			continue
		}
		prev, seen := before[o.policy.UID]
		if !o.enforcement.read() {
			if seen {
				now[o.policy.UID] = prev
			}
			continue
		}
		losses := o.enforcement.report.Losses
		now[o.policy.UID] = losses
		if seen && losses > prev {
			rises = append(rises, rise{o, losses - prev})
		}
	}
	if len(now) == 0 {
		delete(r.losses, ns)
	} else {
		r.losses[ns] = now
	}
	r.lossMu.Unlock()
	if r.Recorder == nil {
		return
	}
	for _, x := range rises {
		r.Recorder.Eventf(x.o.policy, nil, corev1.EventTypeWarning, v1alpha1.ReasonRedisLostCounts, "Restore",
			"Redis lost counts of this policy (a failover to a replica that lagged, or a restart without persistence): "+
				"%d of its sidecars' heartbeats said so since the last check; they restored what they had been granted "+
				"from their shares (redline_sidecar_restored_units_total; redline_sidecar_unkept_share_units_total counts what could not be)",
			x.n)
	}
}
