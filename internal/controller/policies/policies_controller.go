// Package policies is the policy reconciler: a namespace's RateLimitPolicies compiled into the
// ConfigMap its sidecars read, their scripts loaded in the namespace's Redis, and their
// Accepted, Programmed and Enforced conditions, events, metrics and the manager's readiness.
package policies

import (
	"context"
	"errors"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	v1alpha1 "github.com/redline-dev/redline/api/v1alpha1"
	"github.com/redline-dev/redline/internal/backend"
	"github.com/redline-dev/redline/internal/controller/compile"
	"github.com/redline-dev/redline/internal/controller/loop"
	"github.com/redline-dev/redline/internal/limiter/scripts"
	"github.com/redline-dev/redline/internal/policydoc"
)

// HashAnnotation on the ConfigMap repeats the document's content hash for humans and tools.
// The manager's cache only holds ConfigMaps named redline-policies, slimmed (SlimByObject), so
// it never caches the cluster's other ConfigMaps.
const HashAnnotation = "redline.dev/config-hash"

// NamespaceReconciler compiles all the policies of a namespace into ConfigMap
// redline-policies and records in each policy's status what is enforced. Its requests are keyed
// by namespace (Name is the ConfigMap's), so one namespace is only ever written by one worker.
type NamespaceReconciler struct {
	client.Client
	// Policies reads RateLimitPolicies as unstructured objects (the manager's cache); nil reads
	// through Client. See listPolicies for why they are not read typed.
	Policies client.Reader
	// Backends gives each namespace its Redis: its scripts and its sidecars' reports come
	// from there.
	Backends *backend.Registry
	Recorder events.EventRecorder
	// RedisTimeout bounds the script check of one reconcile.
	RedisTimeout time.Duration
	// ScriptEvents, if set, triggers a reconcile of every namespace (see scriptwatcher.Watcher).
	ScriptEvents <-chan event.GenericEvent
	// MaxBackoff caps the retry delay while Redis is down (default backend.DefaultMaxBackoff).
	MaxBackoff time.Duration
	// ResyncInterval is how often a namespace is reconciled without any event, to follow
	// sidecar heartbeats into Enforced (default 15s).
	ResyncInterval time.Duration
	// MaxDocumentBytes is the largest ConfigMap payload written (default MaxConfigMapBytes).
	MaxDocumentBytes int
	// Direct reads the API server, for the rare read of a ConfigMap's content (the manager's
	// cache holds none); nil reads through Client.
	Direct client.Reader

	// accepted is, per namespace, the last accepted compilation of each policy (by UID): the
	// record, of the controller's own, from which an invalid update keeps the previous
	// generation enforced. After a restart it starts from the document in force (see
	// previousPolicies).
	mu       sync.Mutex
	accepted map[string]map[types.UID]policydoc.Policy
	// conditions puts each policy's conditions on /metrics (redline_policy_condition).
	conditions conditionMetrics
	// losses is, by policy UID, the count of heartbeats that said Redis lost counts, as last
	// read: a rise is a Warning Event on the policy. One entry per policy in the document.
	lossMu sync.Mutex
	losses map[string]map[types.UID]int64
}

// +kubebuilder:rbac:groups=redline.dev,resources=ratelimitpolicies,verbs=get;list;watch
// +kubebuilder:rbac:groups=redline.dev,resources=ratelimitpolicies/status,verbs=get;update;patch
// ConfigMaps: the manager writes one, redline-policies, per namespace. get, update, patch and
// delete are limited to that name; create cannot be (the name is in the body, which RBAC does
// not see), and the cache's cluster-wide list and watch could be only with a metadata.name
// field selector on every request.
// +kubebuilder:rbac:groups="",resources=configmaps,verbs=list;watch;create
// +kubebuilder:rbac:groups="",resources=configmaps,resourceNames=redline-policies,verbs=get;update;patch;delete
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch
// +kubebuilder:rbac:groups="",resources=services,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch

// Reconcile brings the ConfigMap and the status of every policy of req.Namespace up to date.
func (r *NamespaceReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	return r.reconcile(ctx, req.Namespace)
}

// reconcile reads as its phases over one pass of the namespace: its policies and ConfigMap
// read, then either the namespace forgotten (reconcileDelete) or its policies compiled and the
// ConfigMap written (reconcileConfig), the scripts loaded in its Redis, every policy's status
// written, and what to retry (result).
func (r *NamespaceReconciler) reconcile(ctx context.Context, ns string) (ctrl.Result, error) {
	live, bad, err := r.listPolicies(ctx, ns)
	if err != nil {
		return ctrl.Result{}, err
	}
	current, err := r.currentConfigMap(ctx, ns)
	if err != nil {
		return ctrl.Result{}, err
	}
	if len(live) == 0 && len(bad) == 0 {
		return ctrl.Result{}, r.reconcileDelete(ctx, ns, current)
	}
	ps, err := r.reconcileConfig(ctx, ns, current, live, bad)
	if err != nil {
		return ctrl.Result{}, err
	}
	ps.be, ps.backendErr = r.Backends.For(ctx, ns)
	ps.scriptErr = r.ensureScripts(ctx, ps.be, ps.backendErr)
	stale, statusErrs := r.writeStatus(ctx, ns, *ps)
	return r.result(ctx, ps, stale, statusErrs)
}

// reconcileDelete forgets a namespace without policies: its ConfigMap, its accepted
// generations and its policies' series.
func (r *NamespaceReconciler) reconcileDelete(ctx context.Context, ns string, current *corev1.ConfigMap) error {
	r.setAccepted(ns, nil)
	r.conditions.record(ns, nil, nil)
	return r.deleteConfigMap(ctx, current)
}

// reconcileConfig compiles the namespace's policies (the undecodable ones reported, the last
// accepted generation of an invalid one kept) into its document and writes its ConfigMap; the
// pass's cmErr says why the ConfigMap was not written.
func (r *NamespaceReconciler) reconcileConfig(ctx context.Context, ns string, current *corev1.ConfigMap, live []*v1alpha1.RateLimitPolicy, bad []undecodable) (*pass, error) {
	for _, u := range bad {
		live = append(live, u.policy)
	}
	c := r.compile(ctx, ns, live, bad)
	doc, data, err := policydoc.Build(ns, c.policies, scripts.SHAs())
	if err != nil {
		return nil, err
	}
	cmErr := r.writeConfigMap(ctx, ns, current, doc, data, c.order)
	if cmErr == nil {
		r.setAccepted(ns, c.accepted)
	}
	if _, ok := errors.AsType[*tenantError](cmErr); ok {
		log.FromContext(ctx).Info("configmap not written", "namespace", ns, "reason", cmErr.Error())
	}
	return &pass{outcomes: c.outcomes, bad: bad, doc: doc, cmErr: cmErr}, nil
}

// result is what the pass leaves to retry: Redis's and the API server's errors at once, a
// status write that lost to another writer soon, and otherwise the resync.
func (r *NamespaceReconciler) result(ctx context.Context, ps *pass, stale bool, statusErrs []error) (ctrl.Result, error) {
	if ps.scriptErr != nil {
		log.FromContext(ctx).Info("redis unavailable; policies written but not programmed, retrying", "error", ps.scriptErr.Error())
	}
	cmErr := ps.cmErr
	if _, ok := errors.AsType[*tenantError](cmErr); ok {
		// The namespace's own content is at fault: its status says what to do, and retrying
		// sooner than the resync would not help.
		cmErr = nil
	}
	if err := errors.Join(append(statusErrs, cmErr, loop.WrapRedis(ps.scriptErr))...); err != nil {
		return ctrl.Result{}, err
	}
	if stale {
		// Another writer (the budget reconciler) got there first; the cache has its write by
		// the time this comes back.
		return ctrl.Result{RequeueAfter: staleRetry}, nil
	}
	// Sidecar heartbeats change without any Kubernetes event; come back to follow them.
	return ctrl.Result{RequeueAfter: r.resyncInterval()}, nil
}

// compilation is what the policies of a namespace compile to: each policy's outcome, and the
// policies of the document (the current generation, or the last accepted one) with their
// order.
type compilation struct {
	outcomes []outcome
	policies []policydoc.Policy
	order    []sized
	accepted map[types.UID]policydoc.Policy
}

// compile compiles each policy on its own: one invalid policy never takes the others down. An
// invalid update keeps the last accepted version of that policy enforced.
func (r *NamespaceReconciler) compile(ctx context.Context, ns string, live []*v1alpha1.RateLimitPolicy, bad []undecodable) compilation {
	c := compilation{outcomes: make([]outcome, len(live)), accepted: map[types.UID]policydoc.Policy{}}
	var previous map[string]policydoc.Policy
	known := r.acceptedIn(ns)
	for i, p := range live {
		var cp policydoc.Policy
		err := undecodableErr(bad, p)
		if err == nil {
			cp, err = compile.Policy(p)
		}
		c.outcomes[i] = outcome{policy: p, compileErr: err}
		if err != nil {
			old, ok := known[p.UID]
			// Without a record of the namespace (this process has not written its document
			// yet), the document in force is the record.
			if !ok && known == nil {
				if previous == nil {
					previous = r.previousPolicies(ctx, ns, live)
				}
				old, ok = previous[p.Name]
			}
			if !ok {
				continue
			}
			cp = old
			c.outcomes[i].keptGeneration = old.Generation
		}
		c.accepted[p.UID] = cp
		c.policies = append(c.policies, cp)
		c.order = append(c.order, sized{policy: cp, order: p.CreationTimestamp.UTC().Format(time.RFC3339) + "/" + p.Name})
	}
	return c
}

// ensureScripts makes sure the namespace's Redis holds the scripts; its error is why the
// policies are not Programmed.
func (r *NamespaceReconciler) ensureScripts(ctx context.Context, be *backend.Backend, backendErr error) error {
	if backendErr != nil {
		return backendErr
	}
	sctx, cancel := context.WithTimeout(ctx, backend.Timeout(r.RedisTimeout))
	defer cancel()
	_, err := be.Scripts.Ensure(sctx)
	return err
}

// pass is what one reconcile of a namespace found, for its policies' status.
type pass struct {
	be         *backend.Backend
	backendErr error
	outcomes   []outcome
	bad        []undecodable
	doc        *policydoc.Document
	// cmErr is why the ConfigMap was not written; scriptErr why the scripts are not in Redis.
	cmErr, scriptErr error
}

// writeStatus reads what the sidecars, Services and pods say of each policy, writes every
// policy's status and records the conditions on /metrics. stale says a status write lost to
// another writer.
func (r *NamespaceReconciler) writeStatus(ctx context.Context, ns string, ps pass) (stale bool, errs []error) {
	var sidecars *backend.Sidecars
	if ps.be != nil {
		sidecars = ps.be.Sidecars
	}
	outcomes, doc := ps.outcomes, ps.doc
	reports := r.enforcements(ctx, sidecars, ps.backendErr, ns, doc.Hash, outcomes, ps.cmErr == nil)
	bypasses, bare := r.checkEnforcement(ctx, ns, outcomes, reports)
	conditions := make(map[string][]metav1.Condition, len(outcomes))
	reported := make([]outcome, 0, len(outcomes))
	for i, o := range outcomes {
		o.configErr, o.scriptErr = ps.cmErr, ps.scriptErr
		if o.inDocument() {
			o.enforcement = reports[i]
			reported = append(reported, o)
		}
		conditions[o.policy.Name] = desiredStatus(o, doc).Conditions
		update := r.updateStatus
		if u := findUndecodable(ps.bad, o.policy); u != nil {
			update = func(ctx context.Context, o outcome, doc *policydoc.Document) error {
				return r.updateUndecodableStatus(ctx, u, o, doc)
			}
		}
		switch err := update(ctx, o, doc); {
		case errors.Is(err, errStaleStatus):
			stale = true
		case err != nil:
			errs = append(errs, err)
		}
	}
	r.reportLosses(ns, reported)
	counts := make(map[string]findings, len(outcomes))
	for i, o := range outcomes {
		counts[o.policy.Name] = findings{bypasses: bypasses[i].count, podsWithoutSidecar: bare[i].count}
	}
	r.conditions.record(ns, conditions, counts)
	return stale, errs
}

// checkEnforcement adds to reports the Services that go around the sidecars and the Ready
// pods without one; a check that cannot be made finds nothing.
func (r *NamespaceReconciler) checkEnforcement(ctx context.Context, ns string, outcomes []outcome, reports []enforcement) ([]bypass, []unguarded) {
	logger := log.FromContext(ctx)
	bypasses, err := r.bypasses(ctx, ns, outcomes)
	if err != nil {
		logger.Info("services not checked for ports around the sidecar", "namespace", ns, "error", err.Error())
	}
	bare, err := r.unguardedPods(ctx, ns, outcomes)
	if err != nil {
		logger.Info("pods not checked for a sidecar", "namespace", ns, "error", err.Error())
	}
	for i := range reports {
		reports[i].bypass = bypasses[i]
		reports[i].unguarded = bare[i]
	}
	return bypasses, bare
}

// staleRetry is how soon a status write refused as stale is tried again.
const staleRetry = 100 * time.Millisecond

func (r *NamespaceReconciler) resyncInterval() time.Duration {
	if r.ResyncInterval > 0 {
		return r.ResyncInterval
	}
	return 15 * time.Second
}

// tenantError is a reconcile failure caused by what a namespace holds (a ConfigMap of the same
// name that Redline does not manage, an immutable ConfigMap, a quota or admission webhook that
// refuses it, more policies than a sidecar loads): its policies' status says what to do, and it
// does not retry sooner than the resync.
type tenantError struct {
	reason string // the Programmed reason; ConfigMapError when empty
	err    error
}

func (e *tenantError) Error() string { return e.err.Error() }
func (e *tenantError) Unwrap() error { return e.err }

// outcome is what one reconcile found for one policy.
type outcome struct {
	policy         *v1alpha1.RateLimitPolicy
	compileErr     error
	keptGeneration int64 // generation still enforced although the current spec is invalid
	configErr      error
	scriptErr      error
	enforcement    enforcement
}

// inDocument reports whether some generation of the policy is in the compiled document: the
// current one, or the last accepted one kept while the current spec is invalid.
func (o *outcome) inDocument() bool { return o.compileErr == nil || o.keptGeneration > 0 }

// SetupWithManager registers the reconciler. Policy events, events on the managed ConfigMaps
// (someone edited or deleted one) and script health changes all map to a namespace request.
func (r *NamespaceReconciler) SetupWithManager(mgr ctrl.Manager) error {
	b := ctrl.NewControllerManagedBy(mgr).
		Named("ratelimitpolicy").
		Watches(loop.NewPolicy(),
			handler.EnqueueRequestsFromMapFunc(namespaceRequest),
			builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		// A Service that starts or stops going around the sidecars changes Enforced now, not at
		// the next resync.
		Watches(&corev1.Service{}, handler.EnqueueRequestsFromMapFunc(namespaceRequest)).
		// A Ready pod without a sidecar appearing or going changes Enforced now (podcheck.go).
		Watches(&corev1.Pod{}, handler.EnqueueRequestsFromMapFunc(r.podRequest),
			builder.WithPredicates(podChanged)).
		Watches(&corev1.ConfigMap{},
			handler.EnqueueRequestsFromMapFunc(namespaceRequest),
			builder.WithPredicates(predicate.NewPredicateFuncs(func(o client.Object) bool {
				return o.GetName() == policydoc.ConfigMapName
			}))).
		WithOptions(controller.Options{
			RateLimiter: workqueue.NewTypedItemExponentialFailureRateLimiter[reconcile.Request](200*time.Millisecond, backend.MaxBackoff(r.MaxBackoff)),
		}).
		// A backend dialed, replaced or removed, or a namespace moved to another.
		WatchesRawSource(source.Channel(r.Backends.Subscribe(), handler.EnqueueRequestsFromMapFunc(r.allNamespaces)))
	if r.ScriptEvents != nil {
		b = b.WatchesRawSource(source.Channel(r.ScriptEvents, handler.EnqueueRequestsFromMapFunc(r.allNamespaces)))
	}
	return b.Complete(r)
}

func namespaceRequest(_ context.Context, o client.Object) []reconcile.Request {
	return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: o.GetNamespace(), Name: policydoc.ConfigMapName}}}
}

func (r *NamespaceReconciler) allNamespaces(ctx context.Context, _ client.Object) []reconcile.Request {
	list := loop.NewPolicyList()
	if err := r.policyReader().List(ctx, list); err != nil {
		log.FromContext(ctx).Error(err, "listing policies to recheck after a redis change")
		return nil
	}
	seen := map[string]bool{}
	var out []reconcile.Request
	for i := range list.Items {
		p := &list.Items[i]
		if !seen[p.GetNamespace()] {
			seen[p.GetNamespace()] = true
			out = append(out, namespaceRequest(ctx, p)...)
		}
	}
	return out
}
