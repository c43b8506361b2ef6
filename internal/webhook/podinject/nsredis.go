package podinject

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"slices"
	"sync"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	v1alpha1 "github.com/redline-dev/redline/api/v1alpha1"
	"github.com/redline-dev/redline/internal/backend"
	"github.com/redline-dev/redline/internal/connbudget"
	"github.com/redline-dev/redline/internal/redisconn"
	"github.com/redline-dev/redline/internal/sidecar/contract"
)

// RedisConfigMapName names the ConfigMap the manager writes in each namespace a RedisBackend
// serves or that has injected workloads: its Redis's URL and TLS names, which every injected
// sidecar reads through optional environment variables (valueFrom, contract.EnvNamespaceRedisURL)
// and takes over the cluster's Redis its pod spec names. The webhook answers whoever reaches
// it, and a review it is sent can name a pod of any namespace: every patch names this
// ConfigMap alike, whichever Redis serves the namespace, and tells nothing of what is in it.
const RedisConfigMapName = "redline-sidecar-redis"

// Keys of RedisConfigMapName.
const (
	// RedisConfigMapURLKey is the Redis URL (contract.EnvRedisURL).
	RedisConfigMapURLKey = "url"
	// RedisConfigMapTLSServerNameKey and RedisConfigMapTLSMinVersionKey are the sidecar's
	// --redis-tls-server-name and --redis-tls-min-version; empty: the sidecar's defaults.
	RedisConfigMapTLSServerNameKey = "tls-server-name"
	RedisConfigMapTLSMinVersionKey = "tls-min-version"
	// RedisConfigMapTLSCAFileKey, RedisConfigMapTLSCertFileKey and RedisConfigMapTLSKeyFileKey
	// are the sidecar's --redis-tls-ca-file, --redis-tls-cert-file and --redis-tls-key-file:
	// the files of the TLS Secret's volume where the Redis uses TLS, empty where it does not,
	// so that whether it does is in the ConfigMap and not in the pod's patch.
	RedisConfigMapTLSCAFileKey   = "tls-ca-file"
	RedisConfigMapTLSCertFileKey = "tls-cert-file"
	RedisConfigMapTLSKeyFileKey  = "tls-key-file"
)

// Labels of RedisConfigMapName.
const (
	managedByLabel = "app.kubernetes.io/managed-by"
	managedByValue = "redline"
)

// redisConfigMapData is what RedisConfigMapName holds for a namespace served by nr. A
// namespace the manager's Redis serves (one a RedisBackend served before) gets the manager's
// Redis, so that its sidecars injected then still find their settings when they restart.
//
// The pod's patch is the same whichever Redis serves the namespace (sidecarContainer): a
// Redis without TLS gets every TLS key empty, which the sidecar reads as no TLS setting.
func redisConfigMapData(cfg *Config, nr backend.NamespaceRedis) map[string]string {
	url, tls := cmp.Or(nr.URL, cfg.RedisURL), cfg.SidecarRedisTLS
	if nr.Backend {
		url, tls.ServerName, tls.MinVersion = nr.URL, nr.TLSServerName, cmp.Or(nr.TLSMinVersion, tls.MinVersion)
	}
	var o redisconn.TLSOptions
	if redisconn.URLUsesTLS(url) {
		o = tls.options()
	}
	return map[string]string{
		RedisConfigMapURLKey:           url,
		RedisConfigMapTLSServerNameKey: o.ServerName,
		RedisConfigMapTLSMinVersionKey: o.MinVersion,
		RedisConfigMapTLSCAFileKey:     o.CAFile,
		RedisConfigMapTLSCertFileKey:   o.CertFile,
		RedisConfigMapTLSKeyFileKey:    o.KeyFile,
	}
}

// +kubebuilder:rbac:groups="",resources=configmaps,verbs=list;watch;create
// +kubebuilder:rbac:groups="",resources=configmaps,resourceNames=redline-sidecar-redis,verbs=get;update;patch;delete
// +kubebuilder:rbac:groups=redline.dev,resources=redisbackends,verbs=get;list;watch
// +kubebuilder:rbac:groups=apps,resources=deployments;statefulsets;replicasets,verbs=get;list;watch
// +kubebuilder:rbac:groups=autoscaling,resources=horizontalpodautoscalers,verbs=get;list;watch

// NamespaceRedisReconciler writes RedisConfigMapName in every namespace a RedisBackend
// serves or that has injected workloads (their keys: workloadData), and keeps it true: what a tenant changes in it, or a deletion, is undone; a
// namespace that leaves its backend keeps it, with the manager's Redis in it. It writes
// nothing in the namespaces the manager's Redis has always served: their pods are given the
// cluster-wide settings, which every namespace's pods get alike.
type NamespaceRedisReconciler struct {
	// Client writes the ConfigMaps.
	Client client.Client
	// Reader reads them: a cache of those ConfigMaps only (SetupWithManager), or the API server.
	Reader client.Reader
	// Config is the webhook's: Backends tells which Redis serves a namespace, RedisURL and
	// SidecarRedisTLS are the manager's Redis's.
	Config *Config

	// budgetChanged hears of a connection budget that sizes pools differently; the namespaces
	// of its workloads wait in pending. nil when not set up with a manager.
	budgetChanged chan event.GenericEvent
	mu            sync.Mutex
	pending       map[string]struct{}
	// subscribed are the budgets budgetChanged is subscribed to, one per Redis.
	subscribed map[*connbudget.Publisher]bool
}

// subscribe makes a change of budget b reach budgetChanged, once per budget. Only the
// namespaces with workloads in the new budget can have a pool to change (one whose last
// workload went is looked at on that workload's deletion).
func (r *NamespaceRedisReconciler) subscribe(b *connbudget.Publisher) {
	if b == nil || r.budgetChanged == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.subscribed[b] {
		return
	}
	if r.subscribed == nil {
		r.subscribed = map[*connbudget.Publisher]bool{}
	}
	r.subscribed[b] = true
	b.Subscribe(func(s *connbudget.Snapshot) {
		r.mu.Lock()
		if r.pending == nil {
			r.pending = map[string]struct{}{}
		}
		for w := range s.Workloads {
			r.pending[w.Namespace] = struct{}{}
		}
		r.mu.Unlock()
		select {
		case r.budgetChanged <- event.GenericEvent{Object: &corev1.Namespace{}}:
		default: // a notice is pending already: it takes every pending namespace
		}
	})
}

// pendingNamespaces takes the namespaces a change of budget left to look at.
func (r *NamespaceRedisReconciler) pendingNamespaces(context.Context, client.Object) []reconcile.Request {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]reconcile.Request, 0, len(r.pending))
	for ns := range r.pending {
		out = append(out, reconcile.Request{NamespacedName: types.NamespacedName{Name: ns}})
	}
	r.pending = nil
	return out
}

// Reconcile makes the ConfigMap of namespace req.Name hold its Redis's settings.
func (r *NamespaceRedisReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	ns := req.Name
	nr, err := r.Config.Backends.Redis(ctx, ns)
	if apierrors.IsNotFound(err) {
		return ctrl.Result{}, nil // the namespace is gone
	}
	if err != nil {
		return ctrl.Result{}, err
	}
	var cur corev1.ConfigMap
	err = r.Reader.Get(ctx, types.NamespacedName{Namespace: ns, Name: RedisConfigMapName}, &cur)
	exists := err == nil
	switch {
	case apierrors.IsNotFound(err):
	case err != nil:
		return ctrl.Result{}, fmt.Errorf("reading configmap %s/%s: %w", ns, RedisConfigMapName, err)
	}
	var namespace corev1.Namespace
	if err := r.Client.Get(ctx, types.NamespacedName{Name: ns}, &namespace); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	optedIn := namespace.Labels[contract.NamespaceLabelInjection] == contract.NamespaceInjectionEnabled
	// The pools follow the budget, which changes with every namespace's workloads: subscribed
	// before it is read, so that no change is missed.
	r.subscribe(nr.Budget)
	workloads, err := workloadData(ctx, r.Client, ns, optedIn, nr.Budget.Load())
	if err != nil {
		return ctrl.Result{}, err
	}
	if !exists && !nr.Backend && len(workloads) == 0 {
		return ctrl.Result{}, nil
	}
	data := redisConfigMapData(r.Config, nr)
	maps.Copy(data, workloads)
	want := corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: RedisConfigMapName, Labels: map[string]string{managedByLabel: managedByValue}},
		Data:       data,
	}
	if !exists {
		err := r.Client.Create(ctx, &want)
		switch {
		case apierrors.HasStatusCause(err, corev1.NamespaceTerminatingCause):
			return ctrl.Result{}, nil
		case apierrors.IsAlreadyExists(err):
			return ctrl.Result{}, nil // not in the cache yet, whose event brings it back
		case err != nil:
			return ctrl.Result{}, fmt.Errorf("creating configmap %s/%s: %w", ns, RedisConfigMapName, err)
		}
		log.FromContext(ctx).Info("wrote the sidecars' redis settings", "namespace", ns, "redisBackend", nr.Backend, "workloads", len(workloads)/2)
		return ctrl.Result{}, nil
	}
	if sameData(cur.Data, want.Data) && len(cur.BinaryData) == 0 && cur.Labels[managedByLabel] == managedByValue &&
		(cur.Immutable == nil || !*cur.Immutable) {
		return ctrl.Result{}, nil
	}
	want.ResourceVersion = cur.ResourceVersion
	err = r.Client.Update(ctx, &want)
	if apierrors.IsInvalid(err) {
		// Made immutable: replace it.
		if err := r.Client.Delete(ctx, &cur, client.Preconditions{UID: &cur.UID}); client.IgnoreNotFound(err) != nil {
			return ctrl.Result{}, fmt.Errorf("replacing configmap %s/%s: %w", ns, RedisConfigMapName, err)
		}
		want.ResourceVersion = ""
		err = r.Client.Create(ctx, &want)
	}
	if err != nil {
		return ctrl.Result{}, fmt.Errorf("writing configmap %s/%s: %w", ns, RedisConfigMapName, err)
	}
	return ctrl.Result{}, nil
}

// SetupWithManager registers the reconciler: namespaces (their labels choose their backend),
// RedisBackends, the ConfigMaps themselves, and the Backends' own change notices when they
// have any. The ConfigMaps are watched through a cache of their own that holds the ones of
// that name only.
func (r *NamespaceRedisReconciler) SetupWithManager(mgr ctrl.Manager) error {
	cms, err := cache.New(mgr.GetConfig(), cache.Options{
		Scheme: mgr.GetScheme(), Mapper: mgr.GetRESTMapper(),
		ByObject: map[client.Object]cache.ByObject{&corev1.ConfigMap{}: {
			Field:     fields.OneTermEqualSelector("metadata.name", RedisConfigMapName),
			Transform: slimRedisConfigMap,
		}},
	})
	if err != nil {
		return fmt.Errorf("creating the sidecar redis configmaps cache: %w", err)
	}
	if err := mgr.Add(cms); err != nil {
		return fmt.Errorf("adding the sidecar redis configmaps cache: %w", err)
	}
	r.Reader = cms
	b := ctrl.NewControllerManagedBy(mgr).
		Named("sidecarredis").
		For(&corev1.Namespace{}).
		Watches(&v1alpha1.RedisBackend{}, handler.EnqueueRequestsFromMapFunc(r.allNamespaces)).
		WatchesRawSource(source.Kind(cms, client.Object(&corev1.ConfigMap{}), handler.EnqueueRequestsFromMapFunc(ofNamespace))).
		// A workload's replicas, HPA and template change its keys; its status (most of its
		// updates) does not.
		Watches(&appsv1.Deployment{}, handler.EnqueueRequestsFromMapFunc(ofNamespace), specChanges).
		Watches(&appsv1.StatefulSet{}, handler.EnqueueRequestsFromMapFunc(ofNamespace), specChanges).
		Watches(&appsv1.ReplicaSet{}, handler.EnqueueRequestsFromMapFunc(ofNamespace), specChanges).
		Watches(&autoscalingv2.HorizontalPodAutoscaler{}, handler.EnqueueRequestsFromMapFunc(ofNamespace))
	r.budgetChanged = make(chan event.GenericEvent, 1)
	b = b.WatchesRawSource(source.Channel(r.budgetChanged, handler.EnqueueRequestsFromMapFunc(r.pendingNamespaces)))
	if s, ok := r.Config.Backends.(interface {
		Subscribe() <-chan event.GenericEvent
	}); ok {
		b = b.WatchesRawSource(source.Channel(s.Subscribe(), handler.EnqueueRequestsFromMapFunc(r.allNamespaces)))
	}
	return b.Complete(r)
}

// specChanges passes a workload's creation, deletion and spec changes (its generation).
var specChanges = builder.WithPredicates(predicate.GenerationChangedPredicate{})

// ofNamespace is the request of the object's namespace.
func ofNamespace(_ context.Context, o client.Object) []reconcile.Request {
	return []reconcile.Request{{NamespacedName: types.NamespacedName{Name: o.GetNamespace()}}}
}

// maxRedisConfigMapBytes bounds what the cache keeps of a ConfigMap's data: what the manager
// writes for the Redis (a URL and TLS names) is far below it; many workloads' keys are kept
// as a digest.
const maxRedisConfigMapBytes = 4096

// slimRedisConfigMap keeps of a ConfigMap what the reconciler compares: its identity, the
// managed-by label, immutable, and its data when within maxRedisConfigMapBytes. The namespace
// is the tenant's, and so is whatever it writes under this name: a larger or binary content is
// kept as a one-key marker that never equals what the manager writes, so it is rewritten, and
// the cache holds a few hundred bytes a namespace whatever the tenant wrote.
func slimRedisConfigMap(obj any) (any, error) {
	cm, ok := obj.(*corev1.ConfigMap)
	if !ok {
		return obj, nil
	}
	var labels map[string]string
	if v, ok := cm.Labels[managedByLabel]; ok && len(v) <= len(managedByValue) {
		labels = map[string]string{managedByLabel: v}
	}
	size := 0
	for k, v := range cm.Data {
		size += len(k) + len(v)
	}
	data := cm.Data
	switch {
	case len(cm.BinaryData) > 0:
		data = map[string]string{"": ""} // not what the manager writes: rewritten
	case size > maxRedisConfigMapBytes:
		// Many workloads' keys, or a tenant's megabyte: their digest, compared by sameData.
		data = map[string]string{"": dataDigest(cm.Data)}
	}
	cm.ObjectMeta = metav1.ObjectMeta{
		Name: cm.Name, Namespace: cm.Namespace, UID: cm.UID, ResourceVersion: cm.ResourceVersion,
		DeletionTimestamp: cm.DeletionTimestamp, Labels: labels,
	}
	cm.Data, cm.BinaryData = data, nil
	return cm, nil
}

// allNamespaces is a request for every namespace.
func (r *NamespaceRedisReconciler) allNamespaces(ctx context.Context, _ client.Object) []reconcile.Request {
	var list corev1.NamespaceList
	if err := r.Client.List(ctx, &list); err != nil {
		log.FromContext(ctx).Error(err, "listing namespaces to write their sidecars' redis settings")
		return nil
	}
	out := make([]reconcile.Request, 0, len(list.Items))
	for i := range list.Items {
		out = append(out, reconcile.Request{NamespacedName: types.NamespacedName{Name: list.Items[i].Name}})
	}
	return out
}

// dataDigest is a digest of a ConfigMap's data, independent of the map's order.
func dataDigest(data map[string]string) string {
	h := sha256.New()
	for _, k := range slices.Sorted(maps.Keys(data)) {
		_, _ = fmt.Fprintf(h, "%d:%s%d:%s", len(k), k, len(data[k]), data[k]) // a hash never fails
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil))
}

// sameData reports whether cur, as the cache keeps it (slimRedisConfigMap), holds want. The
// empty key is no valid ConfigMap key, so only the cache's digest can carry it.
func sameData(cur, want map[string]string) bool {
	if d, ok := cur[""]; ok && len(cur) == 1 {
		return d == dataDigest(want)
	}
	return maps.Equal(cur, want)
}
