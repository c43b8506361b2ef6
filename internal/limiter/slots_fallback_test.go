package limiter_test

import (
	"context"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/redline-dev/redline/internal/limiter"
	"github.com/redline-dev/redline/internal/redisconn"
	"github.com/redline-dev/redline/internal/testutil/redistest"
)

// While Redis cannot be asked, an in-flight rule's LocalFallback admits this replica's share of
// the limit (N over the live replicas, rounded down, at least one) with local slots that its
// releases give back; Open admits without a slot and Closed refuses.
func TestSlotsLocalFallbackWhileRedisIsDown(t *testing.T) {
	g := NewWithT(t)
	srv, err := redistest.Start()
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { _ = srv.Close() })
	fast := redisconn.Options{DialTimeout: 200 * time.Millisecond, ReadTimeout: 300 * time.Millisecond,
		WriteTimeout: 300 * time.Millisecond, PoolTimeout: 300 * time.Millisecond}
	c, err := redisconn.NewClient(srv.URL(), fast)
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { _ = c.Close() })
	l := newLimiter(t, c, limiter.TestOptions{ReplicaID: limiter.NewReplicaID(), SlotExpiry: 10 * time.Minute, FallbackReplicas: 3})
	ctx := context.Background()
	g.Expect(srv.Stop()).To(Succeed())

	key := uniqueKey(t)
	local := limiter.InFlight{Max: 4, FailureMode: limiter.FailureModeLocalFallback, Replicas: 2}
	var held []*limiter.Slot
	for range 2 {
		res, s, err := l.Acquire(ctx, key, local)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(res.Allowed).To(BeTrue(), "within this replica's share, 4 over 2 replicas")
		g.Expect(res.Err).To(HaveOccurred(), "decided without Redis")
		g.Expect(s).NotTo(BeNil(), "a local slot")
		held = append(held, s)
	}
	res, s, _ := l.Acquire(ctx, key, local)
	g.Expect(s).To(BeNil())
	g.Expect(res.Allowed).To(BeFalse(), "past the share")
	g.Expect(res.Full).To(BeTrue())
	g.Expect(l.SlotStats().Held).To(Equal(2))
	l.Release(ctx, held[0])
	res, s, _ = l.Acquire(ctx, key, local)
	g.Expect(res.Allowed).To(BeTrue(), "a released local slot makes room")
	held = append(held[1:], s)
	res, s, _ = l.Acquire(ctx, uniqueKey(t), local)
	g.Expect(res.Allowed).To(BeTrue(), "another key has a share of its own")
	held = append(held, s)

	// No replica count heard yet: the limiter's FallbackReplicas (3) divide, and a share is at
	// least one.
	unheard := limiter.InFlight{Max: 4, FailureMode: limiter.FailureModeLocalFallback}
	other := uniqueKey(t)
	res, s, _ = l.Acquire(ctx, other, unheard)
	g.Expect(res.Allowed).To(BeTrue())
	held = append(held, s)
	res, _, _ = l.Acquire(ctx, other, unheard)
	g.Expect(res.Allowed).To(BeFalse(), "4 over 3 replicas is 1")
	one := limiter.InFlight{Max: 1, FailureMode: limiter.FailureModeLocalFallback, Replicas: 5}
	res, s, _ = l.Acquire(ctx, uniqueKey(t), one)
	g.Expect(res.Allowed).To(BeTrue(), "at least one")
	held = append(held, s)

	res, s, _ = l.Acquire(ctx, key, limiter.InFlight{Max: 4, FailureMode: limiter.FailureModeOpen})
	g.Expect([]any{res.Allowed, s}).To(Equal([]any{true, (*limiter.Slot)(nil)}), "Open admits without a slot")
	res, _, _ = l.Acquire(ctx, key, limiter.InFlight{Max: 4, FailureMode: limiter.FailureModeClosed})
	g.Expect(res.Allowed).To(BeFalse(), "Closed refuses")

	for _, s := range held {
		l.Release(ctx, s)
	}
	g.Expect(l.SlotStats().Held).To(BeZero(), "every local slot given back, no Redis call needed")
}
