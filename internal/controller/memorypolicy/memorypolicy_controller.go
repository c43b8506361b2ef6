package memorypolicy

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
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
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	v1alpha1 "github.com/redline-dev/redline/api/v1alpha1"
	"github.com/redline-dev/redline/internal/backend"
	"github.com/redline-dev/redline/internal/controller/loop"
)

// Why the manager watches Redis's memory policy.
//
// One Redis holds every namespace's counters, and a tenant may write its own keys up to
// maxmemory. What Redis does then is maxmemory-policy's choice, not the tenant's: an allkeys-*
// policy evicts any key, and a volatile-* one any key with a TTL, which every Redline key has.
// Either way a tenant that fills its own keys evicts other tenants' counters and heartbeats
// (measured: a victim's counter gone, its clients admitted again in the same window). With
// noeviction Redis refuses writes once full (OOM): the scripts fail, and each policy decides by
// its failureMode, which is visible and chosen. So anything but noeviction with a maxmemory set
// is reported on every policy: the counts of a tenant are only as durable as its neighbours'
// restraint.

// memoryPolicyRequest is the reconciler's one key: the memory policy is Redis's, shared by
// every namespace.
var memoryPolicyRequest = reconcile.Request{NamespacedName: types.NamespacedName{Name: "redis-memory-policy"}}

// NodeMemory is what one Redis node reports of its memory limit.
type NodeMemory struct {
	Addr string
	// MaxMemory is INFO memory's maxmemory (bytes); 0 is no limit.
	MaxMemory int64
	// Policy is INFO memory's maxmemory_policy.
	Policy string
}

// Evicts says whether the node can evict a Redline key to make room: a limit is set and the
// policy is not noeviction. (Every Redline key has a TTL, so volatile-* policies can evict any.)
func (n NodeMemory) Evicts() bool { return n.MaxMemory > 0 && n.Policy != "noeviction" }

// ReadNodeMemory reads maxmemory and maxmemory_policy from INFO memory, which managed Redis
// services answer where they refuse CONFIG GET.
func ReadNodeMemory(ctx context.Context, c *redis.Client) (NodeMemory, error) {
	n := NodeMemory{Addr: c.Options().Addr}
	info, err := c.Info(ctx, "memory").Result()
	if err != nil {
		return n, fmt.Errorf("reading INFO memory on %s: %w", n.Addr, err)
	}
	if n.MaxMemory, err = loop.InfoField(info, "maxmemory"); err != nil {
		return n, fmt.Errorf("reading maxmemory on %s: %w", n.Addr, err)
	}
	for line := range strings.Lines(info) {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok && k == "maxmemory_policy" {
			n.Policy = v
		}
	}
	if n.Policy == "" {
		return n, fmt.Errorf("reading maxmemory_policy on %s: field missing from INFO", n.Addr)
	}
	return n, nil
}

// memoryCondition is the RedisMemoryPolicy condition every policy carries, from what every
// node reported: pure, so that its messages are tested without a Redis.
func memoryCondition(nodes []NodeMemory, err error) (metav1.ConditionStatus, string, string) {
	if err != nil {
		return metav1.ConditionUnknown, v1alpha1.ReasonMemoryUnknown, "cannot read Redis's maxmemory-policy (INFO memory): " + err.Error()
	}
	var evicting, unbounded []string
	for _, n := range nodes {
		switch {
		case n.Evicts():
			evicting = append(evicting, fmt.Sprintf("%s (maxmemory-policy %s, maxmemory %d bytes)", n.Addr, n.Policy, n.MaxMemory))
		case n.MaxMemory == 0:
			unbounded = append(unbounded, n.Addr)
		}
	}
	slices.Sort(evicting)
	slices.Sort(unbounded)
	switch {
	case len(evicting) > 0:
		return metav1.ConditionFalse, v1alpha1.ReasonEvictionPossible, "counts can be evicted by another tenant's writes: " +
			listSome(evicting) + " evicts keys when full, and every Redline key is a candidate; " +
			"set maxmemory-policy noeviction on every node (a full Redis then refuses writes, and each policy decides by its failureMode) and lazyfree-lazy-user-del yes"
	case len(unbounded) > 0:
		return metav1.ConditionTrue, v1alpha1.ReasonNoMaxmemory, "Redis evicts no key (maxmemory 0 on " + listSome(unbounded) +
			"), but its memory is bounded only by the host: set maxmemory with maxmemory-policy noeviction, so that a full Redis refuses writes instead of being killed and losing counts"
	default:
		return metav1.ConditionTrue, v1alpha1.ReasonNoEviction, fmt.Sprintf("maxmemory-policy noeviction on all %d Redis nodes: no tenant's writes can evict another's counts; a full Redis refuses writes, and each policy decides by its failureMode", len(nodes))
	}
}

func listSome(items []string) string {
	const most = 3
	if len(items) <= most {
		return strings.Join(items, ", ")
	}
	return strings.Join(items[:most], ", ") + fmt.Sprintf(" and %d more", len(items)-most)
}

var memoryEvictable = prometheus.NewGaugeVec(prometheus.GaugeOpts{
	Name: "redline_redis_counts_evictable",
	Help: "1 when a Redis node can evict keys to make room (maxmemory set and maxmemory-policy not noeviction): one tenant's writes can then evict another's counts.",
}, []string{"backend", "node", "maxmemory_policy"})

// Reconciler reads maxmemory and maxmemory-policy on every Redis node, replicas
// too (a promoted replica brings its own), and writes the RedisMemoryPolicy condition on every
// policy, an Event on each policy whose condition changed, and redline_redis_counts_evictable.
type Reconciler struct {
	// Client writes policy status; Policies reads policies (the manager's cache).
	Client   client.Client
	Policies client.Reader
	// Backends are the Redis read: every backend's nodes, each policy gets its namespace's.
	Backends *backend.Registry
	Recorder events.EventRecorder
	// Interval is how often the nodes are read again (default 30s): an admin's CONFIG SET or a
	// failover changes the answer without any Kubernetes event.
	Interval time.Duration
	// RedisTimeout bounds the reads of one pass (default 5s).
	RedisTimeout time.Duration
	// MaxBackoff caps the retry delay while Redis is down (default 30s).
	MaxBackoff time.Duration

	mu sync.Mutex
}

// memoryResult is what one Redis's nodes said.
type memoryResult struct {
	status          metav1.ConditionStatus
	reason, message string
	durable         []NodeDurability
	err             error
}

// Reconcile reads every node of every Redis and brings every policy's condition in line: it
// reads as its phases, the nodes read, each Redis's condition and metric, the policies written.
func (r *Reconciler) Reconcile(ctx context.Context, _ ctrl.Request) (ctrl.Result, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	reads := r.readAll(ctx)
	results, redisErr := memoryResults(reads)
	if werr := r.setCondition(ctx, results); werr != nil {
		return ctrl.Result{}, werr
	}
	if redisErr != nil {
		return ctrl.Result{}, loop.WrapRedis(redisErr)
	}
	return ctrl.Result{RequeueAfter: loop.DurationOr(r.Interval, 30*time.Second)}, nil
}

// nodesRead is what one Redis's nodes said of their memory and persistence.
type nodesRead struct {
	label   string
	nodes   []NodeMemory
	durable []NodeDurability // durability.go
	err     error
}

// readAll reads every node of every Redis, within one RedisTimeout: what a node did not
// answer is its Redis's error, and the other nodes still count.
func (r *Reconciler) readAll(ctx context.Context) map[string]nodesRead {
	rctx, cancel := context.WithTimeout(ctx, backend.Timeout(r.RedisTimeout))
	defer cancel()
	var (
		mu    sync.Mutex
		reads = map[string]nodesRead{}
	)
	readOne := func(ctx context.Context, name, label string, each backend.NodeFunc) {
		var (
			nodes   []NodeMemory
			durable []NodeDurability
			errs    []error
		)
		err := each(ctx, func(ctx context.Context, c *redis.Client) error {
			n, err := ReadNodeMemory(ctx, c)
			d, derr := ReadNodeDurability(ctx, c)
			mu.Lock()
			defer mu.Unlock()
			if err = errors.Join(err, derr); err != nil {
				errs = append(errs, err)
				return nil
			}
			nodes, durable = append(nodes, n), append(durable, d)
			return nil
		})
		mu.Lock()
		reads[name] = nodesRead{label: label, nodes: nodes, durable: durable, err: errors.Join(append(errs, err)...)}
		mu.Unlock()
	}
	_ = r.Backends.Each(rctx, func(ctx context.Context, be *backend.Backend) error {
		readOne(ctx, be.Name, be.Label(), be.Nodes)
		return nil
	})
	return reads
}

// memoryResults gives each Redis its condition and its nodes' series of
// redline_redis_counts_evictable, and returns what the Redis that did not answer said.
func memoryResults(reads map[string]nodesRead) (map[string]memoryResult, error) {
	memoryEvictable.Reset()
	results := make(map[string]memoryResult, len(reads))
	var redisErrs []error
	for name, rd := range reads {
		for _, n := range rd.nodes {
			v := 0.0
			if n.Evicts() {
				v = 1
			}
			memoryEvictable.WithLabelValues(rd.label, n.Addr, n.Policy).Set(v)
		}
		status, reason, msg := memoryCondition(rd.nodes, rd.err)
		results[name] = memoryResult{status: status, reason: reason, message: loop.Message(msg), durable: rd.durable, err: rd.err}
		if rd.err != nil {
			redisErrs = append(redisErrs, fmt.Errorf("%s: %w", rd.label, rd.err))
		}
	}
	return results, errors.Join(redisErrs...)
}

// resultFor is the condition of a policy of namespace ns: its Redis's.
func (r *Reconciler) resultFor(ctx context.Context, ns string, results map[string]memoryResult) memoryResult {
	be, err := r.Backends.For(ctx, ns)
	if err != nil {
		return memoryResult{status: metav1.ConditionUnknown, reason: v1alpha1.ReasonMemoryUnknown, message: loop.Message(err.Error())}
	}
	if res, ok := results[be.Name]; ok {
		return res
	}
	return memoryResult{status: metav1.ConditionUnknown, reason: v1alpha1.ReasonMemoryUnknown, message: "the namespace's Redis was not read yet"}
}

// setCondition writes each policy's condition where it changed, with an Event there when its
// counts become evictable (new policies included) or stop being so.
func (r *Reconciler) setCondition(ctx context.Context, results map[string]memoryResult) error {
	list := loop.NewPolicyList()
	if err := r.Policies.List(ctx, list, client.UnsafeDisableDeepCopy); err != nil {
		return fmt.Errorf("listing ratelimitpolicies: %w", err)
	}
	var errs []error
	for i := range list.Items {
		p, err := loop.DecodePolicy(&list.Items[i])
		if err != nil {
			continue // the namespace reconciler reports it Undecodable
		}
		res := r.resultFor(ctx, p.Namespace, results)
		status, reason, msg := res.status, res.reason, res.message
		prev, written, err := loop.SetPolicyCondition(ctx, r.Client, p, metav1.Condition{
			Type: v1alpha1.ConditionRedisMemoryPolicy, Status: status, Reason: reason, Message: msg,
		})
		if err != nil {
			errs = append(errs, err)
		}
		if err := r.setDurabilityCondition(ctx, p, res); err != nil {
			errs = append(errs, err)
		}
		if !written {
			continue
		}
		// A Warning when counts become evictable, a Normal Event when they no longer are; a new
		// policy on a safe Redis is told nothing.
		switch {
		case r.Recorder == nil:
		case status == metav1.ConditionFalse && (prev == nil || prev.Reason != reason):
			r.Recorder.Eventf(p, nil, corev1.EventTypeWarning, reason, "RedisMemoryPolicy", "%s", msg)
		case status == metav1.ConditionTrue && prev != nil && prev.Status == metav1.ConditionFalse:
			r.Recorder.Eventf(p, nil, corev1.EventTypeNormal, reason, "RedisMemoryPolicy", "%s", msg)
		}
	}
	return errors.Join(errs...)
}

// SetupWithManager registers the reconciler: a first pass at start, one after policy changes
// (coalesced, so that a new policy gets its condition), and one every Interval.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	start := make(chan event.GenericEvent, 1)
	start <- event.GenericEvent{Object: loop.NewPolicy()}
	all := loop.Coalescing{Delay: time.Second, Req: memoryPolicyRequest}
	b := ctrl.NewControllerManagedBy(mgr).
		Named("redismemorypolicy").
		WithOptions(controller.Options{
			RateLimiter: workqueue.NewTypedItemExponentialFailureRateLimiter[reconcile.Request](200*time.Millisecond, backend.MaxBackoff(r.MaxBackoff)),
		}).
		WatchesRawSource(source.Channel(start, all)).
		Watches(loop.NewPolicy(), all, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		WatchesRawSource(source.Channel(r.Backends.Subscribe(), all))
	return b.Complete(r)
}

// Collectors are this loop's collectors, registered on controller-runtime's registry (which
// serves /metrics); the manager's list (controller.Collectors) is the metrics reference's.
var Collectors = []prometheus.Collector{memoryEvictable}

func init() { ctrlmetrics.Registry.MustRegister(Collectors...) }
