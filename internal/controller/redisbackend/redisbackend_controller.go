package redisbackend

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	v1alpha1 "github.com/redline-dev/redline/api/v1alpha1"
	"github.com/redline-dev/redline/internal/backend"
	"github.com/redline-dev/redline/internal/controller/loop"
)

// Keys of a RedisBackend's credentials Secret.
const (
	UsernameKey         = "username"
	PasswordKey         = "password"
	SentinelUsernameKey = "sentinel-username"
	SentinelPasswordKey = "sentinel-password"
)

// maxBackendSecretBytes bounds what is read of a credentials Secret: passwords, not files.
const maxBackendSecretBytes = 16 << 10

// backendsRequest is the reconciler's one key: the backends are dialed, and the namespaces
// assigned, in one pass, since an assignment depends on every backend.
var backendsRequest = reconcile.Request{NamespacedName: types.NamespacedName{Name: "redis-backends"}}

// Dialer builds the clients of the RedisBackend name of spec with the admin's
// credentials (backend.Dial, with the manager's TLS files).
type Dialer func(name string, spec v1alpha1.RedisBackendSpec, creds backend.Credentials) (*backend.Backend, error)

// Reconciler dials the Redis of every RedisBackend with the admin's credentials
// from its Secret, keeps the clients in Backends for the other reconcilers and the injector,
// and writes each backend's status: Ready, how many namespaces it serves, and which of those it
// selects an older backend serves.
type Reconciler struct {
	Client client.Client
	// Reader reads RedisBackends and Namespaces (the manager's cache).
	Reader client.Reader
	// APIReader reads credentials Secrets (not cached: a few objects, read each pass).
	APIReader client.Reader
	Backends  *backend.Registry
	// Namespace is the manager's, where the credentials Secrets live.
	Namespace string
	Dial      Dialer
	// RedisTimeout bounds the Redis calls of one backend (default 5s); Interval is how often
	// the pass runs without an event, to follow Secrets and Redis (default 30s).
	RedisTimeout, Interval time.Duration
	// Elected is closed once this replica leads; nil: it always does. Every replica dials the
	// backends (every replica's injector sizes pools from their budgets); the leader writes
	// status.
	Elected <-chan struct{}

	mu     sync.Mutex
	assign map[string]string // namespace -> RedisBackend name, at the last pass
	// notReady counts the passes in a row that found a backend not ready.
	notReady int
}

// +kubebuilder:rbac:groups=redline.dev,resources=redisbackends,verbs=get;list;watch
// +kubebuilder:rbac:groups=redline.dev,resources=redisbackends/status,verbs=get;update;patch
// +kubebuilder:rbac:groups="",resources=namespaces,verbs=get;list;watch
// The credentials Secrets of RedisBackends live in the manager's namespace: a Role there.
// +kubebuilder:rbac:groups="",namespace=redline-system,resources=secrets,verbs=get

// assignments are which backend serves each namespace, how many each serves, and which
// namespaces each selects in vain (an older backend serves them).
func assignments(backends []v1alpha1.RedisBackend, namespaces []corev1.Namespace) (assign map[string]string, served map[string]int32, conflicts map[string][]string) {
	assign, served, conflicts = map[string]string{}, map[string]int32{}, map[string][]string{}
	for i := range namespaces {
		ns := &namespaces[i]
		owner := backend.Assign(backends, ns.Labels)
		if owner == nil {
			continue
		}
		assign[ns.Name] = owner.Name
		served[owner.Name]++
		for j := range backends {
			rb := &backends[j]
			if rb.Name != owner.Name && backend.Selects(rb, ns.Labels) {
				conflicts[rb.Name] = append(conflicts[rb.Name], ns.Name)
			}
		}
	}
	return assign, served, conflicts
}

// Reconcile dials what changed, drops what is gone, and writes every backend's status.
func (r *Reconciler) Reconcile(ctx context.Context, _ ctrl.Request) (ctrl.Result, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var list v1alpha1.RedisBackendList
	if err := r.Reader.List(ctx, &list); err != nil {
		return ctrl.Result{}, fmt.Errorf("listing redisbackends: %w", err)
	}
	var namespaces corev1.NamespaceList
	if err := r.Reader.List(ctx, &namespaces); err != nil {
		return ctrl.Result{}, fmt.Errorf("listing namespaces: %w", err)
	}
	live := map[string]bool{}
	ready := make(map[string]metav1.Condition, len(list.Items))
	var wg sync.WaitGroup
	var readyMu sync.Mutex
	for i := range list.Items {
		rb := &list.Items[i]
		live[rb.Name] = true
		wg.Go(func() {
			c := r.sync(ctx, rb)
			readyMu.Lock()
			ready[rb.Name] = c
			readyMu.Unlock()
		})
	}
	wg.Wait()
	for _, name := range r.Backends.Names() {
		if !live[name] {
			r.Backends.Remove(name)
		}
	}

	assign, served, conflicts := assignments(list.Items, namespaces.Items)
	if !maps.Equal(assign, r.assign) {
		r.Backends.Notify()
	}
	r.assign = assign

	var errs []error
	if r.leader() {
		for i := range list.Items {
			rb := &list.Items[i]
			if err := r.writeStatus(ctx, rb, ready[rb.Name], served[rb.Name], conflicts[rb.Name]); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return ctrl.Result{}, err
	}
	// A backend that is not ready (its Secret not created yet, its Redis down) is looked at
	// again soon, then less and less often: no event tells when a Secret or a Redis appears.
	interval := loop.DurationOr(r.Interval, 30*time.Second)
	allReady := true
	for _, c := range ready {
		allReady = allReady && c.Status == metav1.ConditionTrue
	}
	if allReady {
		r.notReady = 0
		return ctrl.Result{RequeueAfter: interval}, nil
	}
	r.notReady = min(r.notReady+1, 16)
	return ctrl.Result{RequeueAfter: min(time.Second<<(r.notReady-1), interval)}, nil
}

// sync dials rb where its configuration changed and checks its scripts: the Ready condition.
// A backend that worked keeps its clients while its Secret cannot be read (an admin's edit in
// progress): its namespaces keep their Redis.
func (r *Reconciler) sync(ctx context.Context, rb *v1alpha1.RedisBackend) metav1.Condition {
	notReady := func(reason, msg string) metav1.Condition {
		return metav1.Condition{Type: v1alpha1.ConditionReady, Status: metav1.ConditionFalse, Reason: reason, Message: loop.Message(msg)}
	}
	if _, err := metav1.LabelSelectorAsSelector(&rb.Spec.NamespaceSelector); err != nil {
		return notReady(v1alpha1.ReasonBackendInvalid, "spec.namespaceSelector: "+err.Error())
	}
	creds, err := r.credentials(ctx, rb)
	if err != nil {
		return notReady(v1alpha1.ReasonBackendSecretError, err.Error())
	}
	digest := backendDigest(rb, creds)
	be := r.Backends.Get(rb.Name)
	if be == nil || be.Digest != digest {
		nb, err := r.Dial(rb.Name, rb.Spec, creds)
		if err != nil {
			return notReady(v1alpha1.ReasonBackendDialError, "spec.url: "+err.Error())
		}
		nb.Digest = digest
		r.Backends.Put(nb)
		be = nb
	}
	sctx, cancel := context.WithTimeout(ctx, backend.Timeout(r.RedisTimeout))
	defer cancel()
	if _, err := be.Scripts.Ensure(sctx); err != nil {
		return metav1.Condition{Type: v1alpha1.ConditionReady, Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonBackendUnavailable,
			Message: loop.Message("loading the scripts with the admin's credentials: " + err.Error())}
	}
	return metav1.Condition{Type: v1alpha1.ConditionReady, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonBackendReady,
		Message: "the manager reaches this Redis with the admin's credentials, and it holds the scripts"}
}

// credentials reads rb's Secret from the manager's namespace.
func (r *Reconciler) credentials(ctx context.Context, rb *v1alpha1.RedisBackend) (backend.Credentials, error) {
	if rb.Spec.CredentialsSecret == "" {
		return backend.Credentials{}, nil
	}
	var s corev1.Secret
	key := types.NamespacedName{Namespace: r.Namespace, Name: rb.Spec.CredentialsSecret}
	if err := r.APIReader.Get(ctx, key, &s); err != nil {
		if apierrors.IsNotFound(err) {
			return backend.Credentials{}, fmt.Errorf("secret %s not found: create it in the manager's namespace with key %q", key, PasswordKey)
		}
		return backend.Credentials{}, fmt.Errorf("reading secret %s: %w", key, err)
	}
	total := 0
	for _, v := range s.Data {
		total += len(v)
	}
	if total > maxBackendSecretBytes {
		return backend.Credentials{}, fmt.Errorf("secret %s holds %d bytes, more than the %d a set of credentials needs", key, total, maxBackendSecretBytes)
	}
	c := backend.Credentials{
		Username: string(s.Data[UsernameKey]), Password: string(s.Data[PasswordKey]),
		SentinelUsername: string(s.Data[SentinelUsernameKey]), SentinelPassword: string(s.Data[SentinelPasswordKey]),
	}
	if c.Password == "" {
		return c, fmt.Errorf("secret %s has no key %q", key, PasswordKey)
	}
	return c, nil
}

// backendDigest identifies what a backend is dialed with.
func backendDigest(rb *v1alpha1.RedisBackend, c backend.Credentials) string {
	h := sha256.New()
	var tlsName, tlsVersion string
	if t := rb.Spec.TLS; t != nil {
		tlsName, tlsVersion = t.ServerName, t.MinVersion
	}
	for _, v := range []string{rb.Spec.URL, strconv.FormatInt(rb.Spec.MaxClients, 10), tlsName, tlsVersion, c.Username, c.Password, c.SentinelUsername, c.SentinelPassword} {
		h.Write([]byte(strconv.Itoa(len(v)) + ":" + v))
	}
	return hex.EncodeToString(h.Sum(nil))
}

func (r *Reconciler) writeStatus(ctx context.Context, rb *v1alpha1.RedisBackend, ready metav1.Condition, served int32, conflicts []string) error {
	want := rb.Status.DeepCopy()
	want.ObservedGeneration = rb.Generation
	ready.ObservedGeneration = rb.Generation
	meta.SetStatusCondition(&want.Conditions, ready)
	want.Namespaces = served
	slices.Sort(conflicts)
	want.Conflicts = conflicts[:min(len(conflicts), 10)]
	if len(want.Conflicts) == 0 {
		want.Conflicts = nil
	}
	if apiequality.Semantic.DeepEqual(rb.Status, *want) {
		return nil
	}
	before := rb.DeepCopy()
	rb.Status = *want
	if err := r.Client.Status().Patch(ctx, rb, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("updating status of redisbackend %s: %w", rb.Name, err)
	}
	return nil
}

func (r *Reconciler) leader() bool { return loop.IsElected(r.Elected) }

// SetupWithManager registers the reconciler on every replica: RedisBackends, and Namespaces
// whose labels change, map to its one request.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	one := handler.EnqueueRequestsFromMapFunc(func(context.Context, client.Object) []reconcile.Request {
		return []reconcile.Request{backendsRequest}
	})
	start := make(chan event.GenericEvent, 1)
	start <- event.GenericEvent{Object: &v1alpha1.RedisBackend{}}
	return ctrl.NewControllerManagedBy(mgr).
		Named("redisbackend").
		WithOptions(controller.Options{
			NeedLeaderElection: new(false),
			RateLimiter:        workqueue.NewTypedItemExponentialFailureRateLimiter[reconcile.Request](200*time.Millisecond, backend.DefaultMaxBackoff),
		}).
		Watches(&v1alpha1.RedisBackend{}, one, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Watches(&corev1.Namespace{}, one, builder.WithPredicates(predicate.LabelChangedPredicate{})).
		WatchesRawSource(source.Channel(start, one)).
		Complete(r)
}
