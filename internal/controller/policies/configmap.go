package policies

import (
	"context"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redline-dev/redline/internal/controller/loop"
	"github.com/redline-dev/redline/internal/policydoc"
)

func (r *NamespaceReconciler) currentConfigMap(ctx context.Context, ns string) (*corev1.ConfigMap, error) {
	var cm corev1.ConfigMap
	err := r.Get(ctx, types.NamespacedName{Namespace: ns, Name: policydoc.ConfigMapName}, &cm)
	switch {
	case apierrors.IsNotFound(err):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("reading configmap %s/%s: %w", ns, policydoc.ConfigMapName, err)
	}
	return &cm, nil
}

func (r *NamespaceReconciler) direct() client.Reader {
	if r.Direct != nil {
		return r.Direct
	}
	return r.Client
}

func (r *NamespaceReconciler) writeConfigMap(ctx context.Context, ns string, current *corev1.ConfigMap, doc *policydoc.Document, data []byte, order []sized) error {
	payload, err := encodeDocument(ns, doc, data, r.maxDocumentBytes(), current, order...)
	if err != nil {
		return err
	}
	name := ns + "/" + policydoc.ConfigMapName
	if current != nil && current.Labels[loop.ManagedByLabel] != loop.ManagedByValue {
		return notManaged(name, nil)
	}
	// What the controller owns of the ConfigMap, built afresh: nothing the tenant added (and
	// nothing of the cache's slimmed copy) is carried over.
	want := &corev1.ConfigMap{}
	want.Namespace, want.Name = ns, policydoc.ConfigMapName
	want.Labels = map[string]string{loop.ManagedByLabel: loop.ManagedByValue}
	want.Annotations = map[string]string{HashAnnotation: doc.Hash}
	payload.apply(want)
	if current == nil {
		if err := r.Create(ctx, want); err != nil {
			if apierrors.IsAlreadyExists(err) {
				return notManaged(name, err)
			}
			return apiRefused(fmt.Sprintf("creating configmap %s", name), err)
		}
		return nil
	}
	if payload.matches(current) && current.Annotations[HashAnnotation] == doc.Hash {
		return nil
	}
	if current.Immutable != nil && *current.Immutable {
		return &tenantError{err: fmt.Errorf("configmap %s is immutable, so the controller cannot update it; delete it and the controller recreates it: "+
			"kubectl -n %s delete configmap %s", name, ns, policydoc.ConfigMapName)}
	}
	want.ResourceVersion, want.UID = current.ResourceVersion, current.UID
	// Update, not patch: the resourceVersion makes a concurrent writer fail instead of being
	// overwritten silently.
	if err := r.Update(ctx, want); err != nil {
		return apiRefused(fmt.Sprintf("updating configmap %s", name), err)
	}
	return nil
}

func notManaged(name string, err error) error {
	msg := fmt.Sprintf("configmap %s exists but is not managed by redline (label %s=%s missing); delete or rename it", name, loop.ManagedByLabel, loop.ManagedByValue)
	if err != nil {
		return &tenantError{err: fmt.Errorf("%s: %w", msg, err)}
	}
	return &tenantError{err: errors.New(msg)}
}

// apiRefused wraps a failed write of a namespace's ConfigMap. The API server refusing it for
// what the namespace holds (an immutable object, a ResourceQuota, a LimitRange or an admission
// webhook of the tenant's, a size limit) is the tenant's condition: retrying sooner than the
// resync changes nothing. A conflict or an unavailable API server is retried with backoff.
func apiRefused(doing string, err error) error {
	if apierrors.IsInvalid(err) || apierrors.IsForbidden(err) || apierrors.IsRequestEntityTooLargeError(err) || apierrors.IsBadRequest(err) {
		return &tenantError{err: fmt.Errorf("%s: the API server refused it (fix what the namespace holds that refuses it: an immutable ConfigMap, a ResourceQuota, an admission webhook): %w", doing, err)}
	}
	return fmt.Errorf("%s: %w", doing, err)
}

func (r *NamespaceReconciler) maxDocumentBytes() int {
	if r.MaxDocumentBytes > 0 {
		return r.MaxDocumentBytes
	}
	return MaxConfigMapBytes
}

func (r *NamespaceReconciler) deleteConfigMap(ctx context.Context, cm *corev1.ConfigMap) error {
	if cm == nil || cm.Labels[loop.ManagedByLabel] != loop.ManagedByValue {
		return nil
	}
	err := r.Delete(ctx, cm, client.Preconditions{UID: &cm.UID, ResourceVersion: &cm.ResourceVersion})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting configmap %s/%s: %w", cm.Namespace, cm.Name, err)
	}
	return nil
}
