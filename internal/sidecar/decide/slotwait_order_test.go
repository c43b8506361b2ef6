package decide_test

import (
	"context"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/redline-dev/redline/internal/limiter"
	"github.com/redline-dev/redline/internal/policydoc"
	"github.com/redline-dev/redline/internal/sidecar/decide"
	"github.com/redline-dev/redline/internal/sidecar/slotqueue"
	"github.com/redline-dev/redline/internal/testutil/sidecartest"
)

// meetingLimiter holds the first two slot acquisitions until both have arrived, so that two
// requests take their first slots at the same moment.
type meetingLimiter struct {
	decide.Limiter
	arrived sync.WaitGroup
	once    [2]sync.Once
	n       int
	mu      sync.Mutex
}

func (m *meetingLimiter) Acquire(ctx context.Context, key string, lim limiter.InFlight) (limiter.SlotResult, *limiter.Slot, error) {
	m.mu.Lock()
	i := m.n
	m.n++
	m.mu.Unlock()
	if i < 2 {
		m.once[i].Do(m.arrived.Done)
		m.arrived.Wait()
	}
	return m.Limiter.Acquire(ctx, key, lim)
}

// Two checks that name the same two in-flight rules (one slot each, with a queue) in opposite
// orders, taking their first slots at the same moment: were each to take its slots in the order
// it names them, each would hold one and wait for the other's until both timed out. Taken in
// the order of their keys, one waits holding nothing and gets both once the other ends. Each
// answer lists its outcomes in the order its check named the rules.
func TestWaitSlotsInOppositeOrdersDoNotWaitForEachOther(t *testing.T) {
	g := NewWithT(t)
	queued := func(name string) policydoc.Rule {
		r := sidecartest.InFlightRule(name, "x-key", 1)
		r.Queue = &policydoc.Queue{Size: 4, TimeoutMS: (20 * time.Second).Milliseconds()}
		return r
	}
	set := stackedSet(t, queued("a"), queued("b"))
	lim := &meetingLimiter{Limiter: sidecartest.Limiter(t)}
	lim.arrived.Add(2)
	e := &decide.Engine{Limiter: lim, Queue: &slotqueue.Queue{Max: 16}}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	hit := func(rule string) decide.Hit { return decide.Hit{Policy: "p", Rule: rule, Key: []string{"k"}} }
	wait := func(hits ...decide.Hit) <-chan *decide.Slots {
		out := make(chan *decide.Slots, 1)
		go func() {
			p, err := e.PlanHits(set, hits, 1)
			g.Expect(err).NotTo(HaveOccurred())
			out <- e.WaitSlots(ctx, &p, nil)
		}()
		return out
	}
	ab, ba := wait(hit("a"), hit("b")), wait(hit("b"), hit("a"))

	var first *decide.Slots
	var second <-chan *decide.Slots
	var firstNames []string
	select {
	case first = <-ab:
		second, firstNames = ba, []string{"a", "b"}
	case first = <-ba:
		second, firstNames = ab, []string{"b", "a"}
	case <-ctx.Done():
		t.Fatal("neither check got both slots: each holds one and waits for the other's")
	}
	g.Expect(first.Refused).To(BeNil())
	g.Expect(ruleNames(first)).To(Equal(firstNames), "outcomes in the order the check named the rules")
	g.Consistently(second, 200*time.Millisecond).ShouldNot(Receive(), "the other waits: both keys are taken")
	first.Release(ctx)
	var last *decide.Slots
	g.Eventually(second, time.Minute).Should(Receive(&last))
	g.Expect(last.Refused).To(BeNil(), "it got both once the first ended")
	g.Expect(ruleNames(last)).To(ConsistOf("a", "b"))
	g.Expect(ruleNames(last)).NotTo(Equal(firstNames))
	last.Release(ctx)
}

func ruleNames(s *decide.Slots) []string {
	var out []string
	for _, o := range s.Outcomes {
		out = append(out, o.Rule.Name)
	}
	return out
}
