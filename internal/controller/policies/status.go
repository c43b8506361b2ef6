package policies

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/redline-dev/redline/api/v1alpha1"
	"github.com/redline-dev/redline/internal/controller/loop"
	"github.com/redline-dev/redline/internal/policydoc"
)

// desiredStatus is the status a policy should carry after this reconcile.
func desiredStatus(o outcome, doc *policydoc.Document) v1alpha1.RateLimitPolicyStatus {
	p := o.policy
	st := *p.Status.DeepCopy()
	st.ObservedGeneration = p.Generation
	set := func(t string, s metav1.ConditionStatus, reason, msg string) {
		meta.SetStatusCondition(&st.Conditions, metav1.Condition{
			Type: t, Status: s, Reason: reason, Message: msg, ObservedGeneration: p.Generation,
		})
	}

	if o.compileErr != nil {
		set(v1alpha1.ConditionAccepted, metav1.ConditionFalse, v1alpha1.ReasonInvalid, loop.Message(o.compileErr.Error()))
	} else {
		set(v1alpha1.ConditionAccepted, metav1.ConditionTrue, v1alpha1.ReasonAccepted,
			fmt.Sprintf("%d rule(s) compiled", len(p.Spec.Rules)))
	}

	switch {
	case o.compileErr != nil && o.keptGeneration > 0:
		set(v1alpha1.ConditionProgrammed, metav1.ConditionFalse, v1alpha1.ReasonInvalid,
			fmt.Sprintf("spec generation %d is invalid; generation %d stays in ConfigMap %s", p.Generation, o.keptGeneration, policydoc.ConfigMapName))
	case o.compileErr != nil:
		set(v1alpha1.ConditionProgrammed, metav1.ConditionFalse, v1alpha1.ReasonInvalid,
			"spec is invalid; the policy is not enforced")
	case o.configErr != nil:
		reason := v1alpha1.ReasonConfigMapError
		var te *tenantError
		if errors.As(o.configErr, &te) && te.reason != "" {
			reason = te.reason
		}
		set(v1alpha1.ConditionProgrammed, metav1.ConditionFalse, reason, loop.Message(o.configErr.Error()))
	case o.scriptErr != nil:
		set(v1alpha1.ConditionProgrammed, metav1.ConditionFalse, v1alpha1.ReasonRedisUnavailable,
			loop.Message("scripts cannot be loaded into Redis; sidecars apply the policy's failureMode: "+o.scriptErr.Error()))
	default:
		set(v1alpha1.ConditionProgrammed, metav1.ConditionTrue, v1alpha1.ReasonProgrammed,
			fmt.Sprintf("in ConfigMap %s (hash %.12s) with its scripts loaded in Redis", policydoc.ConfigMapName, doc.Hash))
	}
	if !o.inDocument() {
		set(v1alpha1.ConditionEnforced, metav1.ConditionFalse, v1alpha1.ReasonInvalid, "the policy is not in the configuration")
		st.ConfigHash, st.Scripts = "", nil
		return st
	}
	status, reason, msg := o.enforcement.condition(doc.Hash)
	set(v1alpha1.ConditionEnforced, status, reason, msg)
	// A ConfigMap that could not be written leaves the hash and scripts of the last one.
	if o.configErr == nil {
		st.ConfigHash = doc.Hash
		st.Scripts = scriptsOf(doc, p.Name)
	}
	return st
}

// scriptsOf lists the scripts the policy's compiled rules run, their candidates' included.
func scriptsOf(doc *policydoc.Document, name string) []v1alpha1.ScriptStatus {
	var out []v1alpha1.ScriptStatus
	add := func(name string) {
		alg := v1alpha1.Algorithm(name)
		if !slices.ContainsFunc(out, func(s v1alpha1.ScriptStatus) bool { return s.Algorithm == alg }) {
			out = append(out, v1alpha1.ScriptStatus{Algorithm: alg, SHA: doc.Scripts[name]})
		}
	}
	for _, p := range doc.Policies {
		if p.Name != name {
			continue
		}
		for _, r := range p.Rules {
			if r.InFlight != 0 {
				continue // runs the slots' scripts, which are no algorithm's
			}
			add(r.Algorithm)
			if r.Candidate != nil {
				add(r.Candidate.Algorithm)
			}
		}
	}
	slices.SortFunc(out, func(a, b v1alpha1.ScriptStatus) int { return strings.Compare(string(a.Algorithm), string(b.Algorithm)) })
	return out
}

// errStaleStatus reports a status write refused because the policy changed since it was read.
var errStaleStatus = errors.New("policy changed since it was read")

// updateStatus writes the status only when it changed, and records an Event when Accepted or
// Programmed changes, or when Enforced becomes SidecarReportsOverBound, ServiceBypassesSidecar or PodsWithoutSidecar, which is what a person
// wants to be told about.
func (r *NamespaceReconciler) updateStatus(ctx context.Context, o outcome, doc *policydoc.Document) error {
	p := o.policy
	before := p.DeepCopy()
	// Read from a cache that has not seen the budget reconciler's last write, the patch would
	// drop RedisConnectionBudget until the next budget pass: the one writer refuses that stale
	// read as a conflict, retried on a fresh read.
	wrote, err := loop.PatchPolicyStatus(ctx, r.Client, p, desiredStatus(o, doc))
	switch {
	case apierrors.IsConflict(err):
		return errStaleStatus
	case err != nil:
		return err
	case wrote:
		r.recordChanges(before, p)
	}
	return nil
}

func (r *NamespaceReconciler) recordChanges(before, after *v1alpha1.RateLimitPolicy) {
	if r.Recorder == nil {
		return
	}
	for _, t := range []string{v1alpha1.ConditionAccepted, v1alpha1.ConditionProgrammed} {
		old := meta.FindStatusCondition(before.Status.Conditions, t)
		cur := meta.FindStatusCondition(after.Status.Conditions, t)
		if cur == nil || old != nil && old.Status == cur.Status && old.Reason == cur.Reason {
			continue
		}
		kind := corev1.EventTypeNormal
		if cur.Status != metav1.ConditionTrue {
			kind = corev1.EventTypeWarning
		}
		r.Recorder.Eventf(after, nil, kind, cur.Reason, "Reconcile", "%s=%s: %s", t, cur.Status, cur.Message)
	}
	// Enforced changes with every rollout, which is no news; reports left unread are.
	old := meta.FindStatusCondition(before.Status.Conditions, v1alpha1.ConditionEnforced)
	cur := meta.FindStatusCondition(after.Status.Conditions, v1alpha1.ConditionEnforced)
	if cur != nil && (cur.Reason == v1alpha1.ReasonSidecarReportsOverBound || cur.Reason == v1alpha1.ReasonServiceBypassesSidecar || cur.Reason == v1alpha1.ReasonPodsWithoutSidecar) && (old == nil || old.Reason != cur.Reason) {
		r.Recorder.Eventf(after, nil, corev1.EventTypeWarning, cur.Reason, "ReadReports", "%s=%s: %s", v1alpha1.ConditionEnforced, cur.Status, cur.Message)
	}
}
