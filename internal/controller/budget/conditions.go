package budget

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/redline-dev/redline/api/v1alpha1"
	"github.com/redline-dev/redline/internal/backend"
	"github.com/redline-dev/redline/internal/controller/loop"
	"github.com/redline-dev/redline/internal/sidecar/contract"
)

// updatePolicies writes the RedisConnectionBudget condition of every policy, where it changed,
// from its namespace's Redis's budget. The policies are the cache's, not copied: loop.DecodePolicy
// makes the copy that is written.
func (r *Reconciler) updatePolicies(ctx context.Context, results map[string]budgetResult, backendOf func(string) (string, error)) error {
	list := loop.NewPolicyList()
	if err := r.policyReader().List(ctx, list, client.UnsafeDisableDeepCopy); err != nil {
		return fmt.Errorf("listing ratelimitpolicies: %w", err)
	}
	var errs []error
	for i := range list.Items {
		p, err := loop.DecodePolicy(&list.Items[i])
		if err != nil {
			continue // the namespace reconciler reports it Undecodable
		}
		name, err := backendOf(p.Namespace)
		res, ok := results[name]
		switch {
		case err != nil:
			res = budgetResult{redisErr: err}
		case !ok:
			res = budgetResult{redisErr: &backend.NotReadyError{Name: name}}
		}
		status, reason, msg := budgetCondition(p, res.byNS[p.Namespace], res.redisErr)
		if _, _, err := loop.SetPolicyCondition(ctx, r.Client, p, metav1.Condition{
			Type: v1alpha1.ConditionRedisConnectionBudget, Status: status, Reason: reason, Message: loop.Message(msg),
		}); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// budgetCondition is the condition one policy carries: False when its namespace can open more
// than its share and a workload the policy targets is part of that. It names only the
// namespace's own workloads and numbers.
func budgetCondition(p *v1alpha1.RateLimitPolicy, nb namespaceBudget, redisErr error) (metav1.ConditionStatus, string, string) {
	if redisErr != nil {
		return metav1.ConditionUnknown, v1alpha1.ReasonBudgetUnknown, "Redis's maxclients or connected_clients cannot be read: " + redisErr.Error()
	}
	var mine []string
	if sel, err := metav1.LabelSelectorAsSelector(&p.Spec.TargetSelector); err == nil {
		for _, w := range nb.Workloads {
			if sel.Matches(labels.Set(w.PodLabels)) {
				mine = append(mine, fmt.Sprintf("%s %d x %d", w.Ref, w.Replicas, w.Pool))
			}
		}
	}
	if len(mine) == 0 {
		return metav1.ConditionTrue, v1alpha1.ReasonNoInjectedWorkloads, "no injected Deployment, StatefulSet or ReplicaSet of the namespace that runs pods matches targetSelector"
	}
	slices.Sort(mine)
	targets := "this policy's workloads at maxReplicas x pool: " + strings.Join(mine, ", ")
	if nb.Over() {
		return metav1.ConditionFalse, v1alpha1.ReasonOverBudget, nb.Summary() + "; " + targets +
			"; at that scale the namespace takes connections other namespaces are promised, and when Redis refuses connections its policies fall back to their failureMode: lower maxReplicas or " +
			contract.AnnotationRedisPoolSize
	}
	return metav1.ConditionTrue, v1alpha1.ReasonWithinBudget, "within the namespace's share of Redis's connections; " + targets
}
