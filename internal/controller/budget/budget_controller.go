package budget

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/redline-dev/redline/internal/backend"
	"github.com/redline-dev/redline/internal/connbudget"
	"github.com/redline-dev/redline/internal/controller/loop"
)

// budgetRequest is the one key of the budget reconciler: every namespace of a Redis shares
// its maxclients, so each Redis's budget is one sum over its namespaces, and all are computed
// by one worker.
var budgetRequest = reconcile.Request{NamespacedName: types.NamespacedName{Name: "redis-connection-budget"}}

// Reconciler adds up the Redis connections that injected workloads can open at their
// maxReplicas and reports each namespace's total against its share of its Redis's maxclients.
// It is a reconciler of its own, not part of policies.NamespaceReconciler, because the shares are
// per Redis: how many namespaces share a Redis sizes every one of their pools. Each backend
// (RedisBackend, and the manager's own Redis) has a budget of its own, over the namespaces it
// serves, published to its own Publisher for the injector.
type Reconciler struct {
	client.Client
	// Policies reads RateLimitPolicies as unstructured objects (see listPolicies).
	Policies client.Reader
	// Backends are the namespaces' Redis; each one's budget is published to its Budget.
	Backends *backend.Registry
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
// attention, to Events. It reads as its phases over one pass: the workloads by their
// namespace's Redis, every Redis's clients, each Redis's budget, the policies' conditions.
func (r *Reconciler) Reconcile(ctx context.Context, _ ctrl.Request) (ctrl.Result, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	loads, err := r.workloads(ctx)
	if err != nil {
		return ctrl.Result{}, err
	}
	s := r.newPass(ctx, loads)
	reads := r.readNodes(ctx, s.targets)
	redisErr := r.reconcileBackends(ctx, s, reads)
	if s.leader {
		if err := r.updatePolicies(ctx, s.results, s.backendOf); err != nil {
			return ctrl.Result{}, err
		}
	}
	if redisErr != nil {
		return ctrl.Result{}, loop.WrapRedis(redisErr)
	}
	return ctrl.Result{RequeueAfter: r.interval()}, nil
}

// pass is the scope of one Reconcile: the workloads by their namespace's Redis, the Redis to
// size, and what each one's budget came to.
type pass struct {
	backendOf func(ns string) (string, error)
	byBackend map[string][]workloadLoad
	targets   []budgetTarget
	results   map[string]budgetResult
	leader    bool
}

// newPass groups the workloads by their namespace's Redis, each namespace's read once per
// pass; a namespace whose RedisBackend is not ready is left out of every budget.
func (r *Reconciler) newPass(ctx context.Context, loads []workloadLoad) *pass {
	backendOf := map[string]string{}
	notReady := map[string]error{}
	s := &pass{byBackend: map[string][]workloadLoad{}, targets: r.targets(), leader: r.leader()}
	s.backendOf = func(ns string) (string, error) {
		if name, ok := backendOf[ns]; ok {
			return name, notReady[ns]
		}
		name := ""
		rb, err := r.Backends.Assigned(ctx, ns)
		if rb != nil {
			name = rb.Name
			if r.Backends.Get(name) == nil {
				err = &backend.NotReadyError{Name: name}
			}
		}
		backendOf[ns], notReady[ns] = name, err
		return name, err
	}
	for _, w := range loads {
		name, err := s.backendOf(w.Ref.Namespace)
		if err == nil {
			s.byBackend[name] = append(s.byBackend[name], w)
		}
	}
	s.results = make(map[string]budgetResult, len(s.targets))
	return s
}

// readNodes reads every Redis's clients at once: one that hangs delays the others' budgets by
// nothing.
func (r *Reconciler) readNodes(ctx context.Context, targets []budgetTarget) []nodesRead {
	reads := make([]nodesRead, len(targets))
	var wg sync.WaitGroup
	for i, t := range targets {
		wg.Go(func() {
			rctx, cancel := context.WithTimeout(ctx, backend.Timeout(r.RedisTimeout))
			defer cancel()
			reads[i].nodes, reads[i].err = t.redis.Nodes(rctx)
		})
	}
	wg.Wait()
	return reads
}

// reconcileBackends computes and publishes each Redis's budget into s.results, forgets the
// state of backends removed, and returns what the Redis that did not answer said.
func (r *Reconciler) reconcileBackends(ctx context.Context, s *pass, reads []nodesRead) error {
	resetBudgetMetrics()
	var redisErrs []error
	for i, t := range s.targets {
		res := r.reconcileBackend(ctx, t, reads[i], s.byBackend[t.name], s.leader)
		s.results[t.name] = res
		if res.redisErr != nil {
			redisErrs = append(redisErrs, fmt.Errorf("%s: %w", t.label, res.redisErr))
		}
	}
	for name := range r.states {
		if _, ok := s.results[name]; !ok {
			delete(r.states, name) // a backend removed
		}
	}
	return errors.Join(redisErrs...)
}

// targets are the Redis whose budgets are computed: every backend.
func (r *Reconciler) targets() []budgetTarget {
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
func (r *Reconciler) reconcileBackend(ctx context.Context, t budgetTarget, read nodesRead, loads []workloadLoad, leader bool) budgetResult {
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
func (r *Reconciler) snapshot(maxClients int64, loads []workloadLoad) *connbudget.Snapshot {
	return &connbudget.Snapshot{
		MaxClients:  maxClients,
		Reserve:     connbudget.Reserve(maxClients, r.ManagerConnections),
		Workloads:   workloadSet(loads),
		PoolCeiling: r.PoolCeiling,
	}
}

func (r *Reconciler) leader() bool { return loop.IsElected(r.Elected) }

func minMaxClients(nodes []NodeClients) int64 {
	var m int64
	for i, n := range nodes {
		if i == 0 || n.MaxClients < m {
			m = n.MaxClients
		}
	}
	return m
}

func (r *Reconciler) policyReader() client.Reader {
	if r.Policies != nil {
		return r.Policies
	}
	return r.Client
}

func (r *Reconciler) interval() time.Duration {
	if r.Interval > 0 {
		return r.Interval
	}
	return 30 * time.Second
}

func (r *Reconciler) coalesce() time.Duration {
	if r.Coalesce > 0 {
		return r.Coalesce
	}
	return time.Second
}

// SetupWithManager registers the reconciler: every change of a workload, an HPA or a policy
// maps to the one budget request, coalesced (see Coalesce).
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	all := loop.Coalescing{Delay: r.coalesce(), Req: budgetRequest}
	b := ctrl.NewControllerManagedBy(mgr).
		Named("redisconnectionbudget").
		WithOptions(controller.Options{
			// Every replica computes the budget for its own webhook (see Elected).
			NeedLeaderElection: new(false),
			RateLimiter:        workqueue.NewTypedItemExponentialFailureRateLimiter[reconcile.Request](200*time.Millisecond, backend.MaxBackoff(r.MaxBackoff)),
		}).
		Watches(&appsv1.Deployment{}, all, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Watches(&appsv1.StatefulSet{}, all, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Watches(&appsv1.ReplicaSet{}, all, builder.WithPredicates(predicate.GenerationChangedPredicate{},
			predicate.NewPredicateFuncs(func(o client.Object) bool { return !loop.OwnedByDeployment(o) }))).
		Watches(&autoscalingv2.HorizontalPodAutoscaler{}, all, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Watches(loop.NewPolicy(), all, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		// A backend dialed or removed, or a namespace moved: its workloads change budgets.
		WatchesRawSource(source.Channel(r.Backends.Subscribe(), all))
	return b.Complete(r)
}
