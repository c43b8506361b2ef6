package budget

import (
	"maps"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/redline-dev/redline/api/v1alpha1"
	"github.com/redline-dev/redline/internal/sidecar/contract"
)

// recordEvents tells a person which workload took its namespace over its share, and when the
// namespace is back within. The culprit is a workload of that namespace whose connections grew
// since the last computation; after a restart, with nothing to compare, it is the namespace's
// largest. The Event names nothing outside the namespace.
func (r *Reconciler) recordEvents(st *budgetState, b budget) {
	if st.blamed == nil {
		st.blamed = map[workloadRef]client.Object{}
	}
	byNS := b.Namespaces()
	over := map[string]bool{}
	for _, ns := range slices.Sorted(maps.Keys(byNS)) {
		nb := byNS[ns]
		if !nb.Over() {
			continue
		}
		over[ns] = true
		var pushers []workloadLoad
		for _, w := range nb.Workloads {
			if prev, seen := st.last[w.Ref]; st.last != nil && (!seen || w.Connections() > prev) {
				pushers = append(pushers, w)
			}
		}
		if !st.wasOver[ns] && len(pushers) == 0 {
			pushers = nb.Workloads[:1]
		}
		for _, w := range pushers {
			st.blamed[w.Ref] = w.target
			if r.Recorder != nil {
				r.Recorder.Eventf(w.target, nil, corev1.EventTypeWarning, v1alpha1.ReasonOverBudget, "RedisConnectionBudget",
					"%s at %d replicas x %d connections takes its namespace over its share of Redis's connections: %s; lower maxReplicas or %s",
					w.Ref, w.Replicas, w.Pool, nb.Summary(), contract.AnnotationRedisPoolSize)
			}
		}
	}
	for ref, obj := range st.blamed {
		if over[ref.Namespace] {
			continue
		}
		if r.Recorder != nil {
			msg := "namespace " + ref.Namespace + " runs no injected workload any more"
			if nb, ok := byNS[ref.Namespace]; ok {
				msg = nb.Summary()
			}
			r.Recorder.Eventf(obj, nil, corev1.EventTypeNormal, v1alpha1.ReasonWithinBudget, "RedisConnectionBudget",
				"Redis connections are within the namespace's share again: %s", msg)
		}
		delete(st.blamed, ref)
	}
	st.wasOver = over
	st.last = map[workloadRef]int64{}
	for _, w := range b.Workloads {
		st.last[w.Ref] = w.Connections()
	}
}
