package controller

import (
	"context"
	"maps"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"sigs.k8s.io/controller-runtime/pkg/event"
)

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
