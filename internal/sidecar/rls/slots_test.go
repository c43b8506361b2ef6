package rls_test

import (
	"context"
	"sync"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	. "github.com/onsi/gomega"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/redline-dev/redline/internal/policydoc"
	"github.com/redline-dev/redline/internal/sidecar/decide"
	"github.com/redline-dev/redline/internal/sidecar/rls"
	"github.com/redline-dev/redline/internal/testutil/sidecartest"
)

type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// slotServer is the service with a real limiter on a real Redis, for policy "p": an in-flight
// rule "slots" of 2 per user, and the rules given. Envoy's slots are kept a minute on clk.
func slotServer(t *testing.T, clk *clock, rules ...policydoc.Rule) *rls.Server {
	t.Helper()
	sidecartest.AwayFromDayEnd(t)
	doc := sidecartest.DocumentRules("ns", "p", "web", append([]policydoc.Rule{sidecartest.InFlightRule("slots", "x-user", 2)}, rules...)...)
	return &rls.Server{Engine: &decide.Engine{Limiter: sidecartest.Limiter(t)}, Store: sidecartest.StoreOf(t, doc),
		Holds: &decide.Registry{}, Slots: &decide.SlotRegistry{Lease: time.Minute, Now: clk.Now}}
}

// slotDesc is the descriptor of rule's key for user; done marks Envoy's stream-done call with
// negative hits.
func slotDesc(rule, user string, done bool) *rlv3.RateLimitDescriptor {
	d := desc("policy", "p", "rule", rule, "user", user)
	d.IsNegativeHits = done
	return d
}

func ask(g Gomega, s *rls.Server, ds ...*rlv3.RateLimitDescriptor) *rlsv3.RateLimitResponse {
	resp, err := s.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "d", Descriptors: ds})
	g.Expect(err).NotTo(HaveOccurred())
	return resp
}

func header(resp *rlsv3.RateLimitResponse, name string) string {
	for _, h := range resp.ResponseHeadersToAdd {
		if h.Key == name {
			return h.Value
		}
	}
	return ""
}

const ok, over = rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT

// Envoy's concurrency emulation: a descriptor at the request's start takes a slot, the same
// descriptor with negative hits at stream done gives the oldest back.
func TestEnvoyInFlightDescriptors(t *testing.T) {
	g := NewWithT(t)
	s := slotServer(t, &clock{now: time.Now()})

	first := ask(g, s, slotDesc("slots", "a", false))
	g.Expect(first.OverallCode).To(Equal(ok))
	g.Expect(first.Statuses[0].CurrentLimit.RequestsPerUnit).To(Equal(uint32(2)))
	g.Expect(first.Statuses[0].LimitRemaining).To(Equal(uint32(1)))
	g.Expect(header(first, "RateLimit-Policy")).To(Equal(`"p/slots";q=2;qu="concurrent-requests"`))
	g.Expect(ask(g, s, slotDesc("slots", "a", false)).OverallCode).To(Equal(ok))

	full := ask(g, s, slotDesc("slots", "a", false))
	g.Expect(full.OverallCode).To(Equal(over))
	g.Expect(full.Statuses[0].Code).To(Equal(over))
	g.Expect(header(full, "Retry-After")).To(Equal("1"))
	g.Expect(header(full, "RateLimit")).To(Equal(`"p/slots";r=0;t=1`))
	g.Expect(ask(g, s, slotDesc("slots", "b", false)).OverallCode).To(Equal(ok), "another key has its own slots")

	// Stream done: one slot back, answered OK; a second stream-done frees the other.
	g.Expect(ask(g, s, slotDesc("slots", "a", true)).OverallCode).To(Equal(ok))
	g.Expect(ask(g, s, slotDesc("slots", "a", false)).OverallCode).To(Equal(ok))
	g.Expect(ask(g, s, slotDesc("slots", "a", false)).OverallCode).To(Equal(over))
	for range 3 { // the third finds nothing of a's kept here, and gives nothing back
		g.Expect(ask(g, s, slotDesc("slots", "a", true)).OverallCode).To(Equal(ok))
	}
	_, held := s.Slots.Len()
	g.Expect(held).To(Equal(1), "b's slot only")
	g.Expect(ask(g, s, slotDesc("slots", "a", false)).OverallCode).To(Equal(ok))
	g.Expect(ask(g, s, slotDesc("slots", "a", false)).OverallCode).To(Equal(ok))
	g.Expect(ask(g, s, slotDesc("slots", "a", false)).OverallCode).To(Equal(over))
}

// An Envoy that never sends its stream-done call holds its slots one lease at most.
func TestEnvoySlotsOfAnEnvoyThatNeverComesBack(t *testing.T) {
	g := NewWithT(t)
	clk := &clock{now: time.Now()}
	s := slotServer(t, clk)
	ask(g, s, slotDesc("slots", "a", false))
	ask(g, s, slotDesc("slots", "a", false))
	g.Expect(ask(g, s, slotDesc("slots", "a", false)).OverallCode).To(Equal(over))
	clk.Add(59 * time.Second)
	g.Expect(s.Slots.Sweep(context.Background())).To(BeZero())
	clk.Add(2 * time.Second)
	g.Expect(s.Slots.Sweep(context.Background())).To(Equal(2))
	g.Expect(ask(g, s, slotDesc("slots", "a", false)).OverallCode).To(Equal(ok))
}

// A rule per window and an in-flight rule on one request: refused by the window, no slot is
// taken; refused for want of a slot, the window counts nothing.
func TestEnvoySlotsAndWindowsDecideAsOne(t *testing.T) {
	g := NewWithT(t)
	s := slotServer(t, &clock{now: time.Now()}, sidecartest.WindowRule("daily", "x-user", 3))
	both := func(done bool) *rlsv3.RateLimitResponse {
		return ask(g, s, slotDesc("daily", "a", done), slotDesc("slots", "a", done))
	}
	g.Expect(both(false).OverallCode).To(Equal(ok))
	g.Expect(both(false).OverallCode).To(Equal(ok))
	refused := both(false)
	g.Expect(refused.OverallCode).To(Equal(over))
	g.Expect(refused.Statuses[0].Code).To(Equal(ok), "the window admitted it")
	g.Expect(refused.Statuses[1].Code).To(Equal(over))

	both(true) // stream done: the window's negative hits count nothing, the slot goes back
	g.Expect(both(false).OverallCode).To(Equal(ok), "the third of the day: the refusal was given back")
	both(true)
	both(true)
	over4 := both(false)
	g.Expect(over4.OverallCode).To(Equal(over))
	g.Expect(over4.Statuses[0].Code).To(Equal(over))
	_, held := s.Slots.Len()
	g.Expect(held).To(BeZero(), "refused by the window, it took no slot")
}

// A token budget and an in-flight limit on one Envoy request: the slot is taken first; a
// request refused for want of it holds nothing of the budget.
func TestEnvoyTokenBudgetWithInFlight(t *testing.T) {
	g := NewWithT(t)
	s := slotServer(t, &clock{now: time.Now()}, sidecartest.BudgetRule("tokens", "x-user", "FixedWindow", 1_000, 100, 1, policydoc.OnErrorUsed))
	start := func() *rlsv3.RateLimitResponse {
		return ask(g, s, slotDesc("tokens", "a", false), slotDesc("slots", "a", false))
	}
	g.Expect(start().OverallCode).To(Equal(ok))
	g.Expect(start().OverallCode).To(Equal(ok))
	g.Expect(s.Holds.Len()).To(Equal(2))
	refused := start()
	g.Expect(refused.OverallCode).To(Equal(over))
	g.Expect(refused.Statuses[1].Code).To(Equal(over))
	g.Expect(s.Holds.Len()).To(Equal(2), "refused for want of a slot: no hold")

	// Stream done: the usage settles the oldest hold, the negative hits give the slot back.
	used := slotDesc("tokens", "a", false)
	used.HitsAddend = wrapperspb.UInt64(40)
	g.Expect(ask(g, s, used, slotDesc("slots", "a", true)).OverallCode).To(Equal(ok))
	g.Expect(s.Holds.Len()).To(Equal(1))
	g.Expect(start().OverallCode).To(Equal(ok))
}
