package policies

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/log"

	v1alpha1 "github.com/redline-dev/redline/api/v1alpha1"
	"github.com/redline-dev/redline/internal/policydoc"
)

// previousPolicies indexes the policies of the document now in force, to keep the last
// accepted generation of a policy whose update is invalid when this process has no record of
// it (after a restart). It is read only then, from the API server (the cache holds no ConfigMap content), and trusted only as a record the controller
// wrote: its bytes must be those of a document whose hash a policy's status carries (status is
// written by the controller alone; the ConfigMap is the tenant's to edit), checked before it
// is parsed, and its size is bounded before it is decompressed (documentOf). Anything else
// contributes nothing.
func (r *NamespaceReconciler) previousPolicies(ctx context.Context, ns string, live []*v1alpha1.RateLimitPolicy) map[string]policydoc.Policy {
	out := map[string]policydoc.Policy{}
	var cm corev1.ConfigMap
	if err := r.direct().Get(ctx, types.NamespacedName{Namespace: ns, Name: policydoc.ConfigMapName}, &cm); err != nil {
		return out
	}
	data, err := documentOf(&cm)
	if err != nil {
		log.FromContext(ctx).Info("configmap in place not read", "namespace", ns, "reason", err.Error())
		return out
	}
	vouched := false
	for _, p := range live {
		if h := p.Status.ConfigHash; h != "" && policydoc.Vouched(data, h) {
			vouched = true
			break
		}
	}
	if !vouched {
		return out
	}
	doc, err := policydoc.Parse(data)
	if err != nil || doc.Namespace != ns {
		return out
	}
	for _, p := range doc.Policies {
		out[p.Name] = p
	}
	return out
}

func (r *NamespaceReconciler) acceptedIn(ns string) map[types.UID]policydoc.Policy {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.accepted[ns]
}

// setAccepted records what the document just written holds; nil forgets the namespace.
func (r *NamespaceReconciler) setAccepted(ns string, m map[types.UID]policydoc.Policy) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if m == nil {
		delete(r.accepted, ns)
		return
	}
	if r.accepted == nil {
		r.accepted = map[string]map[types.UID]policydoc.Policy{}
	}
	r.accepted[ns] = m
}
