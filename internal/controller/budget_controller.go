package controller

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	v1alpha1 "github.com/redline-dev/redline/api/v1alpha1"
	"github.com/redline-dev/redline/internal/connbudget"
	"github.com/redline-dev/redline/internal/sidecar/contract"
)

// Reasons of the RedisConnectionBudget condition and of the budget's Events.
const (
	ReasonOverBudget          = "OverBudget"
	ReasonWithinBudget        = "WithinBudget"
	ReasonNoInjectedWorkloads = "NoInjectedWorkloads"
	ReasonBudgetUnknown       = "RedisUnavailable"
)

// budgetRequest is the one key of the budget reconciler: every namespace of a Redis shares
// its maxclients, so each Redis's budget is one sum over its namespaces, and all are computed
// by one worker.
var budgetRequest = reconcile.Request{NamespacedName: types.NamespacedName{Name: "redis-connection-budget"}}

// BudgetReconciler adds up the Redis connections that injected workloads can open at their
// maxReplicas and reports each namespace's total against its share of its Redis's maxclients.
// It is a reconciler of its own, not part of NamespaceReconciler, because the shares are
// per Redis: how many namespaces share a Redis sizes every one of their pools. Each backend
// (RedisBackend, and the manager's own Redis) has a budget of its own, over the namespaces it
// serves, published to its own Publisher for the injector.
type BudgetReconciler struct {
	client.Client
	// Policies reads RateLimitPolicies as unstructured objects (see listPolicies).
	Policies client.Reader
	// Backends are the namespaces' Redis; nil: Redis and Budget serve every namespace.
	Backends *Backends
	Redis    *RedisClients
	Recorder events.EventRecorder
	// ManagerConnections are the manager's own connections per Redis node.
	ManagerConnections int64
	// PoolCeiling is the manager's --sidecar-redis-pool-size (0: contract.DefaultRedisPoolSize):
	// the most a pool is sized to, and the pool of a workload that cannot be sized. The injector
	// is given the same number, so that what is counted is what is injected.
	PoolCeiling int64
	// RedisTimeout bounds the Redis reads of one reconcile (default 5s).
	RedisTimeout time.Duration
	// Interval is how often the budget is recomputed without an event, to follow
	// connected_clients (default 30s).
	Interval time.Duration
	// MaxBackoff caps the retry delay while Redis is down (default 30s), so that the condition
	// recovers soon after Redis does.
	MaxBackoff time.Duration
	// Coalesce is how long a change waits for others before the pass it triggers (default 1s):
	// every workload, HPA and policy change of the cluster maps to the one budget request, and
	// a tenant that churns its objects gets one pass per Coalesce, not one per change.
	Coalesce time.Duration

	// Budget receives the snapshot the pod injector sizes pools from (without Backends); nil
	// publishes nothing.
	Budget *connbudget.Publisher
	// Elected is closed once this replica leads (ctrl.Manager.Elected); nil means it always
	// does. The budget is computed on every replica, because every replica's webhook sizes
	// pools from it; only the leader writes status and Events.
	Elected <-chan struct{}

	mu sync.Mutex
	// states is what each backend's budget remembers between passes, by backend name.
	states map[string]*budgetState
}

// budgetState is what one Redis's budget remembers between passes.
type budgetState struct {
	// maxClients is the last maxclients read, kept while Redis cannot be read: maxclients
	// rarely changes, and forgetting it would give every pod admitted meanwhile the default.
	maxClients int64
	// last is each workload's connections at the last computed budget, to tell which one
	// pushed the total over.
	last map[workloadRef]int64
	// wasOver are the namespaces over their share at the last computed budget.
	wasOver map[string]bool
	// blamed are the objects given an OverBudget Event, told when their namespace is back
	// within its share.
	blamed map[workloadRef]client.Object
}

// budgetTarget is one Redis whose budget is computed.
type budgetTarget struct {
	name, label string
	redis       *RedisClients
	publish     *connbudget.Publisher
}

// nodesRead is what one Redis's masters said of their clients.
type nodesRead struct {
	nodes []NodeClients
	err   error
}

// budgetResult is one Redis's budget of one pass.
type budgetResult struct {
	byNS     map[string]namespaceBudget
	redisErr error
}

// +kubebuilder:rbac:groups=apps,resources=deployments;statefulsets;replicasets,verbs=get;list;watch
// +kubebuilder:rbac:groups=autoscaling,resources=horizontalpodautoscalers,verbs=get;list;watch

// Reconcile recomputes every Redis's budget, publishes each to the injector and writes them to
// the metrics and, on the leader, to every policy's status and, on a change worth a person's
// attention, to Events.
func (r *BudgetReconciler) Reconcile(ctx context.Context, _ ctrl.Request) (ctrl.Result, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	loads, err := r.workloads(ctx)
	if err != nil {
		return ctrl.Result{}, err
	}
	// Each namespace's Redis, read once per pass.
	backendOf := map[string]string{}
	notReady := map[string]error{}
	of := func(ns string) (string, error) {
		if name, ok := backendOf[ns]; ok {
			return name, notReady[ns]
		}
		name := ""
		var err error
		if r.Backends != nil {
			var rb *v1alpha1.RedisBackend
			if rb, err = r.Backends.Assigned(ctx, ns); rb != nil {
				name = rb.Name
				if r.Backends.get(name) == nil {
					err = &BackendNotReadyError{Name: name}
				}
			}
		}
		backendOf[ns], notReady[ns] = name, err
		return name, err
	}
	byBackend := map[string][]workloadLoad{}
	for _, w := range loads {
		name, err := of(w.Ref.Namespace)
		if err == nil {
			byBackend[name] = append(byBackend[name], w)
		}
	}
	targets := r.targets()
	results := make(map[string]budgetResult, len(targets))
	leader := r.leader()
	resetBudgetMetrics()
	var redisErrs []error
	// Every Redis is read at once: one that hangs delays the others' budgets by nothing.
	reads := make([]nodesRead, len(targets))
	var wg sync.WaitGroup
	for i, t := range targets {
		wg.Go(func() {
			rctx, cancel := context.WithTimeout(ctx, r.redisTimeout())
			defer cancel()
			reads[i].nodes, reads[i].err = t.redis.Nodes(rctx)
		})
	}
	wg.Wait()
	for i, t := range targets {
		res := r.reconcileBackend(ctx, t, reads[i], byBackend[t.name], leader)
		results[t.name] = res
		if res.redisErr != nil {
			redisErrs = append(redisErrs, fmt.Errorf("%s: %w", t.label, res.redisErr))
		}
	}
	for name := range r.states {
		if _, ok := results[name]; !ok {
			delete(r.states, name) // a backend removed
		}
	}
	if leader {
		if err := r.updatePolicies(ctx, results, of); err != nil {
			return ctrl.Result{}, err
		}
	}
	if err := errors.Join(redisErrs...); err != nil {
		return ctrl.Result{}, wrapRedis(err)
	}
	return ctrl.Result{RequeueAfter: r.interval()}, nil
}

// targets are the Redis whose budgets are computed: every backend, or Redis alone.
func (r *BudgetReconciler) targets() []budgetTarget {
	if r.Backends == nil {
		return []budgetTarget{{label: DefaultBackendLabel, redis: r.Redis, publish: r.Budget}}
	}
	var out []budgetTarget
	for _, be := range r.Backends.All() {
		out = append(out, budgetTarget{
			name: be.Name, label: be.Label(), publish: be.Budget,
			redis: &RedisClients{Client: be.Client, MaxClients: be.MaxClients},
		})
	}
	return out
}

// reconcileBackend computes one Redis's budget over the workloads of the namespaces it serves.
func (r *BudgetReconciler) reconcileBackend(ctx context.Context, t budgetTarget, read nodesRead, loads []workloadLoad, leader bool) budgetResult {
	if r.states == nil {
		r.states = map[string]*budgetState{}
	}
	st := r.states[t.name]
	if st == nil {
		st = &budgetState{}
		r.states[t.name] = st
	}
	nodes, redisErr := read.nodes, read.err
	switch {
	case redisErr == nil:
		st.maxClients = minMaxClients(nodes)
	case t.redis.MaxClients > 0:
		st.maxClients = t.redis.MaxClients
	}
	snap := r.snapshot(st.maxClients, loads)
	sizePools(loads, snap)
	if t.publish != nil {
		t.publish.Publish(snap)
	}
	if redisErr != nil {
		log.FromContext(ctx).Info("redis connection budget unknown", "backend", t.label, "error", redisErr.Error())
		// Without maxclients there is no share; the pools of the namespaces are still known.
		byNS := map[string]namespaceBudget{}
		for _, w := range loads {
			nb := byNS[w.Ref.Namespace]
			nb.Namespace = w.Ref.Namespace
			nb.Workloads = append(nb.Workloads, w)
			byNS[w.Ref.Namespace] = nb
		}
		return budgetResult{byNS: byNS, redisErr: redisErr}
	}
	b := newBudget(loads, r.ManagerConnections, snap)
	recordBudgetMetrics(t.label, b, nodes)
	if leader {
		r.recordEvents(st, b)
	}
	return budgetResult{byNS: b.Namespaces()}
}

// snapshot is what the injector needs to size the pools of new pods as loads are counted.
func (r *BudgetReconciler) snapshot(maxClients int64, loads []workloadLoad) *connbudget.Snapshot {
	return &connbudget.Snapshot{
		MaxClients:  maxClients,
		Reserve:     connbudget.Reserve(maxClients, r.ManagerConnections),
		Workloads:   workloadSet(loads),
		PoolCeiling: r.PoolCeiling,
	}
}

func workloadSet(loads []workloadLoad) map[connbudget.Workload]struct{} {
	out := make(map[connbudget.Workload]struct{}, len(loads))
	for _, w := range loads {
		out[w.Ref] = struct{}{}
	}
	return out
}

// sizePools gives the workloads without the annotation the pool the injector gives their pods.
func sizePools(loads []workloadLoad, s *connbudget.Snapshot) {
	for i := range loads {
		if !loads[i].Explicit {
			loads[i].Pool = s.PoolSize(loads[i].Ref, loads[i].Replicas)
		}
	}
}

func (r *BudgetReconciler) leader() bool { return isElected(r.Elected) }

// isElected says whether the replica of elected (ctrl.Manager.Elected) leads; nil: it always does.
func isElected(elected <-chan struct{}) bool {
	if elected == nil {
		return true
	}
	select {
	case <-elected:
		return true
	default:
		return false
	}
}

func minMaxClients(nodes []NodeClients) int64 {
	var m int64
	for i, n := range nodes {
		if i == 0 || n.MaxClients < m {
			m = n.MaxClients
		}
	}
	return m
}

// workloads lists the injected Deployments, StatefulSets and ReplicaSets without a Deployment
// that can run pods, with their largest replica count and, where the annotation sets it, their
// pool. A workload that runs no pod (replicas 0) takes no share: creating empty ones changes no
// pool. The lists are the cache's own objects, slimmed by CacheOptions and not copied
// (UnsafeDisableDeepCopy): nothing here writes to them.
func (r *BudgetReconciler) workloads(ctx context.Context) ([]workloadLoad, error) {
	var hpas autoscalingv2.HorizontalPodAutoscalerList
	if err := r.List(ctx, &hpas, client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("listing horizontalpodautoscalers: %w", err)
	}
	scalers := connbudget.Scalers(hpas.Items)

	var out []workloadLoad
	add := func(kind string, obj client.Object, replicas *int32, tmpl *corev1.PodTemplateSpec) {
		if tmpl.Annotations[contract.AnnotationInject] != "true" || obj.GetDeletionTimestamp() != nil {
			return
		}
		w := workloadLoad{
			Ref:       workloadRef{Kind: kind, Namespace: obj.GetNamespace(), Name: obj.GetName()},
			PodLabels: tmpl.Labels,
			target:    obj,
		}
		h := scalers[w.Ref]
		if !connbudget.RunsPods(replicas, h) {
			return
		}
		w.Pool, w.Explicit = poolSize(tmpl.Annotations, r.poolCeiling())
		w.Replicas = connbudget.MaxReplicas(replicas, h)
		if h != nil {
			w.HPA, w.target = h.Name, h
		}
		out = append(out, w)
	}
	var deps appsv1.DeploymentList
	if err := r.List(ctx, &deps, client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("listing deployments: %w", err)
	}
	for i := range deps.Items {
		d := &deps.Items[i]
		add("Deployment", d, d.Spec.Replicas, &d.Spec.Template)
	}
	var sets appsv1.StatefulSetList
	if err := r.List(ctx, &sets, client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("listing statefulsets: %w", err)
	}
	for i := range sets.Items {
		s := &sets.Items[i]
		add("StatefulSet", s, s.Spec.Replicas, &s.Spec.Template)
	}
	var rss appsv1.ReplicaSetList
	if err := r.List(ctx, &rss, client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("listing replicasets: %w", err)
	}
	for i := range rss.Items {
		rs := &rss.Items[i]
		// A Deployment's ReplicaSets are counted as the Deployment.
		if !ownedByDeployment(rs) {
			add("ReplicaSet", rs, rs.Spec.Replicas, &rs.Spec.Template)
		}
	}
	return out, nil
}

func ownedByDeployment(obj metav1.Object) bool {
	ref := metav1.GetControllerOf(obj)
	return ref != nil && ref.Kind == "Deployment" && strings.HasPrefix(ref.APIVersion, appsv1.GroupName+"/")
}

// poolSize is the annotation's pool, when it is set and valid. An invalid one counts as
// ceiling, the largest pool the injector gives without the annotation: the injector refuses to
// inject with it, so it opens nothing, and the ceiling keeps the sum on the safe side.
func poolSize(ann map[string]string, ceiling int64) (pool int64, explicit bool) {
	if raw, ok := ann[contract.AnnotationRedisPoolSize]; ok {
		n, err := strconv.ParseInt(strings.TrimSpace(raw), 10, 64)
		if err == nil && n >= contract.MinRedisPoolSize && n <= contract.MaxRedisPoolSize {
			return n, true
		}
		return ceiling, true
	}
	return 0, false
}

// poolCeiling is PoolCeiling, or contract.DefaultRedisPoolSize.
func (r *BudgetReconciler) poolCeiling() int64 {
	return (&connbudget.Snapshot{PoolCeiling: r.PoolCeiling}).Ceiling()
}

// recordEvents tells a person which workload took its namespace over its share, and when the
// namespace is back within. The culprit is a workload of that namespace whose connections grew
// since the last computation; after a restart, with nothing to compare, it is the namespace's
// largest. The Event names nothing outside the namespace.
func (r *BudgetReconciler) recordEvents(st *budgetState, b budget) {
	if st.blamed == nil {
		st.blamed = map[workloadRef]client.Object{}
	}
	byNS := b.Namespaces()
	over := map[string]bool{}
	for _, ns := range slices.Sorted(maps.Keys(byNS)) {
		nb := byNS[ns]
		if !nb.Over() {
			continue
		}
		over[ns] = true
		var pushers []workloadLoad
		for _, w := range nb.Workloads {
			if prev, seen := st.last[w.Ref]; st.last != nil && (!seen || w.Connections() > prev) {
				pushers = append(pushers, w)
			}
		}
		if !st.wasOver[ns] && len(pushers) == 0 {
			pushers = nb.Workloads[:1]
		}
		for _, w := range pushers {
			st.blamed[w.Ref] = w.target
			if r.Recorder != nil {
				r.Recorder.Eventf(w.target, nil, corev1.EventTypeWarning, ReasonOverBudget, "RedisConnectionBudget",
					"%s at %d replicas x %d connections takes its namespace over its share of Redis's connections: %s; lower maxReplicas or %s",
					w.Ref, w.Replicas, w.Pool, nb.Summary(), contract.AnnotationRedisPoolSize)
			}
		}
	}
	for ref, obj := range st.blamed {
		if over[ref.Namespace] {
			continue
		}
		if r.Recorder != nil {
			msg := "namespace " + ref.Namespace + " runs no injected workload any more"
			if nb, ok := byNS[ref.Namespace]; ok {
				msg = nb.Summary()
			}
			r.Recorder.Eventf(obj, nil, corev1.EventTypeNormal, ReasonWithinBudget, "RedisConnectionBudget",
				"Redis connections are within the namespace's share again: %s", msg)
		}
		delete(st.blamed, ref)
	}
	st.wasOver = over
	st.last = map[workloadRef]int64{}
	for _, w := range b.Workloads {
		st.last[w.Ref] = w.Connections()
	}
}

// updatePolicies writes the RedisConnectionBudget condition of every policy, where it changed,
// from its namespace's Redis's budget. The policies are the cache's, not copied: decodePolicy
// makes the copy that is written.
func (r *BudgetReconciler) updatePolicies(ctx context.Context, results map[string]budgetResult, backendOf func(string) (string, error)) error {
	list := newPolicyList()
	if err := r.policyReader().List(ctx, list, client.UnsafeDisableDeepCopy); err != nil {
		return fmt.Errorf("listing ratelimitpolicies: %w", err)
	}
	var errs []error
	for i := range list.Items {
		p, err := decodePolicy(&list.Items[i])
		if err != nil {
			continue // the namespace reconciler reports it Undecodable
		}
		name, err := backendOf(p.Namespace)
		res, ok := results[name]
		switch {
		case err != nil:
			res = budgetResult{redisErr: err}
		case !ok:
			res = budgetResult{redisErr: &BackendNotReadyError{Name: name}}
		}
		status, reason, msg := budgetCondition(p, res.byNS[p.Namespace], res.redisErr)
		if _, _, err := setPolicyCondition(ctx, r.Client, p, metav1.Condition{
			Type: v1alpha1.ConditionRedisConnectionBudget, Status: status, Reason: reason, Message: truncate(msg),
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
		return metav1.ConditionUnknown, ReasonBudgetUnknown, "Redis's maxclients or connected_clients cannot be read: " + redisErr.Error()
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
		return metav1.ConditionTrue, ReasonNoInjectedWorkloads, "no injected Deployment, StatefulSet or ReplicaSet of the namespace that runs pods matches targetSelector"
	}
	slices.Sort(mine)
	targets := "this policy's workloads at maxReplicas x pool: " + strings.Join(mine, ", ")
	if nb.Over() {
		return metav1.ConditionFalse, ReasonOverBudget, nb.Summary() + "; " + targets +
			"; at that scale the namespace takes connections other namespaces are promised, and when Redis refuses connections its policies fall back to their failureMode: lower maxReplicas or " +
			contract.AnnotationRedisPoolSize
	}
	return metav1.ConditionTrue, ReasonWithinBudget, "within the namespace's share of Redis's connections; " + targets
}

func (r *BudgetReconciler) policyReader() client.Reader {
	if r.Policies != nil {
		return r.Policies
	}
	return r.Client
}

func (r *BudgetReconciler) redisTimeout() time.Duration {
	if r.RedisTimeout > 0 {
		return r.RedisTimeout
	}
	return 5 * time.Second
}

func (r *BudgetReconciler) interval() time.Duration {
	if r.Interval > 0 {
		return r.Interval
	}
	return 30 * time.Second
}

func (r *BudgetReconciler) coalesce() time.Duration {
	if r.Coalesce > 0 {
		return r.Coalesce
	}
	return time.Second
}

// coalescing enqueues one request (the budget's, the memory policy's) a while after a change,
// so that the changes of that while make one pass (the delaying queue keeps the earliest time
// of one key).
type coalescing struct {
	delay time.Duration
	req   reconcile.Request
}

func (c coalescing) add(q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
	q.AddAfter(c.req, c.delay)
}

func (c coalescing) Create(_ context.Context, _ event.CreateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
	c.add(q)
}

func (c coalescing) Update(_ context.Context, _ event.UpdateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
	c.add(q)
}

func (c coalescing) Delete(_ context.Context, _ event.DeleteEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
	c.add(q)
}

func (c coalescing) Generic(_ context.Context, _ event.GenericEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
	c.add(q)
}

// SetupWithManager registers the reconciler: every change of a workload, an HPA or a policy
// maps to the one budget request, coalesced (see Coalesce).
func (r *BudgetReconciler) SetupWithManager(mgr ctrl.Manager) error {
	all := coalescing{delay: r.coalesce(), req: budgetRequest}
	maxBackoff := r.MaxBackoff
	if maxBackoff == 0 {
		maxBackoff = 30 * time.Second
	}
	b := ctrl.NewControllerManagedBy(mgr).
		Named("redisconnectionbudget").
		WithOptions(controller.Options{
			// Every replica computes the budget for its own webhook (see Elected).
			NeedLeaderElection: new(false),
			RateLimiter:        workqueue.NewTypedItemExponentialFailureRateLimiter[reconcile.Request](200*time.Millisecond, maxBackoff),
		}).
		Watches(&appsv1.Deployment{}, all, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Watches(&appsv1.StatefulSet{}, all, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Watches(&appsv1.ReplicaSet{}, all, builder.WithPredicates(predicate.GenerationChangedPredicate{},
			predicate.NewPredicateFuncs(func(o client.Object) bool { return !ownedByDeployment(o) }))).
		Watches(&autoscalingv2.HorizontalPodAutoscaler{}, all, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Watches(newPolicyObject(), all, builder.WithPredicates(predicate.GenerationChangedPredicate{}))
	if r.Backends != nil {
		// A backend dialed or removed, or a namespace moved: its workloads change budgets.
		b = b.WatchesRawSource(source.Channel(r.Backends.Subscribe(), all))
	}
	return b.Complete(r)
}
