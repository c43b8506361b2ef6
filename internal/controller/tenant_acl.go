package controller

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
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
	"github.com/redline-dev/redline/internal/limiter/scripts"
	"github.com/redline-dev/redline/internal/redisacl"
	"github.com/redline-dev/redline/internal/redisconn"
	"github.com/redline-dev/redline/internal/sidecar/contract"
)

// Tenant ACL modes (--redis-tenant-acl).
const (
	// TenantACLAuto gives every namespace with policies its own Redis user where Redis offers
	// ACLs, and falls back to the credential the admin provides where it refuses them, with
	// TenantIsolation=False on the namespace's policies.
	TenantACLAuto = "auto"
	// TenantACLRequired is auto, but the manager does not start when Redis refuses ACLs.
	TenantACLRequired = "required"
	// TenantACLOff leaves Redis credentials to the admin, as before per-namespace users.
	TenantACLOff = "off"
)

// Reasons of the TenantIsolation condition.
const (
	ReasonTenantIsolated       = "RedisACLUser"
	ReasonRedisACLUnavailable  = "RedisACLUnavailable"
	ReasonTenantACLDisabled    = "TenantACLDisabled"
	ReasonTenantCredentialsErr = "CredentialsSecretError"
	ReasonRedisDefaultUserOpen = "RedisDefaultUserOpen"
)

// secretDigestAnnotation carries, in the Secrets cache only, the SHA-256 of a Secret's data:
// the cache keeps it instead of the data, which a tenant can make up to a MiB.
const secretDigestAnnotation = "redline.dev/data-sha256"

// TenantACLReconciler gives each namespace with policies its own Redis identity: an ACL user
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
type TenantACLReconciler struct {
	// Client writes Secrets and policy status; Policies reads policies (the manager's cache).
	Client   client.Client
	Policies client.Reader
	// APIReader reads the key Secret (not cached: it is one object, read once).
	APIReader client.Reader
	// Nodes runs a function on every Redis node (redisconn.Nodes.Each).
	Nodes func(ctx context.Context, fn func(context.Context, *redis.Client) error) error
	// Sentinels, with Sentinel, runs a function on every sentinel as the admin
	// (redisconn.Nodes.EachSentinel); nil otherwise. See tenant_sentinel.go.
	Sentinels func(ctx context.Context, fn func(context.Context, *redis.Client) error) error
	// Backends, when set, gives each namespace its Redis, and Nodes and Sentinels are not
	// used: a namespace's user lives on its backend's nodes only, and is removed from every
	// other backend (a namespace moved to a Redis of its own keeps no way into the one it
	// left).
	Backends *Backends
	// Mode is TenantACLAuto, TenantACLRequired or TenantACLOff.
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
	// CheckInterval is how often every node's run_id is read (default DefaultCheckInterval, 1s): a node that
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
	appliedMu  sync.Mutex
	applied    map[string]appliedUser

	// When the sentinel reader was last set on each backend, with which password
	// (tenant_sentinel.go).
	sentinelMu  sync.Mutex
	sentinelSet map[string]sentinelSet
}

// sentinelSet is when the sentinel reader was last set on one backend's sentinels.
type sentinelSet struct {
	at time.Time
	pw string
}

// redisTarget is one Redis a namespace's user is set on: its nodes and sentinels.
type redisTarget struct {
	id, describe string
	nodes        NodeFunc
	sentinels    NodeFunc
	// plaintext: reached without TLS (its URL is not rediss:// or rediss+sentinel://).
	plaintext bool
}

// targetOf is the Redis of ns, and the other backends, from which its user is removed.
func (r *TenantACLReconciler) targetOf(ctx context.Context, ns string) (redisTarget, []redisTarget, error) {
	if r.Backends == nil {
		return redisTarget{describe: "Redis", nodes: r.Nodes, sentinels: r.Sentinels}, nil, nil
	}
	be, err := r.Backends.For(ctx, ns)
	if err != nil {
		return redisTarget{}, nil, err
	}
	var others []redisTarget
	for _, o := range r.Backends.All() {
		if o.Name != be.Name {
			others = append(others, backendTarget(o))
		}
	}
	return backendTarget(be), others, nil
}

func backendTarget(be *Backend) redisTarget {
	return redisTarget{id: be.id(), describe: be.describe(), nodes: be.Nodes, sentinels: be.Sentinels, plaintext: !redisconn.URLUsesTLS(be.URL)}
}

// allTargets are every Redis the manager has clients for.
func (r *TenantACLReconciler) allTargets() []redisTarget {
	if r.Backends == nil {
		return []redisTarget{{describe: "Redis", nodes: r.Nodes, sentinels: r.Sentinels}}
	}
	var out []redisTarget
	for _, be := range r.Backends.All() {
		out = append(out, backendTarget(be))
	}
	return out
}

// appliedUser is one namespace's last successful ACL SETUSER on every node.
type appliedUser struct {
	backend string // redisTarget.id
	period  int64
	gen     uint64
	at      time.Time
	nodes   int
	open    []string // redisacl.OpenUsers then
}

// appliedUser returns the namespace's last ACL SETUSER, and whether it still holds: the same
// period and restart generation, less than userRecheck ago.
func (r *TenantACLReconciler) appliedUser(ns, backend string, period int64, gen uint64, now time.Time) (appliedUser, bool) {
	r.appliedMu.Lock()
	defer r.appliedMu.Unlock()
	a, ok := r.applied[ns]
	return a, ok && a.backend == backend && a.period == period && a.gen == gen && now.Sub(a.at) < userRecheck
}

// lastApplied is the namespace's last successful ACL SETUSER, however old.
func (r *TenantACLReconciler) lastApplied(ns string) (appliedUser, bool) {
	r.appliedMu.Lock()
	defer r.appliedMu.Unlock()
	a, ok := r.applied[ns]
	return a, ok
}

func (r *TenantACLReconciler) setAppliedUser(ns string, a appliedUser) {
	r.appliedMu.Lock()
	defer r.appliedMu.Unlock()
	if r.applied == nil {
		r.applied = map[string]appliedUser{}
	}
	r.applied[ns] = a
}

func (r *TenantACLReconciler) forgetAppliedUser(ns string) {
	r.appliedMu.Lock()
	defer r.appliedMu.Unlock()
	delete(r.applied, ns)
}

// Secrets: create is not restricted by name in Kubernetes' RBAC; everything else is, to the
// default names of the namespaces' credentials Secret and of the key Secret (a list or watch
// with a metadata.name field selector is authorized by resourceNames, which is how the
// Secrets cache lists). Other names (--sidecar-redis-secret, --redis-acl-key-secret) need the
// role edited to match.
// +kubebuilder:rbac:groups="",resources=secrets,verbs=create
// +kubebuilder:rbac:groups="",resources=secrets,resourceNames=redline-redis;redline-redis-acl,verbs=get;list;watch;update;patch;delete

// Reconcile brings one namespace's Redis user, Secret and TenantIsolation condition in line.
func (r *TenantACLReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	ns := req.Namespace
	list := newPolicyList()
	if err := r.Policies.List(ctx, list, client.InNamespace(ns)); err != nil {
		return ctrl.Result{}, fmt.Errorf("listing policies of %s: %w", ns, err)
	}
	if r.Mode == TenantACLOff {
		return ctrl.Result{}, r.setCondition(ctx, ns, metav1.ConditionFalse, ReasonTenantACLDisabled,
			"--redis-tenant-acl=off: sidecars use the credential the admin put in Secret "+r.SecretName+
				"; a tenant holding it can reach every namespace's Redis keys")
	}
	rctx, cancel := context.WithTimeout(ctx, r.redisTimeout())
	defer cancel()
	if len(list.Items) == 0 {
		return ctrl.Result{}, r.cleanup(rctx, ns)
	}
	target, others, err := r.targetOf(ctx, ns)
	if err != nil {
		_ = r.setCondition(ctx, ns, metav1.ConditionUnknown, ReasonRedisUnavailable, truncate("the namespace's Redis: "+err.Error()))
		return ctrl.Result{}, fmt.Errorf("finding the redis of %s: %w", ns, err)
	}
	key, err := r.passwordKey(ctx)
	if err != nil {
		return ctrl.Result{}, err
	}
	now := r.now()
	period := now.UnixNano() / int64(r.rotation())
	cur, prev := derivePassword(key, ns, period), derivePassword(key, ns, period-1)
	gen := r.restartGen.Load()
	done, fresh := r.appliedUser(ns, target.id, period, gen, now)
	var leftBehind error
	if !fresh {
		done = appliedUser{backend: target.id, period: period, gen: gen, at: now}
		var nodes []redisacl.Node
		nodes, err = collectNodes(rctx, target.nodes)
		if err == nil {
			err = redisacl.Ensure(rctx, nodes, ns, []string{prev, cur})
		}
		done.nodes = len(nodes)
		if err == nil {
			done.open, _ = redisacl.OpenUsers(rctx, nodes)
		}
		// The user on any other backend goes (the namespace moved, or this process does not
		// know where it was): its credentials reach its own Redis only. Each backend gets a
		// second at most, at once, so that one that hangs delays no namespace's reconcile
		// more; one that cannot be reached now is tried again.
		if last, known := r.lastApplied(ns); err == nil && (!known || last.backend != target.id) {
			leftBehind = removeElsewhere(ctx, others, ns)
		}
	}
	switch {
	case errors.Is(err, redisacl.ErrUnavailable):
		log.FromContext(ctx).Info("redis refuses ACL commands: this namespace's sidecars keep the shared credential", "namespace", ns, "reason", err.Error())
		return ctrl.Result{RequeueAfter: r.maxBackoff()}, r.setCondition(ctx, ns, metav1.ConditionFalse, ReasonRedisACLUnavailable,
			truncate("Redis refuses ACL commands, so this namespace has no Redis user of its own: its sidecars use the credential the admin put in Secret "+
				r.SecretName+", and any tenant holding it can read, change or delete every namespace's Redis keys. Cause: "+err.Error()))
	case err != nil:
		_ = r.setCondition(ctx, ns, metav1.ConditionUnknown, ReasonRedisUnavailable, truncate("setting the namespace's Redis user: "+err.Error()))
		return ctrl.Result{}, fmt.Errorf("setting the redis user of %s: %w", ns, err)
	}
	if leftBehind == nil {
		r.setAppliedUser(ns, done)
	} else {
		log.FromContext(ctx).Info("the namespace's user is left on a backend it moved from; retrying", "namespace", ns, "error", leftBehind.Error())
	}
	sentinelPW, sentinelOpen, err := r.ensureSentinels(rctx, target, key)
	if err != nil {
		_ = r.setCondition(ctx, ns, metav1.ConditionUnknown, ReasonRedisUnavailable, truncate("setting the sentinels' reader user: "+err.Error()))
		return ctrl.Result{}, fmt.Errorf("setting the sentinel reader for %s: %w", ns, err)
	}
	if err := r.writeSecret(ctx, ns, cur, sentinelPW); err != nil {
		_ = r.setCondition(ctx, ns, metav1.ConditionFalse, ReasonTenantCredentialsErr, truncate(err.Error()))
		return ctrl.Result{}, err
	}
	next := time.Unix(0, (period+1)*int64(r.rotation()))
	requeue := ctrl.Result{RequeueAfter: next.Sub(now) + time.Second}
	if ok, reason, msg := sentinelIsolation(sentinelOpen); !ok {
		log.FromContext(ctx).Info("the sentinels are unprotected: tenants are not isolated", "namespace", ns, "reason", sentinelOpen)
		return ctrl.Result{RequeueAfter: r.maxBackoff()}, r.setCondition(ctx, ns, metav1.ConditionFalse, reason, truncate(msg))
	}
	if open := done.open; len(open) > 0 {
		return requeue, r.setCondition(ctx, ns, metav1.ConditionFalse, ReasonRedisDefaultUserOpen,
			truncate(fmt.Sprintf("Redis user(s) %s need no password (on, nopass), so the namespace's own Redis user %s"+
				" isolates nothing: anything that reaches Redis can connect as them, with whatever keys and commands they hold "+
				"(the default user: every key); give each a password (requirepass for the default user) or turn it off", strings.Join(open, ", "), redisacl.Username(ns))))
	}
	msg := fmt.Sprintf("Redis user %s on %d node(s) of %s, keys %s only, commands a sidecar runs only; credentials in Secret %s, rotated every %s",
		redisacl.Username(ns), done.nodes, target.describe, strings.Join(redisacl.KeyPatterns(ns), " "), r.SecretName, r.rotation())
	if target.sentinels != nil && target.plaintext {
		msg += ". " + plaintextSentinel
	}
	if err := r.setCondition(ctx, ns, metav1.ConditionTrue, ReasonTenantIsolated, msg); err != nil {
		return ctrl.Result{}, err
	}
	if leftBehind != nil {
		return ctrl.Result{}, fmt.Errorf("removing the redis user of %s from another backend: %w", ns, leftBehind)
	}
	return requeue, nil
}

// plaintextSentinel says, on a namespace served through Sentinel without TLS, what an attacker
// with network reach can do.
const plaintextSentinel = "The sentinels and Redis are reached without TLS: anything on the network path between them and a pod or the manager " +
	"can read and change the traffic, these credentials and the manager's included, and answer in a server's place; without such a position, " +
	"no client is sent to a server the sentinels did not promote (use rediss+sentinel:// to close this)"

// derivePassword is namespace's password of rotation period n.
func derivePassword(key []byte, namespace string, n int64) string {
	m := hmac.New(sha256.New, key)
	m.Write([]byte("redline redis acl\x00" + namespace + "\x00" + strconv.FormatInt(n, 10)))
	return hex.EncodeToString(m.Sum(nil))
}

func collectNodes(ctx context.Context, each NodeFunc) ([]redisacl.Node, error) {
	var (
		mu    sync.Mutex
		nodes []redisacl.Node
	)
	err := each(ctx, func(_ context.Context, c *redis.Client) error {
		mu.Lock()
		nodes = append(nodes, c)
		mu.Unlock()
		return nil
	})
	return nodes, err
}

// removeElsewhere removes ns's user from every backend of others, at once, a second each.
func removeElsewhere(ctx context.Context, others []redisTarget, ns string) error {
	errs := make([]error, len(others))
	var wg sync.WaitGroup
	for i, o := range others {
		wg.Go(func() {
			octx, cancel := context.WithTimeout(ctx, time.Second)
			defer cancel()
			errs[i] = removeUser(octx, o, ns)
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// removeUser removes ns's user from every node of t.
func removeUser(ctx context.Context, t redisTarget, ns string) error {
	nodes, err := collectNodes(ctx, t.nodes)
	if err == nil {
		err = redisacl.Remove(ctx, nodes, ns)
	}
	if err != nil && !errors.Is(err, redisacl.ErrUnavailable) {
		return fmt.Errorf("%s: %w", t.describe, err)
	}
	return nil
}

// cleanup removes the user (from every backend) and the Secret of a namespace without
// policies: nothing to enforce.
func (r *TenantACLReconciler) cleanup(ctx context.Context, ns string) error {
	r.forgetAppliedUser(ns)
	var errs []error
	for _, t := range r.allTargets() {
		errs = append(errs, removeUser(ctx, t, ns))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("removing the redis user of %s: %w", ns, err)
	}
	var s corev1.Secret
	err := r.secretReader().Get(ctx, client.ObjectKey{Namespace: ns, Name: r.SecretName}, &s)
	if apierrors.IsNotFound(err) || (err == nil && s.Labels[ManagedByLabel] != ManagedByValue) {
		return nil // an admin's Secret is theirs
	}
	if err != nil {
		return fmt.Errorf("reading secret %s/%s: %w", ns, r.SecretName, err)
	}
	if err := r.Client.Delete(ctx, &s); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting secret %s/%s: %w", ns, r.SecretName, err)
	}
	return nil
}

// desiredSecretData is what the namespace's Secret holds: its user, and with Sentinel the
// shared sentinel reader (sentinelPassword, "" without).
func desiredSecretData(ns, password, sentinelPassword string) map[string][]byte {
	data := map[string][]byte{
		contract.RedisUsernameKey: []byte(redisacl.Username(ns)),
		contract.RedisSecretKey:   []byte(password),
	}
	sentinelSecretData(data, sentinelPassword)
	return data
}

// writeSecret makes the namespace's Secret hold its user's current credentials. What a tenant
// did to it (edited, deleted, emptied, made immutable) is undone.
func (r *TenantACLReconciler) writeSecret(ctx context.Context, ns, password, sentinelPassword string) error {
	data := desiredSecretData(ns, password, sentinelPassword)
	want := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Name: r.SecretName, Namespace: ns,
			Labels: map[string]string{ManagedByLabel: ManagedByValue},
		},
		Type: corev1.SecretTypeOpaque,
		Data: data,
	}
	var cur corev1.Secret
	err := r.secretReader().Get(ctx, client.ObjectKey{Namespace: ns, Name: r.SecretName}, &cur)
	switch {
	case apierrors.IsNotFound(err):
		// AlreadyExists: the cache has not seen it yet; its watch event brings us back.
		if err := r.Client.Create(ctx, want); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("creating secret %s/%s: %w", ns, r.SecretName, err)
		}
		return nil
	case err != nil:
		return fmt.Errorf("reading secret %s/%s: %w", ns, r.SecretName, err)
	}
	if secretDigest(&cur) == dataDigest(data) && cur.Labels[ManagedByLabel] == ManagedByValue &&
		cur.Type == corev1.SecretTypeOpaque && (cur.Immutable == nil || !*cur.Immutable) {
		return nil
	}
	want.ResourceVersion = cur.ResourceVersion
	err = r.Client.Update(ctx, want)
	if apierrors.IsInvalid(err) || apierrors.IsForbidden(err) || apierrors.IsBadRequest(err) {
		// Immutable, or of another type: replace it.
		if err := r.Client.Delete(ctx, &cur, client.Preconditions{UID: &cur.UID}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("replacing secret %s/%s: %w", ns, r.SecretName, err)
		}
		want.ResourceVersion = ""
		err = r.Client.Create(ctx, want)
	}
	if err != nil {
		return fmt.Errorf("writing secret %s/%s: %w", ns, r.SecretName, err)
	}
	return nil
}

// secretDigest is the digest of a Secret's data: the one the Secrets cache left in place of
// the data, or computed when read directly.
func secretDigest(s *corev1.Secret) string {
	if d, ok := s.Annotations[secretDigestAnnotation]; ok && s.Data == nil {
		return d
	}
	return dataDigest(s.Data)
}

func dataDigest(data map[string][]byte) string {
	h := sha256.New()
	for _, k := range []string{contract.RedisUsernameKey, contract.RedisSecretKey, contract.RedisSentinelUsernameKey, contract.RedisSentinelSecretKey} {
		v, ok := data[k]
		h.Write([]byte(k + "=" + strconv.FormatBool(ok) + ":" + strconv.Itoa(len(v)) + ":"))
		h.Write(v)
	}
	// Any other key makes it differ too: the Secret holds exactly these.
	h.Write([]byte(strconv.Itoa(len(data))))
	return hex.EncodeToString(h.Sum(nil))
}

// slimSecret is the Secrets cache's transform: a Secret is kept as its name, labels, type,
// immutability, version and data digest, not its data, annotations or managed fields.
func slimSecret(obj any) (any, error) {
	s, ok := obj.(*corev1.Secret)
	if !ok {
		return obj, nil
	}
	out := &corev1.Secret{
		TypeMeta: s.TypeMeta,
		ObjectMeta: metav1.ObjectMeta{
			Name: s.Name, Namespace: s.Namespace, UID: s.UID, ResourceVersion: s.ResourceVersion,
			Annotations: map[string]string{secretDigestAnnotation: dataDigest(s.Data)},
		},
		Type: s.Type, Immutable: s.Immutable,
	}
	if v, ok := s.Labels[ManagedByLabel]; ok {
		out.Labels = map[string]string{ManagedByLabel: v}
	}
	return out, nil
}

func (r *TenantACLReconciler) secretReader() client.Reader {
	if r.secrets != nil {
		return r.secrets
	}
	return r.Client
}

// passwordKey reads the key passwords are derived from, creating it on first use. Replicas
// racing to create it agree: the loser reads the winner's.
func (r *TenantACLReconciler) passwordKey(ctx context.Context) ([]byte, error) {
	r.keyMu.Lock()
	defer r.keyMu.Unlock()
	if r.key != nil {
		return r.key, nil
	}
	for range 2 {
		var s corev1.Secret
		err := r.APIReader.Get(ctx, r.KeySecret, &s)
		if err == nil {
			k := s.Data["key"]
			if len(k) < 32 {
				return nil, fmt.Errorf("secret %s: key %q holds %d bytes, want at least 32", r.KeySecret, "key", len(k))
			}
			r.key = k
			return k, nil
		}
		if !apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("reading secret %s: %w", r.KeySecret, err)
		}
		k := make([]byte, 32)
		if _, err := rand.Read(k); err != nil {
			return nil, fmt.Errorf("making the redis password key: %w", err)
		}
		err = r.Client.Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{
				Name: r.KeySecret.Name, Namespace: r.KeySecret.Namespace,
				Labels: map[string]string{ManagedByLabel: ManagedByValue},
			},
			Type: corev1.SecretTypeOpaque, Data: map[string][]byte{"key": k},
		})
		if err == nil {
			r.key = k
			return k, nil
		}
		if !apierrors.IsAlreadyExists(err) {
			return nil, fmt.Errorf("creating secret %s: %w", r.KeySecret, err)
		}
	}
	return nil, fmt.Errorf("secret %s: created and gone again", r.KeySecret)
}

// setCondition writes the TenantIsolation condition on every policy of ns where it changed.
func (r *TenantACLReconciler) setCondition(ctx context.Context, ns string, status metav1.ConditionStatus, reason, msg string) error {
	list := newPolicyList()
	if err := r.Policies.List(ctx, list, client.InNamespace(ns)); err != nil {
		return fmt.Errorf("listing policies of %s: %w", ns, err)
	}
	var errs []error
	for i := range list.Items {
		p, err := decodePolicy(&list.Items[i])
		if err != nil {
			continue // the namespace reconciler reports it Undecodable
		}
		if _, _, err := setPolicyCondition(ctx, r.Client, p, metav1.Condition{
			Type: v1alpha1.ConditionTenantIsolation, Status: status, Reason: reason, Message: msg,
		}); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (r *TenantACLReconciler) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

func (r *TenantACLReconciler) rotation() time.Duration {
	if r.Rotation > 0 {
		return r.Rotation
	}
	return 24 * time.Hour
}

func (r *TenantACLReconciler) redisTimeout() time.Duration {
	if r.RedisTimeout > 0 {
		return r.RedisTimeout
	}
	return 5 * time.Second
}

func (r *TenantACLReconciler) maxBackoff() time.Duration {
	if r.MaxBackoff > 0 {
		return r.MaxBackoff
	}
	return 30 * time.Second
}

// ProbeTenantACL says whether every Redis node answers ACL commands (for --redis-tenant-acl=required).
func ProbeTenantACL(ctx context.Context, nodes func(ctx context.Context, fn func(context.Context, *redis.Client) error) error) error {
	return nodes(ctx, func(ctx context.Context, c *redis.Client) error {
		return redisacl.Probe(ctx, []redisacl.Node{c})
	})
}

// SetupWithManager registers the reconciler: policy events and events on the namespaces'
// credentials Secrets (a tenant edited or deleted one) map to a namespace request. Secrets are
// watched through a cache of their own that holds only Secrets named SecretName, without their
// data (slimSecret), so the manager neither caches the cluster's other Secrets nor holds what
// a tenant put in its own.
func (r *TenantACLReconciler) SetupWithManager(mgr ctrl.Manager) error {
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
	if err := mgr.Add(&redisRestartWatcher{targets: r.allTargets, interval: r.checkInterval(), timeout: r.redisTimeout(), events: restarts, gen: &r.restartGen}); err != nil {
		return fmt.Errorf("adding the redis restart watcher: %w", err)
	}
	b := ctrl.NewControllerManagedBy(mgr).
		Named("tenantacl").
		Watches(newPolicyObject(), handler.EnqueueRequestsFromMapFunc(tenantRequest),
			builder.WithPredicates(predicate.Funcs{
				// A policy's own changes do not change its namespace's user; its coming and going do.
				UpdateFunc: func(event.UpdateEvent) bool { return false },
			})).
		WatchesRawSource(source.Kind(secrets, client.Object(&corev1.Secret{}), handler.EnqueueRequestsFromMapFunc(tenantRequest))).
		WatchesRawSource(source.Channel(restarts, handler.EnqueueRequestsFromMapFunc(r.allNamespaces)))
	if r.Backends != nil {
		// A backend dialed, replaced or removed, or a namespace moved to another.
		b = b.WatchesRawSource(source.Channel(r.Backends.Subscribe(), handler.EnqueueRequestsFromMapFunc(r.allNamespaces)))
	}
	b = b.WithOptions(controller.Options{
		RateLimiter: workqueue.NewTypedItemExponentialFailureRateLimiter[reconcile.Request](200*time.Millisecond, r.maxBackoff()),
	})
	return b.Complete(r)
}

// allNamespaces is a request for every namespace with policies.
func (r *TenantACLReconciler) allNamespaces(ctx context.Context, _ client.Object) []reconcile.Request {
	list := newPolicyList()
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

func (r *TenantACLReconciler) checkInterval() time.Duration {
	if r.CheckInterval > 0 {
		return r.CheckInterval
	}
	return DefaultCheckInterval
}

// userRecheck is how long a namespace's ACL SETUSER on every node is taken to hold without a
// restart or a new rotation period: it bounds what a tenant's edits of its Secret cost Redis.
const userRecheck = 10 * time.Second

// redisRestartWatcher reads every node's run_id on a period and sends an event when one
// changed (a restart or a new node): ACL users live in memory, so a restarted node has none
// until they are set again, and sidecars dialing it meet WRONGPASS meanwhile.
type redisRestartWatcher struct {
	targets  func() []redisTarget
	interval time.Duration
	timeout  time.Duration
	events   chan<- event.GenericEvent
	gen      *atomic.Uint64 // counts the restarts seen (TenantACLReconciler.restartGen)
	last     map[string]string
}

// Start runs until ctx ends; it implements manager.Runnable (leader only).
//
// The first read is at once, not one interval later, and reports every node it finds as
// new: it is what later reads are compared with, and a node that restarted (or that the
// reconciles at start did not list) before a later first read would have its run_id taken as
// one that holds the users. Its users would then be set again only at the next rotation
// period, every sidecar on it meeting WRONGPASS until then (test/failover measured it: a Redis
// restarted 4 s after the manager, at a 10 s interval, refused the namespace's user for the
// rest of the window; three replicas of a cluster the manager had just joined refused it for
// a minute).
func (w *redisRestartWatcher) Start(ctx context.Context) error {
	w.check(ctx)
	t := time.NewTicker(w.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			w.check(ctx)
		}
	}
}

func (w *redisRestartWatcher) check(ctx context.Context) {
	cctx, cancel := context.WithTimeout(ctx, w.timeout)
	defer cancel()
	var mu sync.Mutex
	ids := map[string]string{}
	var wg sync.WaitGroup
	for _, t := range w.targets() {
		wg.Go(func() {
			_ = t.nodes(cctx, func(ctx context.Context, c *redis.Client) error {
				info, err := c.Info(ctx, "server").Result()
				if err != nil {
					return err
				}
				for line := range strings.SplitSeq(info, "\n") {
					if id, ok := strings.CutPrefix(strings.TrimSpace(line), "run_id:"); ok {
						mu.Lock()
						ids[t.id+"|"+c.Options().Addr] = id
						mu.Unlock()
					}
				}
				return nil
			})
		})
	}
	wg.Wait()
	changed := false
	for addr, id := range ids {
		if prev, ok := w.last[addr]; !ok || prev != id {
			changed = true
		}
	}
	// The first read counts as a change too (every node is new to it): the reconciles at
	// start may have listed fewer nodes than there are (a cluster client's slot map, or the
	// sentinels' replica list, not yet complete), and a node they missed would otherwise be
	// taken as one that holds the users. One more ACL SETUSER per namespace and node at start
	// buys that no node is left without them.
	if w.last == nil {
		w.last = map[string]string{}
	}
	maps.Copy(w.last, ids)
	if changed {
		if w.gen != nil {
			w.gen.Add(1)
		}
		select {
		case w.events <- event.GenericEvent{}:
		case <-ctx.Done():
		}
	}
}

func tenantRequest(_ context.Context, o client.Object) []reconcile.Request {
	return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: o.GetNamespace(), Name: "tenant-acl"}}}
}

// ensureSidecarScripts loads, on every master, the scripts a sidecar runs besides the
// algorithms (the lease return, the heartbeat) where SCRIPT EXISTS says they are missing.
func ensureSidecarScripts(ctx context.Context, c redis.UniversalClient) error {
	var extra []scripts.Script
	for _, sc := range redisacl.SidecarScripts() {
		if _, ok := scripts.For(sc.Name); !ok {
			extra = append(extra, sc)
		}
	}
	shas := make([]string, len(extra))
	for i, sc := range extra {
		shas[i] = sc.SHA
	}
	load := func(ctx context.Context, node redis.UniversalClient) error {
		exists, err := node.ScriptExists(ctx, shas...).Result()
		if err != nil {
			return fmt.Errorf("checking scripts: %w", err)
		}
		for i, ok := range exists {
			if ok {
				continue
			}
			if err := node.ScriptLoad(ctx, extra[i].Source).Err(); err != nil {
				return fmt.Errorf("loading script %s: %w", extra[i].Name, err)
			}
		}
		return nil
	}
	if cc, ok := c.(*redis.ClusterClient); ok {
		return cc.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error {
			if err := load(ctx, node); err != nil {
				return fmt.Errorf("on %s: %w", node.Options().Addr, err)
			}
			return nil
		})
	}
	return load(ctx, c)
}

// TenantACLConfig wires the tenant ACL reconciler (see SetupTenantACL).
type TenantACLConfig struct {
	// Mode is TenantACLAuto, TenantACLRequired or TenantACLOff.
	Mode string
	// Nodes runs a function on every Redis node (redisconn.Nodes.Each).
	Nodes func(ctx context.Context, fn func(context.Context, *redis.Client) error) error
	// Sentinels runs a function on every sentinel (redisconn.Nodes.EachSentinel); nil
	// without Sentinel.
	Sentinels func(ctx context.Context, fn func(context.Context, *redis.Client) error) error
	// Backends, when set, replaces Nodes and Sentinels (see TenantACLReconciler.Backends).
	Backends *Backends
	// SecretName is the credentials Secret of each namespace (the injector's).
	SecretName string
	// KeySecret holds the key passwords are derived from, in the manager's namespace.
	KeySecret types.NamespacedName
	// Rotation, RedisTimeout, MaxBackoff and CheckInterval: see TenantACLReconciler.
	Rotation, RedisTimeout, MaxBackoff, CheckInterval time.Duration
}

// SetupTenantACL adds the tenant ACL reconciler to mgr.
func SetupTenantACL(mgr ctrl.Manager, cfg TenantACLConfig) error {
	switch cfg.Mode {
	case TenantACLAuto, TenantACLRequired, TenantACLOff:
	default:
		return fmt.Errorf("--redis-tenant-acl=%q: want auto, required or off", cfg.Mode)
	}
	if cfg.SecretName == "" && cfg.Mode != TenantACLOff {
		return errors.New("tenant ACLs need the sidecars' credentials Secret name (--sidecar-redis-secret)")
	}
	r := &TenantACLReconciler{
		Client: mgr.GetClient(), Policies: mgr.GetCache(), APIReader: mgr.GetAPIReader(),
		Nodes: cfg.Nodes, Sentinels: cfg.Sentinels, Backends: cfg.Backends, Mode: cfg.Mode, SecretName: cfg.SecretName, KeySecret: cfg.KeySecret,
		Rotation: cfg.Rotation, RedisTimeout: cfg.RedisTimeout, MaxBackoff: cfg.MaxBackoff,
		CheckInterval: cfg.CheckInterval,
	}
	return r.SetupWithManager(mgr)
}
