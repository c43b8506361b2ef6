package backend

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"

	v1alpha1 "github.com/redline-dev/redline/api/v1alpha1"
	"github.com/redline-dev/redline/internal/connbudget"
)

// Registry maps namespaces to the Redis that serves them: the RedisBackend that selects the
// namespace (the oldest, when several do), or the manager's own.
type Registry struct {
	// Default is the manager's own Redis.
	Default *Backend
	// Reader reads RedisBackends and Namespaces (the manager's cache); nil: every namespace
	// is the default's.
	Reader client.Reader

	mu    sync.RWMutex
	named map[string]*Backend
	subs  []chan event.GenericEvent
}

// NewRegistry returns the mapping with def for the namespaces no RedisBackend selects.
func NewRegistry(def *Backend, reader client.Reader) *Registry {
	return &Registry{Default: def, Reader: reader, named: map[string]*Backend{}}
}

// Assigned returns the RedisBackend that serves ns, or nil for the default. It reads the
// manager's cache, so that every reconciler and the injector agree on it from their first
// call, before any backend is dialed.
func (b *Registry) Assigned(ctx context.Context, ns string) (*v1alpha1.RedisBackend, error) {
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
	return Assign(list.Items, n.Labels), nil
}

// For returns the backend serving ns, or a NotReadyError.
func (b *Registry) For(ctx context.Context, ns string) (*Backend, error) {
	rb, err := b.Assigned(ctx, ns)
	if err != nil || rb == nil {
		return b.Default, err
	}
	b.mu.RLock()
	defer b.mu.RUnlock()
	if be, ok := b.named[rb.Name]; ok {
		return be, nil
	}
	return nil, &NotReadyError{Name: rb.Name}
}

// All returns every backend the manager has clients for, the default first.
func (b *Registry) All() []*Backend {
	b.mu.RLock()
	defer b.mu.RUnlock()
	out := make([]*Backend, 0, 1+len(b.named))
	if b.Default != nil {
		out = append(out, b.Default)
	}
	for _, name := range SortedKeys(b.named) {
		out = append(out, b.named[name])
	}
	return out
}

// Each runs fn on every backend at once and joins their errors: a backend that hangs delays
// no other's work by more than its own timeout.
func (b *Registry) Each(ctx context.Context, fn func(context.Context, *Backend) error) error {
	all := b.All()
	errs := make([]error, len(all))
	var wg sync.WaitGroup
	for i, be := range all {
		wg.Go(func() {
			if err := fn(ctx, be); err != nil {
				errs[i] = fmt.Errorf("%s: %w", be.Describe(), err)
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// Subscribe returns a channel that receives an event whenever a backend is added, replaced or
// removed (buffered: changes while the receiver is busy make one event).
func (b *Registry) Subscribe() <-chan event.GenericEvent {
	b.mu.Lock()
	defer b.mu.Unlock()
	ch := make(chan event.GenericEvent, 1)
	b.subs = append(b.subs, ch)
	return ch
}

// Notify tells the subscribers that backends changed, or namespaces moved between them.
func (b *Registry) Notify() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.notifyLocked()
}

func (b *Registry) notifyLocked() {
	for _, ch := range b.subs {
		select {
		case ch <- event.GenericEvent{Object: &corev1.Namespace{}}:
		default:
		}
	}
}

// Put installs be under its name and closes the backend it replaces.
func (b *Registry) Put(be *Backend) {
	b.mu.Lock()
	old := b.named[be.Name]
	b.named[be.Name] = be
	b.notifyLocked()
	b.mu.Unlock()
	if old != nil {
		_ = old.Close()
	}
}

// Remove drops and closes the named backend.
func (b *Registry) Remove(name string) {
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

// Get is the named backend, nil if it has not been dialed.
func (b *Registry) Get(name string) *Backend {
	b.mu.RLock()
	defer b.mu.RUnlock()
	return b.named[name]
}

// Names are the RedisBackends dialed, sorted.
func (b *Registry) Names() []string {
	b.mu.RLock()
	defer b.mu.RUnlock()
	return SortedKeys(b.named)
}

// Assign is the backend serving a namespace of labels nsLabels: of those whose
// selector matches, the oldest (by creation, then name), so that a backend created later with
// an overlapping selector moves no namespace. nil: the default.
func Assign(backends []v1alpha1.RedisBackend, nsLabels map[string]string) *v1alpha1.RedisBackend {
	var best *v1alpha1.RedisBackend
	for i := range backends {
		rb := &backends[i]
		if rb.DeletionTimestamp != nil || !Selects(rb, nsLabels) {
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

// Selects says whether rb's selector matches: an empty or invalid selector matches nothing
// (the API server refuses an empty one; an invalid one is reported on rb).
func Selects(rb *v1alpha1.RedisBackend, nsLabels map[string]string) bool {
	sel := rb.Spec.NamespaceSelector
	if len(sel.MatchLabels) == 0 && len(sel.MatchExpressions) == 0 {
		return false
	}
	s, err := metav1.LabelSelectorAsSelector(&sel)
	return err == nil && s.Matches(labels.Set(nsLabels))
}

// SortedKeys are m's keys in order.
func SortedKeys[V any](m map[string]V) []string { return slices.Sorted(maps.Keys(m)) }

// NamespaceRedis is the Redis that serves a namespace, as the pod injector gives it to the
// namespace's sidecars.
type NamespaceRedis struct {
	// URL is what its sidecars are given ("": the injector's --sidecar-redis-url).
	URL string
	// Budget is its connection budget (nil: pools are not sized from a budget).
	Budget *connbudget.Publisher
	// Backend says it is a RedisBackend's, whose TLSServerName (empty: the host dialed) and
	// TLSMinVersion (empty: --sidecar-redis-tls-min-version) replace the sidecar defaults,
	// which are the manager's Redis's.
	Backend                      bool
	TLSServerName, TLSMinVersion string
}

// Redis implements podinject.BackendResolver: the URL the sidecars of ns are given, its
// backend's connection budget and TLS names. A namespace a RedisBackend selects gets that
// backend's URL even before the manager has dialed it (its pods then wait for their Redis user
// there), never the manager's Redis.
func (b *Registry) Redis(ctx context.Context, ns string) (NamespaceRedis, error) {
	rb, err := b.Assigned(ctx, ns)
	switch {
	case err != nil:
		return NamespaceRedis{}, err
	case rb == nil && b.Default == nil:
		return NamespaceRedis{}, nil
	case rb == nil:
		return NamespaceRedis{URL: b.Default.URL, Budget: b.Default.Budget}, nil
	}
	nr := NamespaceRedis{URL: rb.Spec.URL, Backend: true}
	if t := rb.Spec.TLS; t != nil {
		nr.TLSServerName, nr.TLSMinVersion = t.ServerName, t.MinVersion
	}
	if be := b.Get(rb.Name); be != nil {
		nr.Budget = be.Budget
	}
	return nr, nil
}
