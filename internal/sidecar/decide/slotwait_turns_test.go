package decide_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"github.com/redis/go-redis/v9"

	"github.com/redline-dev/redline/internal/limiter"
	"github.com/redline-dev/redline/internal/policydoc"
	"github.com/redline-dev/redline/internal/redisconn"
	"github.com/redline-dev/redline/internal/sidecar/decide"
	"github.com/redline-dev/redline/internal/sidecar/ruleset"
	"github.com/redline-dev/redline/internal/sidecar/slotqueue"
	"github.com/redline-dev/redline/internal/testutil/redistest"
	"github.com/redline-dev/redline/internal/testutil/redistest/redisclient"
)

// countingLimiter counts the slot tries of one sidecar.
type countingLimiter struct {
	decide.Limiter
	tries atomic.Int64
}

func (c *countingLimiter) Acquire(ctx context.Context, key string, lim limiter.InFlight) (limiter.SlotResult, *limiter.Slot, error) {
	c.tries.Add(1)
	return c.Limiter.Acquire(ctx, key, lim)
}

func (c *countingLimiter) AcquireInTurn(ctx context.Context, key string, lim limiter.InFlight, w *limiter.Waiter) (limiter.SlotResult, *limiter.Slot, error) {
	c.tries.Add(1)
	return c.Limiter.AcquireInTurn(ctx, key, lim, w)
}

// sidecars are two engines of the same rule set, each with its limiter (a replica of its own)
// and its queue, on one redis-server; admin reads that server.
type sidecars struct {
	a, b   *decide.Engine
	la, lb *countingLimiter
	set    *ruleset.Set
	admin  redis.UniversalClient
}

func twoSidecars(t *testing.T, poll time.Duration, rule policydoc.Rule) *sidecars {
	t.Helper()
	srv, err := redistest.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	o := redisconn.Options{ReadTimeout: 5 * time.Second, WriteTimeout: 5 * time.Second, PoolTimeout: time.Minute}
	engine := func() (*decide.Engine, *countingLimiter) {
		l, err := limiter.New(redisclient.New(t, srv.URL(), o), limiter.Options{ReplicaID: limiter.NewReplicaID()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(l.Close)
		cl := &countingLimiter{Limiter: l}
		return &decide.Engine{Limiter: cl, Queue: &slotqueue.Queue{Max: 64, Poll: poll}}, cl
	}
	s := &sidecars{set: stackedSet(t, rule), admin: redisclient.New(t, srv.URL(), o)}
	s.a, s.la = engine()
	s.b, s.lb = engine()
	return s
}

// wait starts a request of e on the rule's key "k" and hands its slots over once decided.
func (s *sidecars) wait(g Gomega, ctx context.Context, e *decide.Engine) <-chan *decide.Slots {
	out := make(chan *decide.Slots, 1)
	go func() {
		p, err := e.PlanHits(s.set, []decide.Hit{{Policy: "p", Rule: "r", Key: []string{"k"}}}, 1)
		g.Expect(err).NotTo(HaveOccurred())
		out <- e.WaitSlots(ctx, &p, nil)
	}()
	return out
}

// lines are the waiters in the lines of the server's keys.
func (s *sidecars) lines(g Gomega) int64 {
	keys, err := s.admin.Keys(context.Background(), "*:q").Result()
	g.Expect(err).NotTo(HaveOccurred())
	var n int64
	for _, k := range keys {
		n += s.admin.ZCard(context.Background(), k).Val()
	}
	return n
}

func queuedRule(timeout time.Duration) policydoc.Rule {
	r := policydoc.Rule{Name: "r", Key: []policydoc.KeyPart{{Header: "x-key"}}, InFlight: 1, Mode: "Enforce"}
	r.Queue = &policydoc.Queue{Size: 16, TimeoutMS: timeout.Milliseconds()}
	return r
}

// One key of one slot, two sidecars: A holds the slot, a request of B waits, and then requests
// keep coming to A. When A gives the slot back, B's waiter gets it before A's later requests,
// although A wakes its own at once and B hears of it only at its next poll; A's requests
// then get it one after the other.
func TestSlotWaitersTakeTurnsAcrossSidecars(t *testing.T) {
	g := NewWithT(t)
	// Polls of 2s: B's head keeps its place 16s after each, however busy the machine.
	s := twoSidecars(t, 2*time.Second, queuedRule(5*time.Minute))
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()

	var first *decide.Slots
	g.Eventually(s.wait(g, ctx, s.a), time.Minute).Should(Receive(&first))
	g.Expect(first.Refused).To(BeNil())
	bDone := s.wait(g, ctx, s.b)
	// B's request tried once, joined its queue and asked again as its head: it is in the line.
	g.Eventually(s.lb.tries.Load, time.Minute, 10*time.Millisecond).Should(BeNumerically(">=", 2))
	const stream = 4
	aDone := make(chan *decide.Slots, stream)
	for range stream {
		go func() { aDone <- <-s.wait(g, ctx, s.a) }()
	}
	g.Eventually(s.a.Queue.Len, time.Minute, 10*time.Millisecond).Should(Equal(stream))
	g.Expect(s.b.Queue.Len()).To(Equal(1))

	first.Release(ctx) // wakes A's head at once
	var got *decide.Slots
	select {
	case got = <-bDone:
	case <-aDone:
		t.Fatal("a later request of A got the slot before B's waiter")
	case <-ctx.Done():
		t.Fatal("nobody got the slot")
	}
	g.Expect(got.Refused).To(BeNil())
	for range stream {
		got.Release(ctx)
		g.Eventually(aDone, time.Minute).Should(Receive(&got))
		g.Expect(got.Refused).To(BeNil())
	}
	got.Release(ctx)
	g.Expect(s.lines(g)).To(BeZero(), "nobody waits: the line is empty")
}

// A waiter whose client goes away leaves the line at once, not at its deadline: a request
// of the other sidecar that does not wait takes the slot given back.
func TestSlotWaiterThatLeavesLeavesTheLine(t *testing.T) {
	g := NewWithT(t)
	s := twoSidecars(t, time.Second, queuedRule(5*time.Minute))
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()

	var held *decide.Slots
	g.Eventually(s.wait(g, ctx, s.a), time.Minute).Should(Receive(&held))
	g.Expect(held.Refused).To(BeNil())
	bctx, leave := context.WithCancel(ctx)
	bDone := s.wait(g, bctx, s.b)
	g.Eventually(s.lines, time.Minute, 10*time.Millisecond).Should(Equal(int64(1)), "B's head joined the line")
	leave()
	var refused *decide.Slots
	g.Eventually(bDone, time.Minute).Should(Receive(&refused))
	g.Expect(refused.Refused).NotTo(BeNil())
	// Nothing swept the line meanwhile (no script ran): the waiter took itself off.
	g.Expect(s.lines(g)).To(BeZero(), "the waiter left the line with its request")

	held.Release(ctx)
	p, err := s.a.PlanHits(s.set, []decide.Hit{{Policy: "p", Rule: "r", Key: []string{"k"}}}, 1)
	g.Expect(err).NotTo(HaveOccurred())
	now := s.a.AcquireSlots(ctx, &p)
	g.Expect(now.Refused).To(BeNil(), "nobody waits: a request that does not wait is served")
	now.Release(ctx)
}
