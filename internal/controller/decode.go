package controller

import (
	"context"
	"encoding/json"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	v1alpha1 "github.com/redline-dev/redline/api/v1alpha1"
	"github.com/redline-dev/redline/internal/policydoc"
)

// ReasonUndecodable is the Event reason on a stored policy that does not decode into v1alpha1.
const ReasonUndecodable = "Undecodable"

// Policies are read as unstructured objects and decoded one by one. A typed informer fails to
// list every policy of the cluster when one stored object does not decode (issue 10: a window
// of 1d stopped every namespace, and a restarted manager never synced), and the API server
// stores such objects whenever its schema and the Go types disagree: objects written before a
// schema was tightened (the 1d windows of the previous release) are never validated again.
// Read this way, one bad object is reported on itself and the rest of the cluster goes on.
func newPolicyObject() *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(v1alpha1.GroupVersion.WithKind("RateLimitPolicy"))
	return u
}

func newPolicyList() *unstructured.UnstructuredList {
	l := &unstructured.UnstructuredList{}
	l.SetGroupVersionKind(v1alpha1.GroupVersion.WithKind("RateLimitPolicyList"))
	return l
}

func (r *NamespaceReconciler) policyReader() client.Reader {
	if r.Policies != nil {
		return r.Policies
	}
	return r.Client
}

// undecodable is a stored policy that does not decode: policy carries only its metadata.
type undecodable struct {
	object *unstructured.Unstructured
	policy *v1alpha1.RateLimitPolicy
	err    error
}

// listPolicies returns the live policies of ns that decode, and those that do not.
func (r *NamespaceReconciler) listPolicies(ctx context.Context, ns string) ([]*v1alpha1.RateLimitPolicy, []undecodable, error) {
	list := newPolicyList()
	if err := r.policyReader().List(ctx, list, client.InNamespace(ns)); err != nil {
		return nil, nil, fmt.Errorf("listing policies of %s: %w", ns, err)
	}
	var live []*v1alpha1.RateLimitPolicy
	var bad []undecodable
	for i := range list.Items {
		u := &list.Items[i]
		if u.GetDeletionTimestamp() != nil {
			continue
		}
		p, err := decodePolicy(u)
		if err == nil {
			live = append(live, p)
			continue
		}
		log.FromContext(ctx).Error(err, "stored policy does not decode; skipping it", "namespace", u.GetNamespace(), "name", u.GetName())
		meta := &v1alpha1.RateLimitPolicy{}
		meta.Namespace, meta.Name, meta.UID = u.GetNamespace(), u.GetName(), u.GetUID()
		meta.Generation, meta.ResourceVersion = u.GetGeneration(), u.GetResourceVersion()
		// The status decodes on its own when only the spec is bad; keeping it keeps condition times.
		if st, ok := u.Object["status"]; ok {
			if data, err := json.Marshal(st); err == nil {
				_ = json.Unmarshal(data, &meta.Status)
			}
		}
		bad = append(bad, undecodable{object: u, policy: meta, err: err})
	}
	return live, bad, nil
}

// decodePolicy decodes as the typed client does: encoding/json through the types' own
// UnmarshalJSON (metav1.Duration, metav1.Time).
func decodePolicy(u *unstructured.Unstructured) (*v1alpha1.RateLimitPolicy, error) {
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

func findUndecodable(bad []undecodable, p *v1alpha1.RateLimitPolicy) *undecodable {
	for i := range bad {
		if bad[i].policy == p {
			return &bad[i]
		}
	}
	return nil
}

func undecodableErr(bad []undecodable, p *v1alpha1.RateLimitPolicy) error {
	if u := findUndecodable(bad, p); u != nil {
		return fmt.Errorf("the stored object does not decode (%w); edit or recreate it with a valid spec, e.g. window: 24h instead of 1d", u.err)
	}
	return nil
}

// updateUndecodableStatus writes the status of an undecodable policy with a merge patch on the
// unstructured object (a typed patch would fail decoding the reply), which also replaces a
// status that was itself the undecodable part, and records an Event on the object.
func (r *NamespaceReconciler) updateUndecodableStatus(ctx context.Context, u *undecodable, o outcome, doc *policydoc.Document) error {
	want := desiredStatus(o, doc)
	if apiequality.Semantic.DeepEqual(u.policy.Status, want) {
		if _, ok, _ := unstructured.NestedFieldNoCopy(u.object.Object, "status", "conditions"); ok {
			return nil
		}
	}
	body, err := json.Marshal(map[string]any{"status": want})
	if err != nil {
		return fmt.Errorf("encoding status of %s/%s: %w", u.object.GetNamespace(), u.object.GetName(), err)
	}
	if err := r.Status().Patch(ctx, u.object.DeepCopy(), client.RawPatch(types.MergePatchType, body)); err != nil {
		return fmt.Errorf("updating status of undecodable %s/%s: %w", u.object.GetNamespace(), u.object.GetName(), err)
	}
	if r.Recorder != nil {
		r.Recorder.Eventf(u.object, nil, corev1.EventTypeWarning, ReasonUndecodable, "Reconcile",
			"skipped: %s", truncate(o.compileErr.Error()))
	}
	return nil
}
