package topkeysstatus

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redline-dev/redline/api/v1alpha1"
	"github.com/redline-dev/redline/internal/backend"
	"github.com/redline-dev/redline/internal/controller/loop"
	"github.com/redline-dev/redline/internal/fleet"
)

// Bounds of the top-keys writer: how often and how much status it writes.
const (
	// DefaultInterval is how often the sidecars' summaries are read into status: the
	// sidecars' heartbeat interval, at which they publish.
	DefaultInterval = fleet.DefaultInterval
	// DefaultNamespaceWrites is the most policies' status one pass writes per
	// namespace: a namespace with hundreds of policies has them written in turn, the least
	// recently written first, never more often than this per interval.
	DefaultNamespaceWrites = 16
	// DefaultWrites is the most status writes of one pass, all namespaces together.
	DefaultWrites = 64
)

// Writer merges what the sidecars publish of their top keys (fleet.ReadSummaries)
// into the policies' status.rules, once per Interval, within a bound of writes per namespace
// and in all. It runs on the elected manager only.
type Writer struct {
	Client client.Client
	// Policies reads the policies (the manager's cache).
	Policies client.Reader
	// Direct reads a policy afresh when a write of its conditions met a newer version (the
	// manager's API reader); nil: Policies.
	Direct client.Reader
	// Backends gives each namespace's sidecar reports.
	Backends *backend.Registry
	// Interval between passes (default DefaultInterval).
	Interval time.Duration
	// NamespaceWrites and Writes bound a pass's status writes (defaults
	// DefaultNamespaceWrites, DefaultWrites).
	NamespaceWrites, Writes int
	// RedisTimeout bounds one namespace's reading (default 5s, never more than 1s).
	RedisTimeout time.Duration
	Log          logr.Logger
	// Now is the clock (time.Now).
	Now func() time.Time

	mu sync.Mutex
	// merged is the newest summary stamp merged into each policy's candidate totals, and
	// written when its status was last written (least recently written first).
	merged  map[types.NamespacedName]int64
	written map[types.NamespacedName]time.Time
}

// NeedLeaderElection says the writer runs on the elected manager only: status has one writer.
func (w *Writer) NeedLeaderElection() bool { return true }

// Start runs passes until ctx ends.
func (w *Writer) Start(ctx context.Context) error {
	interval := cmp.Or(w.Interval, DefaultInterval)
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			w.Pass(ctx)
		}
	}
}

// Pass reads every namespace's summaries once and writes the status of the policies whose
// counts changed, within the bounds. It returns how many statuses it wrote, by namespace.
func (w *Writer) Pass(ctx context.Context) map[string]int {
	var list v1alpha1.RateLimitPolicyList
	if err := w.Policies.List(ctx, &list); err != nil {
		w.Log.Info("top keys: policies not listed", "error", err.Error())
		return nil
	}
	byNS := map[string][]*v1alpha1.RateLimitPolicy{}
	var namespaces []string
	for i := range list.Items {
		p := &list.Items[i]
		if _, ok := byNS[p.Namespace]; !ok {
			namespaces = append(namespaces, p.Namespace)
		}
		byNS[p.Namespace] = append(byNS[p.Namespace], p)
	}
	slices.Sort(namespaces)
	w.mu.Lock()
	if w.merged == nil {
		w.merged, w.written = map[types.NamespacedName]int64{}, map[types.NamespacedName]time.Time{}
	}
	w.prune(list.Items)
	w.mu.Unlock()
	total := cmp.Or(w.Writes, DefaultWrites)
	wrote := 0
	out := map[string]int{}
	// Namespaces in turn too: the bound in all must not always spend itself on the first.
	slices.SortStableFunc(namespaces, func(a, b string) int {
		return w.oldest(byNS[a]).Compare(w.oldest(byNS[b]))
	})
	for _, ns := range namespaces {
		if wrote >= total {
			break
		}
		n := w.namespace(ctx, ns, byNS[ns], total-wrote)
		wrote += n
		if n > 0 {
			out[ns] = n
		}
	}
	return out
}

// namespace writes the status of at most left policies of ns (and NamespaceWrites), the
// least recently written first.
func (w *Writer) namespace(ctx context.Context, ns string, policies []*v1alpha1.RateLimitPolicy, left int) int {
	be, err := w.Backends.For(ctx, ns)
	if err != nil || be == nil || be.Sidecars == nil {
		return 0 // the namespace reconciler reports a backend it cannot reach
	}
	names := make([]string, len(policies))
	for i, p := range policies {
		names[i] = p.Name
	}
	// At most a second, whatever RedisTimeout: the manager's pool is small (backend.ManagerPoolSize)
	// and the reading can wait for the next pass, while a script check after a failover cannot
	// wait for a connection this holds on a master that is gone.
	rctx, cancel := context.WithTimeout(ctx, min(backend.Timeout(w.RedisTimeout), time.Second))
	groups := be.Sidecars.TopKeys(rctx, ns, names)
	cancel()
	now := time.Now()
	if w.Now != nil {
		now = w.Now()
	}
	type change struct {
		p    *v1alpha1.RateLimitPolicy
		st   topKeysStatus
		cond *metav1.Condition // the TopKeys condition, when it changes
	}
	var changes []change
	for i, p := range policies {
		g := groups[i]
		if g.Err != nil {
			if !errors.Is(g.Err, context.Canceled) {
				w.Log.V(1).Info("top keys not read", "namespace", ns, "policy", p.Name, "error", g.Err.Error())
			}
			continue
		}
		if g.Invalid > 0 {
			w.Log.V(1).Info("top-keys summaries not decoded", "namespace", ns, "policy", p.Name, "invalid", g.Invalid, "error", g.InvalidErr.Error())
		}
		key := types.NamespacedName{Namespace: ns, Name: p.Name}
		w.mu.Lock()
		merged := w.merged[key]
		w.mu.Unlock()
		if len(g.Summaries) == 0 && idle(p.Status) {
			continue
		}
		st := mergeTopKeys(p, g, merged, now)
		cond := topKeysCondition(p, g)
		if sameTopKeys(p.Status, st) && cond == nil {
			continue
		}
		changes = append(changes, change{p, st, cond})
	}
	slices.SortStableFunc(changes, func(a, b change) int { return w.when(a.p).Compare(w.when(b.p)) })
	n := min(len(changes), left, cmp.Or(w.NamespaceWrites, DefaultNamespaceWrites))
	wrote := 0
	for _, c := range changes[:n] {
		if err := w.write(ctx, c.p, c.st, c.cond); err != nil {
			w.Log.Info("top keys not written", "namespace", ns, "policy", c.p.Name, "error", err.Error())
			continue
		}
		key := types.NamespacedName{Namespace: ns, Name: c.p.Name}
		w.mu.Lock()
		w.merged[key], w.written[key] = c.st.Newest, now
		w.mu.Unlock()
		wrote++
	}
	return wrote
}

// write writes p's status.rules, refused, inFlight and quota, and its TopKeys condition when
// cond is set, through the one writer of policy status (loop.PatchPolicyStatus): a write from
// a read older than another loop's last write is refused, read again and written again
// (retry.RetryOnConflict), never written over.
func (w *Writer) write(ctx context.Context, p *v1alpha1.RateLimitPolicy, st topKeysStatus, cond *metav1.Condition) error {
	apply := func(p *v1alpha1.RateLimitPolicy) error {
		want := p.Status.DeepCopy()
		want.Rules, want.Refused = st.Rules, st.Refused
		want.InFlight, want.Quota = st.InFlight, st.Quota
		if cond != nil {
			meta.SetStatusCondition(&want.Conditions, *cond)
		}
		_, err := loop.PatchPolicyStatus(ctx, w.Client, p, *want)
		return err
	}
	first := true
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if first {
			first = false
			return apply(p.DeepCopy())
		}
		reader := w.Direct
		if reader == nil {
			reader = w.Policies
		}
		fresh := &v1alpha1.RateLimitPolicy{}
		if err := reader.Get(ctx, client.ObjectKeyFromObject(p), fresh); err != nil {
			return client.IgnoreNotFound(err)
		}
		return apply(fresh)
	})
}

// topKeysCondition is the TopKeys condition g calls for, or nil when p's says it already (or
// p has none and there is nothing to say).
func topKeysCondition(p *v1alpha1.RateLimitPolicy, g fleet.GroupSummaries) *metav1.Condition {
	c := metav1.Condition{Type: v1alpha1.ConditionTopKeys, ObservedGeneration: p.Generation}
	switch {
	case g.OverBound:
		c.Status, c.Reason = metav1.ConditionFalse, v1alpha1.ReasonSummariesOverBound
		c.Message = fmt.Sprintf("%d of the %d live sidecars' top-keys summaries were read: the namespace's summaries are over the %d bytes the manager reads of one namespace per interval; status.rules counts the replicas read",
			g.Read, g.Live, fleet.NamespaceSummaryBytes)
	case g.Invalid > 0:
		c.Status, c.Reason = metav1.ConditionFalse, v1alpha1.ReasonInvalidSummaries
		c.Message = loop.Message(fmt.Sprintf("%d top-keys summaries in the policy's group could not be decoded and are left out (written by something other than a sidecar?): %v", g.Invalid, g.InvalidErr))
	case len(g.Summaries) > 0:
		c.Status, c.Reason = metav1.ConditionTrue, v1alpha1.ReasonTopKeysMerged
		c.Message = "the sidecars' top-keys summaries are merged into status.rules"
	default:
		return nil
	}
	// The message's counts alone do not make a write.
	if old := meta.FindStatusCondition(p.Status.Conditions, c.Type); old != nil && old.Status == c.Status && old.Reason == c.Reason && old.ObservedGeneration == c.ObservedGeneration {
		return nil
	}
	return &c
}

// when is when p's status was last written by w (zero: never).
func (w *Writer) when(p *v1alpha1.RateLimitPolicy) time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.written[types.NamespacedName{Namespace: p.Namespace, Name: p.Name}]
}

// oldest is the least recent write of policies.
func (w *Writer) oldest(policies []*v1alpha1.RateLimitPolicy) time.Time {
	var t time.Time
	for i, p := range policies {
		if at := w.when(p); i == 0 || at.Before(t) {
			t = at
		}
	}
	return t
}

// prune forgets the policies that are gone, so that w holds one entry per policy at most.
func (w *Writer) prune(items []v1alpha1.RateLimitPolicy) {
	live := make(map[types.NamespacedName]bool, len(items))
	for _, p := range items {
		live[types.NamespacedName{Namespace: p.Namespace, Name: p.Name}] = true
	}
	for k := range w.written {
		if !live[k] {
			delete(w.written, k)
		}
	}
	for k := range w.merged {
		if !live[k] {
			delete(w.merged, k)
		}
	}
}
