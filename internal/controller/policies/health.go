package policies

import (
	"context"
	"errors"
	"net/http"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
)

// ReadyCheck is the manager's readiness: ready once the informer caches have synced.
//
// No namespace's reconciles count. A tenant owns its namespace, and whatever makes its
// reconciles fail (an immutable ConfigMap, a ResourceQuota that forbids ConfigMaps, a webhook
// of its own that refuses them) is its own condition, on its policies' status and in an
// Event. Were it the manager's health, one tenant could take every replica's pod injection
// webhook out of its Service, and the webhook's Ignore policy would admit every new pod of
// the cluster without a sidecar. Redis outages do not count either: sidecars ride them out
// on their failure mode.
func (r *NamespaceReconciler) ReadyCheck(c cache.Cache) healthz.Checker {
	return func(req *http.Request) error {
		ctx, cancel := context.WithTimeout(req.Context(), time.Second)
		defer cancel()
		if !c.WaitForCacheSync(ctx) {
			return errors.New("informer caches have not synced")
		}
		return nil
	}
}
