package policies

import (
	"context"
	"fmt"
	"slices"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/redline-dev/redline/api/v1alpha1"
	"github.com/redline-dev/redline/internal/backend"
	"github.com/redline-dev/redline/internal/controller/loop"
	"github.com/redline-dev/redline/internal/fleet"
)

// enforcement is what the sidecars of one policy report.
type enforcement struct {
	// unwritten says the reports were not read: the configuration was not written.
	unwritten bool
	// err is why the reports could not be read.
	err    error
	report fleet.Summary
	// bypass are the Service ports that reach the policy's pods around their sidecars.
	bypass bypass
	// unguarded are the Ready pods the policy selects that run without a sidecar.
	unguarded unguarded
}

// read reports whether the sidecars' reports were read (losses among them).
func (e enforcement) read() bool { return !e.unwritten && e.err == nil }

// enforcements reads the reports of the policies of outcomes that are in the document
// written, in one bounded reading of the namespace; the others are not read at all (a
// document refused, as too large or otherwise, leaves nothing to compare them with).
func (r *NamespaceReconciler) enforcements(ctx context.Context, sidecars *backend.Sidecars, backendErr error, ns, hash string, outcomes []outcome, written bool) []enforcement {
	out := make([]enforcement, len(outcomes))
	var policies []string
	var of []int
	for i := range outcomes {
		switch {
		case !outcomes[i].inDocument():
		case !written:
			out[i].unwritten = true
		case backendErr != nil:
			out[i].err = backendErr
		default:
			policies = append(policies, outcomes[i].policy.Name)
			of = append(of, i)
		}
	}
	if len(policies) == 0 {
		return out
	}
	ctx, cancel := context.WithTimeout(ctx, backend.Timeout(r.RedisTimeout))
	defer cancel()
	for k, s := range sidecars.Summaries(ctx, ns, hash, policies) {
		out[of[k]] = enforcement{err: s.Err, report: s}
	}
	return out
}

// condition turns the reports into the Enforced condition for the configuration hash the
// controller last wrote.
func (e enforcement) condition(hash string) (metav1.ConditionStatus, string, string) {
	s := e.report
	switch {
	case e.unwritten:
		return metav1.ConditionUnknown, v1alpha1.ReasonNotWritten,
			"the namespace's configuration was not written (see Programmed), so the sidecars' reports are not read"
	case e.unguarded.count > 0:
		return metav1.ConditionFalse, v1alpha1.ReasonPodsWithoutSidecar, e.unguarded.message()
	case e.bypass.count > 0:
		return metav1.ConditionFalse, v1alpha1.ReasonServiceBypassesSidecar, e.bypass.message()
	case e.err != nil:
		return metav1.ConditionUnknown, v1alpha1.ReasonRedisUnavailable,
			loop.Message("cannot read sidecar heartbeats from Redis: " + e.err.Error())
	case s.OverBound:
		return metav1.ConditionUnknown, v1alpha1.ReasonSidecarReportsOverBound, fmt.Sprintf(
			"%d live sidecars report for this policy, more than the %d heartbeats the manager reads of one policy, or than were left "+
				"of the %d it reads of a namespace per reconcile (all its policies together, the smallest groups first): they are counted, not read. "+
				"Have fewer policies select each pod, or split the workloads across namespaces", s.Live, fleet.MaxMembers, s.Bound)
	case s.Live == 0:
		return metav1.ConditionUnknown, v1alpha1.ReasonNoSidecars,
			"no live sidecar enforces this policy: no injected pod matches spec.targetSelector yet"
	}
	// A sidecar that started between the count and the read is live but unread: not counted
	// as applying the configuration until the next reconcile reads it.
	current := min(s.Current, s.Live)
	if current == s.Live {
		return metav1.ConditionTrue, v1alpha1.ReasonEnforced,
			fmt.Sprintf("%d of %d live sidecars apply configuration %.12s", s.Live, s.Live, hash)
	}
	stale := s.Stale
	if int64(len(stale)) < s.Live-current {
		stale = append(slices.Clip(stale), "...")
	}
	return metav1.ConditionFalse, v1alpha1.ReasonPropagating,
		fmt.Sprintf("%d of %d live sidecars apply configuration %.12s; still on an older one: %v",
			current, s.Live, hash, stale)
}
