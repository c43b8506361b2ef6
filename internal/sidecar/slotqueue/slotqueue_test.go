package slotqueue_test

import (
	"context"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/redline-dev/redline/internal/sidecar/membudget"
	"github.com/redline-dev/redline/internal/sidecar/slotqueue"
)

// slots is a pure stand-in for a key's free slots: a try takes one when there is one.
type slots struct {
	mu   sync.Mutex
	free int
}

func (s *slots) try(bool) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.free == 0 {
		return false
	}
	s.free--
	return true
}

func (s *slots) give(q *slotqueue.Queue, key string) {
	s.mu.Lock()
	s.free++
	s.mu.Unlock()
	q.Released(key)
}

// waitInBackground starts a Wait for key and reports its error on the channel it returns once
// the request is counted in the queue (or decided).
func waitInBackground(g Gomega, ctx context.Context, q *slotqueue.Queue, key string, size int, s *slots) <-chan error {
	done := make(chan error, 1)
	before := q.Len()
	go func() { done <- q.Wait(ctx, key, size, nil, s.try, nil) }()
	g.Eventually(func() bool { return q.Len() > before || len(done) > 0 }, time.Minute, time.Millisecond).Should(BeTrue())
	return done
}

// Waiters of a key get their slots in the order they came, each when a slot of the key is given
// back here: no poll is needed (it is an hour).
func TestWaitersOfAKeyAreServedInOrder(t *testing.T) {
	g := NewWithT(t)
	q := &slotqueue.Queue{Poll: time.Hour}
	s := &slots{}
	var order []int
	var mu sync.Mutex
	var dones []<-chan error
	for i := range 4 {
		done := make(chan error, 1)
		before := q.Len()
		go func() {
			err := q.Wait(context.Background(), "k", 4, nil, s.try, nil)
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
			done <- err
		}()
		g.Eventually(q.Len, time.Minute, time.Millisecond).Should(Equal(before + 1))
		dones = append(dones, done)
	}
	for i := range 4 {
		s.give(q, "k")
		g.Expect(<-dones[i]).To(Succeed())
	}
	g.Expect(order).To(Equal([]int{0, 1, 2, 3}))
	g.Expect(q.Len()).To(BeZero())
}

// A key's queue holds at most its size and the sidecar's at most Max: a request past either is
// refused at once. A waiter whose context ends leaves, and its place is free for another.
func TestQueueBoundsAndLeaving(t *testing.T) {
	g := NewWithT(t)
	q := &slotqueue.Queue{Poll: time.Hour, Max: 3}
	s := &slots{}
	ctx, cancel := context.WithCancel(context.Background())
	first := waitInBackground(g, ctx, q, "a", 2, s)
	second := waitInBackground(g, context.Background(), q, "a", 2, s)
	g.Expect(q.Wait(context.Background(), "a", 2, nil, s.try, nil)).To(MatchError(slotqueue.ErrFull), "the key's queue is full")
	third := waitInBackground(g, context.Background(), q, "b", 2, s)
	g.Expect(q.Wait(context.Background(), "c", 2, nil, s.try, nil)).To(MatchError(slotqueue.ErrFull), "the sidecar's queue is full")

	cancel()
	g.Expect(<-first).To(MatchError(context.Canceled))
	g.Expect(q.Len()).To(Equal(2))
	fourth := waitInBackground(g, context.Background(), q, "a", 2, s)
	g.Expect(q.Len()).To(Equal(3), "the place the cancelled waiter left is taken")

	// The head left: the next in line is the head and is woken by the key's next slot.
	s.give(q, "a")
	g.Expect(<-second).To(Succeed())
	s.give(q, "a")
	g.Expect(<-fourth).To(Succeed())
	s.give(q, "b")
	g.Expect(<-third).To(Succeed())
	g.Expect(q.Len()).To(BeZero())
}

// Every waiter draws on the memory budget while it waits: one the budget has no room for is
// refused at once, and a waiter that leaves gives its share back.
func TestWaitersDrawOnTheMemoryBudget(t *testing.T) {
	g := NewWithT(t)
	budget := membudget.New(slotqueue.WaiterBytes)
	q := &slotqueue.Queue{Poll: time.Hour, Memory: budget}
	s := &slots{}
	ctx, cancel := context.WithCancel(context.Background())
	first := waitInBackground(g, ctx, q, "a", 10, s)
	g.Expect(q.Wait(context.Background(), "b", 10, nil, s.try, nil)).To(MatchError(slotqueue.ErrNoMemory))
	cancel()
	g.Expect(<-first).To(MatchError(context.Canceled))
	g.Expect(budget.Stats().InUse).To(BeZero())
}

// A waiter that is not woken asks again every Poll: a slot given back by another replica is
// found without a wake.
func TestTheHeadPolls(t *testing.T) {
	g := NewWithT(t)
	q := &slotqueue.Queue{Poll: time.Millisecond}
	s := &slots{}
	done := waitInBackground(g, context.Background(), q, "a", 1, s)
	s.mu.Lock()
	s.free = 1 // given back elsewhere: no Released
	s.mu.Unlock()
	g.Expect(<-done).To(Succeed())
}

// A face's Share bounds its waiters over every key, beside the queue's bounds: a request of
// that face past it is refused at once, while another face's still waits; a waiter that
// leaves frees its place in its share.
func TestShareBoundsAFace(t *testing.T) {
	g := NewWithT(t)
	q := &slotqueue.Queue{Poll: time.Hour}
	check := &slotqueue.Share{Max: 1}
	s := &slots{}
	ctx, cancel := context.WithCancel(context.Background())
	first := make(chan error, 1)
	go func() { first <- q.Wait(ctx, "a", 10, check, s.try, nil) }()
	g.Eventually(q.Len, time.Minute, time.Millisecond).Should(Equal(1))
	g.Expect(q.Wait(context.Background(), "b", 10, check, s.try, nil)).To(MatchError(slotqueue.ErrFull), "the face's share is full")
	other := waitInBackground(g, context.Background(), q, "b", 10, s)
	cancel()
	g.Expect(<-first).To(MatchError(context.Canceled))
	again := make(chan error, 1)
	go func() { again <- q.Wait(context.Background(), "a", 10, check, s.try, nil) }()
	g.Eventually(q.Len, time.Minute, time.Millisecond).Should(Equal(2), "the place the cancelled waiter left in its share is taken")
	s.give(q, "a")
	g.Expect(<-again).To(Succeed())
	s.give(q, "b")
	g.Expect(<-other).To(Succeed())
}

// A request that finds nobody waiting tries as a newcomer (head false); once in the queue it
// tries only as its head (head true), the one try of the key that keeps a place in the line
// across replicas.
func TestOnlyTheHeadTriesAsHead(t *testing.T) {
	g := NewWithT(t)
	q := &slotqueue.Queue{Poll: time.Hour}
	s := &slots{}
	var mu sync.Mutex
	var tries []string
	try := func(name string) func(bool) bool {
		return func(head bool) bool {
			mu.Lock()
			if head {
				tries = append(tries, name+" as head")
			} else {
				tries = append(tries, name+" as newcomer")
			}
			mu.Unlock()
			return s.try(head)
		}
	}
	first, second := make(chan error, 1), make(chan error, 1)
	go func() { first <- q.Wait(context.Background(), "a", 4, nil, try("first"), nil) }()
	g.Eventually(q.Len, time.Minute, time.Millisecond).Should(Equal(1))
	go func() { second <- q.Wait(context.Background(), "a", 4, nil, try("second"), nil) }()
	g.Eventually(q.Len, time.Minute, time.Millisecond).Should(Equal(2))
	s.give(q, "a")
	g.Expect(<-first).To(Succeed())
	s.give(q, "a")
	g.Expect(<-second).To(Succeed())
	mu.Lock()
	defer mu.Unlock()
	// The second joined behind the first without a try; when the first left, the second,
	// now the head, asked at once (finding the slot given back for it, or not yet and then
	// woken by it), always as the head.
	g.Expect(tries[:2]).To(Equal([]string{"first as newcomer", "first as head"}))
	g.Expect(tries[2:]).To(And(Not(BeEmpty()), HaveEach("second as head")))
}
