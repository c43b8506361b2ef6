package tenantacl

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
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
	"github.com/redline-dev/redline/internal/controller/loop"
	"github.com/redline-dev/redline/internal/redisacl"
)

// Tenant ACL modes (--redis-tenant-acl).
const (
	// ModeAuto gives every namespace with policies its own Redis user where Redis offers
	// ACLs, and falls back to the credential the admin provides where it refuses them, with
	// TenantIsolation=False on the namespace's policies.
	ModeAuto = "auto"
	// ModeRequired is auto, but the manager does not start when Redis refuses ACLs.
	ModeRequired = "required"
	// ModeOff leaves Redis credentials to the admin, as before per-namespace users.
	ModeOff = "off"
)

// Reconciler gives each namespace with policies its own Redis identity: an ACL user
// on every Redis node (package redisacl) limited to the namespace's keys and to the commands a
// sidecar runs, and its credentials in Secret SecretName of the namespace, which the injected
// sidecars mount. The admin's credential stays in the manager's namespace.
//
// Passwords are derived, never stored: HMAC-SHA256 of a key kept in Secret KeySecret of the
// manager's namespace (created on first use) over the namespace and the rotation period's
// number. Every replica and every restart computes the same ones, so the only state is that
// key. In period n a user holds the passwords of n-1 and n, and the Secret holds n's: when a
// period starts, Redis gets the new password first (on every node), then the Secret, and the
// previous one stays valid a whole period, far longer than kubelet takes to update the
// mounted Secret. Sidecars read the mounted files at every new connection; connections open
// stay authenticated.
type Reconciler struct {
	// Client writes Secrets and policy status; Policies reads policies (the manager's cache).
	Client   client.Client
	Policies client.Reader
	// APIReader reads the key Secret (not cached: it is one object, read once).
	APIReader client.Reader
	// Backends gives each namespace its Redis: a namespace's user lives on its backend's nodes
	// only (and sentinels, see sentinel.go), and is removed from every other backend (a
	// namespace moved to a Redis of its own keeps no way into the one it left).
	Backends *backend.Registry
	// Mode is ModeAuto, ModeRequired or ModeOff.
	Mode string
	// SecretName is the Secret written in each namespace (the injector's --sidecar-redis-secret).
	SecretName string
	// KeySecret is the Secret of the password key, in the manager's namespace.
	KeySecret types.NamespacedName
	// Rotation is the period after which each namespace's password changes (default 24h).
	Rotation time.Duration
	// RedisTimeout bounds the Redis calls of one reconcile (default 5s).
	RedisTimeout time.Duration
	// MaxBackoff caps the retry delay (default 30s).
	MaxBackoff time.Duration
	// Now is the clock (default time.Now).
	Now func() time.Time
	// CheckInterval is how often every node's run_id is read (default backend.DefaultCheckInterval, 1s): a node that
	// restarted lost its ACL users (they live in memory), and every namespace is set again.
	CheckInterval time.Duration

	secrets cache.Cache
	keyMu   sync.Mutex
	key     []byte

	// restartGen counts the node restarts (and new nodes) the restart watcher saw; applied is,
	// per namespace, the last ACL SETUSER that succeeded on every node. A namespace's reconcile
	// sets its user again only in a new rotation period, after a restart, or userRecheck after
	// the last time: a tenant that edits its Secret in a loop gets the Secret written back, not
	// an ACL SETUSER and an ACL LIST on every node per edit.
	restartGen atomic.Uint64
	watcher    *redisRestartWatcher
	appliedMu  sync.Mutex
	applied    map[string]appliedUser

	// When the sentinel reader was last set on each backend, with which password
	// (sentinel.go).
	sentinelMu  sync.Mutex
	sentinelSet map[string]sentinelSet
}

// Secrets: create is not restricted by name in Kubernetes' RBAC; everything else is, to the
// default names of the namespaces' credentials Secret and of the key Secret (a list or watch
// with a metadata.name field selector is authorized by resourceNames, which is how the
// Secrets cache lists). Other names (--sidecar-redis-secret, --redis-acl-key-secret) need the
// role edited to match.
// +kubebuilder:rbac:groups="",resources=secrets,verbs=create
// +kubebuilder:rbac:groups="",resources=secrets,resourceNames=redline-redis;redline-redis-acl,verbs=get;list;watch;update;patch;delete

// Reconcile brings one namespace's Redis user, Secret and TenantIsolation condition in line.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	ns := req.Namespace
	list := loop.NewPolicyList()
	if err := r.Policies.List(ctx, list, client.InNamespace(ns)); err != nil {
		return ctrl.Result{}, fmt.Errorf("listing policies of %s: %w", ns, err)
	}
	if r.Mode == ModeOff {
		return r.finish(ctx, ns, isolation{cond: isolationCondition(metav1.ConditionFalse, v1alpha1.ReasonTenantACLDisabled,
			"--redis-tenant-acl=off: sidecars use the credential the admin put in Secret "+r.SecretName+
				"; a tenant holding it can reach every namespace's Redis keys")})
	}
	if len(list.Items) == 0 {
		rctx, cancel := context.WithTimeout(ctx, backend.Timeout(r.RedisTimeout))
		defer cancel()
		return ctrl.Result{}, r.cleanup(rctx, ns)
	}
	return r.finish(ctx, ns, r.isolate(ctx, ns))
}

// isolation is what one reconcile of a namespace comes to: the TenantIsolation condition its
// policies get (nil: none is written), when to come back, and the error to retry on.
type isolation struct {
	cond   *metav1.Condition
	result ctrl.Result
	err    error
}

func isolationCondition(status metav1.ConditionStatus, reason, msg string) *metav1.Condition {
	return &metav1.Condition{Type: v1alpha1.ConditionTenantIsolation, Status: status, Reason: reason, Message: loop.Message(msg)}
}

// failed is a reconcile that failed with err, its condition saying why.
func failed(status metav1.ConditionStatus, reason, msg string, err error) isolation {
	return isolation{cond: isolationCondition(status, reason, msg), err: err}
}

// finish writes the condition of iso, the one place it is written. A reconcile that failed
// returns its own error (the condition is written on a best-effort basis); otherwise a
// condition that cannot be written is the error.
func (r *Reconciler) finish(ctx context.Context, ns string, iso isolation) (ctrl.Result, error) {
	var werr error
	if iso.cond != nil {
		werr = r.setCondition(ctx, ns, *iso.cond)
	}
	switch {
	case iso.err != nil:
		return ctrl.Result{}, iso.err
	case werr != nil:
		return ctrl.Result{}, werr
	}
	return iso.result, nil
}

// isolate sets the namespace's user on its Redis (and its sentinels' reader), removes it from
// every other backend and writes its credentials Secret.
func (r *Reconciler) isolate(ctx context.Context, ns string) isolation {
	rctx, cancel := context.WithTimeout(ctx, backend.Timeout(r.RedisTimeout))
	defer cancel()
	target, others, err := r.targetOf(ctx, ns)
	if err != nil {
		return failed(metav1.ConditionUnknown, v1alpha1.ReasonRedisUnavailable, "the namespace's Redis: "+err.Error(),
			fmt.Errorf("finding the redis of %s: %w", ns, err))
	}
	key, err := r.passwordKey(ctx)
	if err != nil {
		return isolation{err: err}
	}
	now := r.now()
	period := now.UnixNano() / int64(r.rotation())
	cur := derivePassword(key, ns, period)
	set := r.setUser(ctx, rctx, ns, target, others, key, period, now)
	switch {
	case errors.Is(set.err, redisacl.ErrUnavailable):
		log.FromContext(ctx).Info("redis refuses ACL commands: this namespace's sidecars keep the shared credential", "namespace", ns, "reason", set.err.Error())
		return isolation{result: ctrl.Result{RequeueAfter: backend.MaxBackoff(r.MaxBackoff)}, cond: isolationCondition(metav1.ConditionFalse, v1alpha1.ReasonRedisACLUnavailable,
			"Redis refuses ACL commands, so this namespace has no Redis user of its own: its sidecars use the credential the admin put in Secret "+
				r.SecretName+", and any tenant holding it can read, change or delete every namespace's Redis keys. Cause: "+set.err.Error())}
	case set.err != nil:
		return failed(metav1.ConditionUnknown, v1alpha1.ReasonRedisUnavailable, "setting the namespace's Redis user: "+set.err.Error(),
			fmt.Errorf("setting the redis user of %s: %w", ns, set.err))
	}
	if set.leftBehind == nil {
		r.setAppliedUser(ns, set.done)
	} else {
		log.FromContext(ctx).Info("the namespace's user is left on a backend it moved from; retrying", "namespace", ns, "error", set.leftBehind.Error())
	}
	sentinelPW, sentinelOpen, err := r.ensureSentinels(rctx, target, key)
	if err != nil {
		return failed(metav1.ConditionUnknown, v1alpha1.ReasonRedisUnavailable, "setting the sentinels' reader user: "+err.Error(),
			fmt.Errorf("setting the sentinel reader for %s: %w", ns, err))
	}
	if err := r.writeSecret(ctx, ns, cur, sentinelPW); err != nil {
		return failed(metav1.ConditionFalse, v1alpha1.ReasonTenantCredentialsErr, err.Error(), err)
	}
	return r.isolated(ctx, ns, target, set, sentinelOpen, period, now)
}

// isolated is the condition of a namespace whose user and Secret are set: whether that
// isolates it (unprotected sentinels or users without a password do not), and when to come
// back (the next rotation period, or soon where nodes were left out).
func (r *Reconciler) isolated(ctx context.Context, ns string, target redisTarget, set userSet, sentinelOpen string, period int64, now time.Time) isolation {
	next := time.Unix(0, (period+1)*int64(r.rotation()))
	requeue := ctrl.Result{RequeueAfter: next.Sub(now) + time.Second}
	if len(set.missing) > 0 {
		// No event would come for those nodes: the watcher has reported them already.
		requeue = ctrl.Result{RequeueAfter: r.relistDelay(set.done.missed)}
		log.FromContext(ctx).Info("the redis nodes listed for the namespace's user leave out nodes the restart watcher reads; setting it again",
			"namespace", ns, "missing", set.missing, "listed", set.done.addrs, "after", requeue.RequeueAfter)
	}
	if ok, reason, msg := sentinelIsolation(sentinelOpen); !ok {
		log.FromContext(ctx).Info("the sentinels are unprotected: tenants are not isolated", "namespace", ns, "reason", sentinelOpen)
		return isolation{result: ctrl.Result{RequeueAfter: backend.MaxBackoff(r.MaxBackoff)}, cond: isolationCondition(metav1.ConditionFalse, reason, msg)}
	}
	if open := set.done.open; len(open) > 0 {
		return isolation{result: requeue, cond: isolationCondition(metav1.ConditionFalse, v1alpha1.ReasonRedisDefaultUserOpen,
			fmt.Sprintf("Redis user(s) %s need no password (on, nopass), so the namespace's own Redis user %s"+
				" isolates nothing: anything that reaches Redis can connect as them, with whatever keys and commands they hold "+
				"(the default user: every key); give each a password (requirepass for the default user) or turn it off", strings.Join(open, ", "), redisacl.Username(ns)))}
	}
	msg := fmt.Sprintf("Redis user %s on %d node(s) of %s, keys %s only, commands a sidecar runs only; credentials in Secret %s, rotated every %s",
		redisacl.Username(ns), set.done.nodes, target.describe, strings.Join(redisacl.KeyPatterns(ns), " "), r.SecretName, r.rotation())
	if target.sentinels != nil && target.plaintext {
		msg += ". " + plaintextSentinel
	}
	iso := isolation{result: requeue, cond: &metav1.Condition{Type: v1alpha1.ConditionTenantIsolation, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonTenantIsolated, Message: msg}}
	if set.leftBehind != nil {
		iso.err = fmt.Errorf("removing the redis user of %s from another backend: %w", ns, set.leftBehind)
	}
	return iso
}

// userSet is what setting a namespace's user on its Redis did.
type userSet struct {
	done appliedUser
	// missing are nodes the restart watcher reads that the listing left out.
	missing []string
	// leftBehind is why the user could not be removed from another backend.
	leftBehind error
	err        error
}

// setUser sets the namespace's user, with the passwords of this period and the previous one,
// on every node of target, unless that was done already in this period since the last node
// restart; and removes it from the other backends where it may be.
func (r *Reconciler) setUser(ctx, rctx context.Context, ns string, target redisTarget, others []redisTarget, key []byte, period int64, now time.Time) userSet {
	gen := r.restartGen.Load()
	done, fresh := r.appliedUser(ns, target.id, period, gen, now)
	// A node the restart watcher reads that the last ACL SETUSER did not reach has no user
	// yet (see redisRestartWatcher.listed): set it again, whatever the generation.
	if fresh && len(unlisted(r.watcher.listed(target.id), done.addrs)) == 0 {
		return userSet{done: done}
	}
	// Misses in a row are at most maxBackoff apart (relistDelay); an older one is over.
	missed := done.missed
	if now.Sub(done.at) > 2*backend.MaxBackoff(r.MaxBackoff) {
		missed = 0
	}
	set := userSet{done: appliedUser{backend: target.id, period: period, gen: gen, at: now}}
	nodes, err := collectNodes(rctx, target.nodes)
	if err == nil {
		err = redisacl.Ensure(rctx, nodes, ns, []string{derivePassword(key, ns, period-1), derivePassword(key, ns, period)})
	}
	set.done.nodes, set.done.addrs, set.err = len(nodes), nodeAddrs(nodes), err
	if err != nil {
		return set
	}
	set.done.open, _ = redisacl.OpenUsers(rctx, nodes)
	if set.missing = unlisted(r.watcher.listed(target.id), set.done.addrs); len(set.missing) > 0 {
		set.done.missed = missed + 1
	}
	// The user on any other backend goes (the namespace moved, or this process does not
	// know where it was): its credentials reach its own Redis only. Each backend gets a
	// second at most, at once, so that one that hangs delays no namespace's reconcile
	// more; one that cannot be reached now is tried again.
	if last, known := r.lastApplied(ns); !known || last.backend != target.id {
		set.leftBehind = removeElsewhere(ctx, others, ns)
	}
	return set
}

// setCondition writes the TenantIsolation condition c on every policy of ns where it changed.
func (r *Reconciler) setCondition(ctx context.Context, ns string, c metav1.Condition) error {
	list := loop.NewPolicyList()
	if err := r.Policies.List(ctx, list, client.InNamespace(ns)); err != nil {
		return fmt.Errorf("listing policies of %s: %w", ns, err)
	}
	var errs []error
	for i := range list.Items {
		p, err := loop.DecodePolicy(&list.Items[i])
		if err != nil {
			continue // the namespace reconciler reports it Undecodable
		}
		if _, _, err := loop.SetPolicyCondition(ctx, r.Client, p, c); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (r *Reconciler) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

func (r *Reconciler) rotation() time.Duration {
	if r.Rotation > 0 {
		return r.Rotation
	}
	return 24 * time.Hour
}

// Probe says whether every Redis node answers ACL commands (for --redis-tenant-acl=required).
func Probe(ctx context.Context, nodes func(ctx context.Context, fn func(context.Context, *redis.Client) error) error) error {
	return nodes(ctx, func(ctx context.Context, c *redis.Client) error {
		return redisacl.Probe(ctx, []redisacl.Node{c})
	})
}

// SetupWithManager registers the reconciler: policy events and events on the namespaces'
// credentials Secrets (a tenant edited or deleted one) map to a namespace request. Secrets are
// watched through a cache of their own that holds only Secrets named SecretName, without their
// data (slimSecret), so the manager neither caches the cluster's other Secrets nor holds what
// a tenant put in its own.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	if _, err := redisacl.Commands(); err != nil {
		return err
	}
	secrets, err := cache.New(mgr.GetConfig(), cache.Options{
		Scheme: mgr.GetScheme(), Mapper: mgr.GetRESTMapper(),
		ByObject: map[client.Object]cache.ByObject{&corev1.Secret{}: {
			Field:     fields.OneTermEqualSelector("metadata.name", r.SecretName),
			Transform: slimSecret,
		}},
	})
	if err != nil {
		return fmt.Errorf("creating the secrets cache: %w", err)
	}
	if err := mgr.Add(secrets); err != nil {
		return fmt.Errorf("adding the secrets cache: %w", err)
	}
	r.secrets = secrets
	restarts := make(chan event.GenericEvent, 1)
	r.watcher = &redisRestartWatcher{targets: r.allTargets, interval: r.checkInterval(), timeout: backend.Timeout(r.RedisTimeout), events: restarts, gen: &r.restartGen}
	if err := mgr.Add(r.watcher); err != nil {
		return fmt.Errorf("adding the redis restart watcher: %w", err)
	}
	b := ctrl.NewControllerManagedBy(mgr).
		Named("tenantacl").
		Watches(loop.NewPolicy(), handler.EnqueueRequestsFromMapFunc(tenantRequest),
			builder.WithPredicates(predicate.Funcs{
				// A policy's own changes do not change its namespace's user; its coming and going do.
				UpdateFunc: func(event.UpdateEvent) bool { return false },
			})).
		WatchesRawSource(source.Kind(secrets, client.Object(&corev1.Secret{}), handler.EnqueueRequestsFromMapFunc(tenantRequest))).
		WatchesRawSource(source.Channel(restarts, handler.EnqueueRequestsFromMapFunc(r.allNamespaces))).
		// A backend dialed, replaced or removed, or a namespace moved to another.
		WatchesRawSource(source.Channel(r.Backends.Subscribe(), handler.EnqueueRequestsFromMapFunc(r.allNamespaces)))
	b = b.WithOptions(controller.Options{
		RateLimiter: workqueue.NewTypedItemExponentialFailureRateLimiter[reconcile.Request](200*time.Millisecond, backend.MaxBackoff(r.MaxBackoff)),
	})
	return b.Complete(r)
}

// allNamespaces is a request for every namespace with policies.
func (r *Reconciler) allNamespaces(ctx context.Context, _ client.Object) []reconcile.Request {
	list := loop.NewPolicyList()
	if err := r.Policies.List(ctx, list); err != nil {
		log.FromContext(ctx).Error(err, "listing policies to set redis users again after a restart")
		return nil
	}
	seen := map[string]bool{}
	var out []reconcile.Request
	for i := range list.Items {
		if ns := list.Items[i].GetNamespace(); !seen[ns] {
			seen[ns] = true
			out = append(out, tenantRequest(ctx, &list.Items[i])...)
		}
	}
	return out
}

// relistDelay is how long after the missed-th listing in a row that left out nodes the
// watcher reads the user is set again: a check interval, doubling up to the longest retry
// delay. A cluster's nodes agree on its replicas within seconds; one whose views stay apart
// costs an ACL SETUSER on every node per namespace every maxBackoff, no more.
func (r *Reconciler) relistDelay(missed int) time.Duration {
	d := r.checkInterval()
	for i := 1; i < missed && d < backend.MaxBackoff(r.MaxBackoff); i++ {
		d *= 2
	}
	return min(d, backend.MaxBackoff(r.MaxBackoff))
}

func (r *Reconciler) checkInterval() time.Duration { return backend.CheckInterval(r.CheckInterval) }

func tenantRequest(_ context.Context, o client.Object) []reconcile.Request {
	return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: o.GetNamespace(), Name: "tenant-acl"}}}
}
