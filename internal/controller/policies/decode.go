package policies

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
	"github.com/redline-dev/redline/internal/controller/loop"
	"github.com/redline-dev/redline/internal/policydoc"
)

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
	list := loop.NewPolicyList()
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
		p, err := loop.DecodePolicy(u)
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
		r.Recorder.Eventf(u.object, nil, corev1.EventTypeWarning, v1alpha1.ReasonUndecodable, "Reconcile",
			"skipped: %s", loop.Message(o.compileErr.Error()))
	}
	return nil
}
