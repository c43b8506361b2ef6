package controller

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"

	v1alpha1 "github.com/redline-dev/redline/api/v1alpha1"
	"github.com/redline-dev/redline/internal/connbudget"
	"github.com/redline-dev/redline/internal/redisconn"
	"github.com/redline-dev/redline/internal/webhook/podinject"
)

// Why namespaces can have a Redis of their own.
//
// Redis has no per-user bound on CPU or memory: a tenant calling the commands its user is
// granted on huge keys of its own (HGETALL of millions of fields, DEL without lazy freeing)
// blocks every other tenant's scripts for as long, and its writes share one maxmemory. Past
// what the scripts and ACL users bound, the remedy is a Redis of its own. A RedisBackend names
// one (a URL and the admin's credentials) and selects namespaces by their Namespace objects'
// labels, which a tenant does not set; everything the manager keeps per Redis follows the
// namespace's backend: the scripts, the namespace's ACL user and Secret, the heartbeats read for
// Enforced, the connection budget, the memory policy check, the metrics, and the URL the
// injector gives its pods. A namespace no backend selects uses the manager's own Redis.

// NodeFunc runs fn on every node of a Redis (redisconn.Nodes.Each, EachSentinel).
type NodeFunc = func(ctx context.Context, fn func(context.Context, *redis.Client) error) error

// DefaultBackendLabel is the backend label of the manager's own Redis in metrics.
const DefaultBackendLabel = "default"

// Backend is one Redis and what the manager keeps for it.
type Backend struct {
	// Name is the RedisBackend's name; "" is the manager's own Redis (--redis-url).
	Name string
	// URL is what the injector gives the sidecars of the namespaces it serves; "" for the
	// manager's own Redis leaves the injector's --sidecar-redis-url.
	URL string
	// Client is the manager's client (standalone, cluster or Sentinel).
	Client redis.UniversalClient
	// Nodes runs a function on every node, replicas included.
	Nodes NodeFunc
	// Sentinels runs a function on every sentinel as the admin; nil without Sentinel.
	Sentinels NodeFunc
	// MaxClients, when positive, is the backend's maxclients (a Redis refusing CONFIG GET).
	MaxClients int64
	// Budget is the backend's connection budget, for the injector to size pools from.
	Budget *connbudget.Publisher

	// Scripts and Sidecars are the backend's script store and heartbeat reader.
	Scripts  *RedisScripts
	Sidecars *RedisSidecars

	// digest identifies the configuration it was dialed with: a RedisBackend whose URL,
	// credentials or maxClients change is dialed again.
	digest string
	close  func() error
}

// Label is the backend's value of the backend label in metrics.
func (b *Backend) Label() string {
	if b.Name == "" {
		return DefaultBackendLabel
	}
	return b.Name
}

// id tells a backend apart from the one it replaced.
func (b *Backend) id() string { return b.Name + "/" + b.digest }

// describe names the backend in conditions and logs.
func (b *Backend) describe() string {
	if b.Name == "" {
		return "the manager's Redis"
	}
	return "RedisBackend " + b.Name
}

// NewBackend wraps clients the caller built into a Backend; heartbeatTTL is the sidecars'.
// closeFn, if set, is called when the backend is replaced or removed.
func NewBackend(name, url string, c redis.UniversalClient, nodes, sentinels NodeFunc, maxClients int64, heartbeatTTL time.Duration, closeFn func() error) *Backend {
	if nodes == nil {
		nodes = func(ctx context.Context, fn func(context.Context, *redis.Client) error) error {
			if cc, ok := c.(*redis.ClusterClient); ok {
				return cc.ForEachShard(ctx, fn)
			}
			rc, ok := c.(*redis.Client)
			if !ok {
				return fmt.Errorf("no node list for a %T", c)
			}
			return fn(ctx, rc)
		}
	}
	return &Backend{
		Name: name, URL: url, Client: c, Nodes: nodes, Sentinels: sentinels, MaxClients: maxClients,
		Budget:   &connbudget.Publisher{},
		Scripts:  &RedisScripts{Client: c, Nodes: nodes},
		Sidecars: &RedisSidecars{Client: c, TTL: heartbeatTTL},
		close:    closeFn,
	}
}

// BackendCredentials are the admin's credentials for one Redis.
type BackendCredentials struct {
	Username, Password                 string
	SentinelUsername, SentinelPassword string
}

// DialBackend builds the manager's clients for the RedisBackend name of spec with the admin's
// credentials, as the manager does for its own Redis: a small pool with timeouts of seconds
// (its calls are not on a request path), and with Sentinel a master only a majority of the
// sentinels names, since the admin's password goes to it. With a rediss:// URL it verifies
// the backend's certificates with tls's CA bundle and presents tls's client certificate (the
// manager's --redis-tls-* files), under the backend's own server name and minimum version.
func DialBackend(name string, spec v1alpha1.RedisBackendSpec, creds BackendCredentials, heartbeatTTL time.Duration, tls redisconn.TLSOptions, onTLSError func(error)) (*Backend, error) {
	if redisconn.URLUsesTLS(spec.URL) {
		tls.ServerName = ""
		if t := spec.TLS; t != nil {
			tls.ServerName = t.ServerName
			tls.MinVersion = cmp.Or(t.MinVersion, tls.MinVersion)
		}
	} else {
		tls = redisconn.TLSOptions{}
	}
	opts := redisconn.Options{
		PoolSize: ManagerRedisPoolSize, DialTimeout: 2 * time.Second, ReadTimeout: 2 * time.Second, WriteTimeout: 2 * time.Second,
		PoolTimeout: 3 * time.Second, Username: creds.Username, Password: creds.Password, ClientName: "redline-manager",
		SentinelUsername: creds.SentinelUsername, SentinelPassword: creds.SentinelPassword,
		TLS: tls, TLSFileError: onTLSError,
		VerifyMaster: true,
	}
	c, err := redisconn.NewClient(spec.URL, opts)
	if err != nil {
		return nil, err
	}
	opts.VerifyMaster = false
	nodes, err := redisconn.NewNodes(spec.URL, opts, c)
	if err != nil {
		_ = c.Close()
		return nil, err
	}
	var sentinels NodeFunc
	if nodes.IsSentinel() {
		sentinels = nodes.EachSentinel
	}
	return NewBackend(name, spec.URL, c, nodes.Each, sentinels, spec.MaxClients, heartbeatTTL, func() error {
		return errors.Join(nodes.Close(), c.Close())
	}), nil
}

// Close closes the backend's clients.
func (b *Backend) Close() error {
	if b == nil || b.close == nil {
		return nil
	}
	return b.close()
}

// BackendNotReadyError is the error of a namespace whose RedisBackend the manager has no
// client for yet (its Secret is missing, its URL does not parse): its namespaces are not
// served by any other Redis meanwhile.
type BackendNotReadyError struct{ Name string }

func (e *BackendNotReadyError) Error() string {
	return "RedisBackend " + e.Name + " is not ready (see its Ready condition)"
}

// Backends maps namespaces to the Redis that serves them: the RedisBackend that selects the
// namespace (the oldest, when several do), or the manager's own.
type Backends struct {
	// Default is the manager's own Redis.
	Default *Backend
	// Reader reads RedisBackends and Namespaces (the manager's cache); nil: every namespace
	// is the default's.
	Reader client.Reader

	mu    sync.RWMutex
	named map[string]*Backend
	subs  []chan event.GenericEvent
}

// NewBackends returns the mapping with def for the namespaces no RedisBackend selects.
func NewBackends(def *Backend, reader client.Reader) *Backends {
	return &Backends{Default: def, Reader: reader, named: map[string]*Backend{}}
}

// Assigned returns the RedisBackend that serves ns, or nil for the default. It reads the
// manager's cache, so that every reconciler and the injector agree on it from their first
// call, before any backend is dialed.
func (b *Backends) Assigned(ctx context.Context, ns string) (*v1alpha1.RedisBackend, error) {
	if b == nil || b.Reader == nil {
		return nil, nil
	}
	var list v1alpha1.RedisBackendList
	if err := b.Reader.List(ctx, &list); err != nil {
		return nil, fmt.Errorf("listing redisbackends: %w", err)
	}
	if len(list.Items) == 0 {
		return nil, nil
	}
	var n corev1.Namespace
	if err := b.Reader.Get(ctx, types.NamespacedName{Name: ns}, &n); err != nil {
		return nil, fmt.Errorf("reading namespace %s: %w", ns, err)
	}
	return assignBackend(list.Items, n.Labels), nil
}

// For returns the backend serving ns, or a BackendNotReadyError.
func (b *Backends) For(ctx context.Context, ns string) (*Backend, error) {
	rb, err := b.Assigned(ctx, ns)
	if err != nil || rb == nil {
		return b.Default, err
	}
	b.mu.RLock()
	defer b.mu.RUnlock()
	if be, ok := b.named[rb.Name]; ok {
		return be, nil
	}
	return nil, &BackendNotReadyError{Name: rb.Name}
}

// All returns every backend the manager has clients for, the default first.
func (b *Backends) All() []*Backend {
	b.mu.RLock()
	defer b.mu.RUnlock()
	out := make([]*Backend, 0, 1+len(b.named))
	if b.Default != nil {
		out = append(out, b.Default)
	}
	for _, name := range slicesSortedKeys(b.named) {
		out = append(out, b.named[name])
	}
	return out
}

// Each runs fn on every backend at once and joins their errors: a backend that hangs delays
// no other's work by more than its own timeout.
func (b *Backends) Each(ctx context.Context, fn func(context.Context, *Backend) error) error {
	all := b.All()
	errs := make([]error, len(all))
	var wg sync.WaitGroup
	for i, be := range all {
		wg.Go(func() {
			if err := fn(ctx, be); err != nil {
				errs[i] = fmt.Errorf("%s: %w", be.describe(), err)
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// Subscribe returns a channel that receives an event whenever a backend is added, replaced or
// removed (buffered: changes while the receiver is busy make one event).
func (b *Backends) Subscribe() <-chan event.GenericEvent {
	b.mu.Lock()
	defer b.mu.Unlock()
	ch := make(chan event.GenericEvent, 1)
	b.subs = append(b.subs, ch)
	return ch
}

func (b *Backends) notifyLocked() {
	for _, ch := range b.subs {
		select {
		case ch <- event.GenericEvent{Object: &corev1.Namespace{}}:
		default:
		}
	}
}

// put installs be under its name and closes the backend it replaces.
func (b *Backends) put(be *Backend) {
	b.mu.Lock()
	old := b.named[be.Name]
	b.named[be.Name] = be
	b.notifyLocked()
	b.mu.Unlock()
	if old != nil {
		_ = old.Close()
	}
}

// remove drops and closes the named backend.
func (b *Backends) remove(name string) {
	b.mu.Lock()
	old, ok := b.named[name]
	delete(b.named, name)
	if ok {
		b.notifyLocked()
	}
	b.mu.Unlock()
	if old != nil {
		_ = old.Close()
	}
}

func (b *Backends) get(name string) *Backend {
	b.mu.RLock()
	defer b.mu.RUnlock()
	return b.named[name]
}

func (b *Backends) names() []string {
	b.mu.RLock()
	defer b.mu.RUnlock()
	return slicesSortedKeys(b.named)
}

// assignBackend is the backend serving a namespace of labels nsLabels: of those whose
// selector matches, the oldest (by creation, then name), so that a backend created later with
// an overlapping selector moves no namespace. nil: the default.
func assignBackend(backends []v1alpha1.RedisBackend, nsLabels map[string]string) *v1alpha1.RedisBackend {
	var best *v1alpha1.RedisBackend
	for i := range backends {
		rb := &backends[i]
		if rb.DeletionTimestamp != nil || !selects(rb, nsLabels) {
			continue
		}
		if best == nil || olderBackend(rb, best) {
			best = rb
		}
	}
	return best
}

func olderBackend(a, b *v1alpha1.RedisBackend) bool {
	if c := a.CreationTimestamp.Compare(b.CreationTimestamp.Time); c != 0 {
		return c < 0
	}
	return a.Name < b.Name
}

// selects says whether rb's selector matches: an empty or invalid selector matches nothing
// (the API server refuses an empty one; an invalid one is reported on rb).
func selects(rb *v1alpha1.RedisBackend, nsLabels map[string]string) bool {
	sel := rb.Spec.NamespaceSelector
	if len(sel.MatchLabels) == 0 && len(sel.MatchExpressions) == 0 {
		return false
	}
	s, err := metav1.LabelSelectorAsSelector(&sel)
	return err == nil && s.Matches(labels.Set(nsLabels))
}

func slicesSortedKeys[V any](m map[string]V) []string { return slices.Sorted(maps.Keys(m)) }

// Redis implements podinject.BackendResolver: the URL the sidecars of ns are given, its
// backend's connection budget and TLS names. A namespace a RedisBackend selects gets that
// backend's URL even before the manager has dialed it (its pods then wait for their Redis user
// there), never the manager's Redis.
func (b *Backends) Redis(ctx context.Context, ns string) (podinject.NamespaceRedis, error) {
	rb, err := b.Assigned(ctx, ns)
	switch {
	case err != nil:
		return podinject.NamespaceRedis{}, err
	case rb == nil && b.Default == nil:
		return podinject.NamespaceRedis{}, nil
	case rb == nil:
		return podinject.NamespaceRedis{URL: b.Default.URL, Budget: b.Default.Budget}, nil
	}
	nr := podinject.NamespaceRedis{URL: rb.Spec.URL, Backend: true}
	if t := rb.Spec.TLS; t != nil {
		nr.TLSServerName, nr.TLSMinVersion = t.ServerName, t.MinVersion
	}
	if be := b.get(rb.Name); be != nil {
		nr.Budget = be.Budget
	}
	return nr, nil
}
