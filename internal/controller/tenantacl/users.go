package tenantacl

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redline-dev/redline/internal/backend"
	"github.com/redline-dev/redline/internal/controller/loop"
	"github.com/redline-dev/redline/internal/redisacl"
	"github.com/redline-dev/redline/internal/redisconn"
)

// redisTarget is one Redis a namespace's user is set on: its nodes and sentinels.
type redisTarget struct {
	id, describe string
	nodes        backend.NodeFunc
	sentinels    backend.NodeFunc
	// plaintext: reached without TLS (its URL is not rediss:// or rediss+sentinel://).
	plaintext bool
}

// targetOf is the Redis of ns, and the other backends, from which its user is removed.
func (r *Reconciler) targetOf(ctx context.Context, ns string) (redisTarget, []redisTarget, error) {
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

func backendTarget(be *backend.Backend) redisTarget {
	return redisTarget{id: be.ID(), describe: be.Describe(), nodes: be.Nodes, sentinels: be.Sentinels, plaintext: !redisconn.URLUsesTLS(be.URL)}
}

// allTargets are every Redis the manager has clients for.
func (r *Reconciler) allTargets() []redisTarget {
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
	addrs   []string // the nodes' addresses, sorted
	open    []string // redisacl.OpenUsers then
	// missed counts the reconciles in a row whose listing left out nodes the restart
	// watcher reads (Reconciler.relistDelay).
	missed int
}

// nodeAddrs are the addresses of nodes (collectNodes's), sorted, as the restart watcher
// reports them.
func nodeAddrs(nodes []redisacl.Node) []string {
	out := make([]string, 0, len(nodes))
	for _, n := range nodes {
		if c, ok := n.(*redis.Client); ok {
			out = append(out, c.Options().Addr)
		}
	}
	slices.Sort(out)
	return out
}

// unlisted are the addresses of seen that are not in set (both sorted).
func unlisted(seen, set []string) []string {
	var out []string
	for _, a := range seen {
		if _, ok := slices.BinarySearch(set, a); !ok {
			out = append(out, a)
		}
	}
	return out
}

// appliedUser returns the namespace's last ACL SETUSER, and whether it still holds: the same
// period and restart generation, less than userRecheck ago.
func (r *Reconciler) appliedUser(ns, backendID string, period int64, gen uint64, now time.Time) (appliedUser, bool) {
	r.appliedMu.Lock()
	defer r.appliedMu.Unlock()
	a, ok := r.applied[ns]
	return a, ok && a.backend == backendID && a.period == period && a.gen == gen && now.Sub(a.at) < userRecheck
}

// lastApplied is the namespace's last successful ACL SETUSER, however old.
func (r *Reconciler) lastApplied(ns string) (appliedUser, bool) {
	r.appliedMu.Lock()
	defer r.appliedMu.Unlock()
	a, ok := r.applied[ns]
	return a, ok
}

func (r *Reconciler) setAppliedUser(ns string, a appliedUser) {
	r.appliedMu.Lock()
	defer r.appliedMu.Unlock()
	if r.applied == nil {
		r.applied = map[string]appliedUser{}
	}
	r.applied[ns] = a
}

func (r *Reconciler) forgetAppliedUser(ns string) {
	r.appliedMu.Lock()
	defer r.appliedMu.Unlock()
	delete(r.applied, ns)
}

func collectNodes(ctx context.Context, each backend.NodeFunc) ([]redisacl.Node, error) {
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
func (r *Reconciler) cleanup(ctx context.Context, ns string) error {
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
	if apierrors.IsNotFound(err) || (err == nil && s.Labels[loop.ManagedByLabel] != loop.ManagedByValue) {
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

// userRecheck is how long a namespace's ACL SETUSER on every node is taken to hold without a
// restart or a new rotation period: it bounds what a tenant's edits of its Secret cost Redis.
const userRecheck = 10 * time.Second
