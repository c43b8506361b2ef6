package loop

import (
	"context"
	"encoding/json"
	"fmt"

	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/redline-dev/redline/api/v1alpha1"
)

// Policies are read as unstructured objects and decoded one by one. A typed informer fails to
// list every policy of the cluster when one stored object does not decode (issue 10: a window
// of 1d stopped every namespace, and a restarted manager never synced), and the API server
// stores such objects whenever its schema and the Go types disagree: objects written before a
// schema was tightened (the 1d windows of the previous release) are never validated again.
// Read this way, one bad object is reported on itself and the rest of the cluster goes on.

// NewPolicy is an empty RateLimitPolicy to read or watch as an unstructured object.
func NewPolicy() *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(v1alpha1.GroupVersion.WithKind("RateLimitPolicy"))
	return u
}

// NewPolicyList is an empty list of RateLimitPolicies, as unstructured objects.
func NewPolicyList() *unstructured.UnstructuredList {
	l := &unstructured.UnstructuredList{}
	l.SetGroupVersionKind(v1alpha1.GroupVersion.WithKind("RateLimitPolicyList"))
	return l
}

// DecodePolicy decodes as the typed client does: encoding/json through the types' own
// UnmarshalJSON (metav1.Duration, metav1.Time).
func DecodePolicy(u *unstructured.Unstructured) (*v1alpha1.RateLimitPolicy, error) {
	data, err := u.MarshalJSON()
	if err != nil {
		return nil, fmt.Errorf("encoding stored policy %s/%s: %w", u.GetNamespace(), u.GetName(), err)
	}
	var p v1alpha1.RateLimitPolicy
	if err := json.Unmarshal(data, &p); err != nil {
		return nil, fmt.Errorf("decoding stored policy %s/%s: %w", u.GetNamespace(), u.GetName(), err)
	}
	return &p, nil
}

// PatchPolicyStatus is the one writer of a RateLimitPolicy's status: it writes want where it
// differs from p's, as a merge patch under the optimistic lock. Several loops write one policy's
// status (the policy reconciler its conditions and the status beside them, the other loops a
// condition each, the top-keys writer the sidecars' counts), and a merge patch replaces lists
// whole: one computed from a stale read would drop another loop's conditions, so a read older
// than the stored object is refused as a conflict (apierrors.IsConflict on the error), to be
// retried on a fresh read. p's status becomes want. It returns whether it wrote; a policy gone
// meanwhile is not an error.
func PatchPolicyStatus(ctx context.Context, c client.Client, p *v1alpha1.RateLimitPolicy, want v1alpha1.RateLimitPolicyStatus) (bool, error) {
	if apiequality.Semantic.DeepEqual(p.Status, want) {
		return false, nil
	}
	before := p.DeepCopy()
	p.Status = want
	if err := c.Status().Patch(ctx, p, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})); err != nil {
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return false, fmt.Errorf("updating status of %s/%s: %w", p.Namespace, p.Name, err)
	}
	return true, nil
}

// SetPolicyCondition sets cond on p's status and writes it where it changed
// (PatchPolicyStatus); a conflict is returned, to be retried on a fresh read. It returns the
// condition of that type p had before (a copy, or nil) and whether it wrote. Every loop that
// sets a condition of a policy sets it here.
func SetPolicyCondition(ctx context.Context, c client.Client, p *v1alpha1.RateLimitPolicy, cond metav1.Condition) (*metav1.Condition, bool, error) {
	var prev *metav1.Condition
	if old := meta.FindStatusCondition(p.Status.Conditions, cond.Type); old != nil {
		prev = old.DeepCopy()
	}
	want := p.Status.DeepCopy()
	cond.ObservedGeneration = p.Generation
	meta.SetStatusCondition(&want.Conditions, cond)
	wrote, err := PatchPolicyStatus(ctx, c, p, *want)
	return prev, wrote, err
}

// RemovePolicyCondition removes the condition of type t from p's status where p has one
// (PatchPolicyStatus): a loop whose condition no longer concerns a policy takes it off.
func RemovePolicyCondition(ctx context.Context, c client.Client, p *v1alpha1.RateLimitPolicy, t string) error {
	if meta.FindStatusCondition(p.Status.Conditions, t) == nil {
		return nil
	}
	want := p.Status.DeepCopy()
	meta.RemoveStatusCondition(&want.Conditions, t)
	_, err := PatchPolicyStatus(ctx, c, p, *want)
	return err
}
