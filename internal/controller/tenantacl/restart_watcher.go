package tenantacl

import (
	"context"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"sigs.k8s.io/controller-runtime/pkg/event"
)

// redisRestartWatcher reads every node's run_id on a period and sends an event when one
// changed (a restart or a new node): ACL users live in memory, so a restarted node has none
// until they are set again, and sidecars dialing it meet WRONGPASS meanwhile. It also sends
// one, without counting a restart, when a node is back in the listing after a read that left
// it out (see listed).
type redisRestartWatcher struct {
	targets  func() []redisTarget
	interval time.Duration
	timeout  time.Duration
	events   chan<- event.GenericEvent
	gen      *atomic.Uint64 // counts the restarts seen (Reconciler.restartGen)
	last     map[string]string
	prev     map[string]bool // the nodes of the previous read

	// seen is, per target id, the nodes that answered the latest read (see listed).
	seenMu sync.Mutex
	seen   map[string][]string
}

// listed returns the nodes of target id that answered the watcher's latest read, sorted.
//
// The reconciles compare their own listing with it: the two are separate listings, and a
// Redis Cluster's differ from one node to the next. CLUSTER SLOTS, which the cluster client
// lists the nodes with, leaves out a replica until its replication offset is not 0 (a new
// cluster's replicas for up to 10 s, until their master's first replication PING), and the
// nodes learn that offset by gossip, each at its own time (within a second on an idle
// machine, later under load). So the read that first lists a replica, and sends the event,
// may be followed by a reconcile's listing, and by reads, that leave it out; its run_id is
// known by then, and no later read would report it. A reconcile that set its user on fewer
// nodes than the latest read lists sets it again (Reconciler.relistDelay), and a
// read that lists a node the previous one left out sends an event, so that a node listed
// again after that is not taken for one that holds the users.
func (w *redisRestartWatcher) listed(id string) []string {
	if w == nil {
		return nil
	}
	w.seenMu.Lock()
	defer w.seenMu.Unlock()
	return w.seen[id]
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
	seen := map[string][]string{}
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
						seen[t.id] = append(seen[t.id], c.Options().Addr)
						mu.Unlock()
					}
				}
				return nil
			})
		})
	}
	wg.Wait()
	for _, addrs := range seen {
		slices.Sort(addrs)
	}
	// Before the event: the reconciles it wakes compare their listing with this one.
	w.seenMu.Lock()
	w.seen = seen
	w.seenMu.Unlock()
	changed, back := false, false
	read := make(map[string]bool, len(ids))
	for addr, id := range ids {
		read[addr] = true
		if prev, ok := w.last[addr]; !ok || prev != id {
			changed = true
		} else if !w.prev[addr] {
			back = true
		}
	}
	w.prev = read
	// The first read counts as a change too (every node is new to it): the reconciles at
	// start may have listed fewer nodes than there are (a cluster client's slot map, or the
	// sentinels' replica list, not yet complete), and a node they missed would otherwise be
	// taken as one that holds the users. One more ACL SETUSER per namespace and node at start
	// buys that no node is left without them.
	if w.last == nil {
		w.last = map[string]string{}
	}
	maps.Copy(w.last, ids)
	if changed && w.gen != nil {
		w.gen.Add(1)
	}
	if changed || back {
		select {
		case w.events <- event.GenericEvent{}:
		case <-ctx.Done():
		}
	}
}
