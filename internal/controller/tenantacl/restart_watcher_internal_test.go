package tenantacl

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"github.com/redis/go-redis/v9"
	"sigs.k8s.io/controller-runtime/pkg/event"

	"github.com/redline-dev/redline/internal/testutil/redistest"
)

// The restart watcher reads every node's run_id when it starts, not one interval later, and
// reports the nodes of that first read as new: a node that restarted after the reconciles at
// the manager's start set its users, or that they did not list, would otherwise have its
// run_id taken for one that holds them, and its users would not be set again. A restart after
// that is reported too (an event, and the restart generation the reconciles compare with moves
// on).
func TestRestartWatcherReadsTheNodesAtStart(t *testing.T) {
	g := NewWithT(t)
	srv, err := redistest.Start()
	g.Expect(err).NotTo(HaveOccurred(), "the test needs redis-server")
	t.Cleanup(func() { _ = srv.Close() })
	node := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: -1})
	t.Cleanup(func() { _ = node.Close() })

	watch := func(interval time.Duration) (reads *atomic.Int64, events chan event.GenericEvent, gen *atomic.Uint64) {
		reads, events, gen = &atomic.Int64{}, make(chan event.GenericEvent, 1), &atomic.Uint64{}
		nodes := func(ctx context.Context, fn func(context.Context, *redis.Client) error) error {
			err := fn(ctx, node)
			if err == nil {
				reads.Add(1)
			}
			return err
		}
		w := &redisRestartWatcher{
			targets:  func() []redisTarget { return []redisTarget{{describe: "Redis", nodes: nodes}} },
			interval: interval, timeout: time.Second, events: events, gen: gen,
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { _ = w.Start(ctx); close(done) }()
		t.Cleanup(func() { cancel(); <-done })
		return reads, events, gen
	}

	// An interval no test outlasts: the only read there can be is the one at start.
	reads, _, _ := watch(time.Hour)
	g.Eventually(reads.Load).WithTimeout(10*time.Second).Should(BeNumerically(">=", 1),
		"the watcher read no node's run_id when it started")

	_, events, gen := watch(100 * time.Millisecond)
	g.Eventually(events).WithTimeout(10*time.Second).Should(Receive(), "the first read's nodes were not reported")
	g.Expect(gen.Load()).To(BeNumerically("==", 1))
	g.Consistently(events).WithTimeout(300*time.Millisecond).ShouldNot(Receive(), "no restart yet")
	g.Expect(srv.Stop()).To(Succeed())
	g.Expect(srv.Start()).To(Succeed())
	g.Eventually(events).WithTimeout(10*time.Second).Should(Receive(), "the restart was not reported")
	g.Expect(gen.Load()).To(BeNumerically("==", 2))
}
