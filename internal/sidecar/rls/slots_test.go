package rls_test

import (
	"context"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	. "github.com/onsi/gomega"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/redline-dev/redline/internal/limiter"
	"github.com/redline-dev/redline/internal/policydoc"
	"github.com/redline-dev/redline/internal/sidecar/decide"
	"github.com/redline-dev/redline/internal/sidecar/rls"
	"github.com/redline-dev/redline/internal/testutil/sidecartest"
)

// slotServer is the service with a real limiter on a real Redis, for policy "p": an in-flight
// rule "slots" of 2 per user, and the rules given. Envoy's slots are kept a minute on clk.
func slotServer(t *testing.T, clk *sidecartest.Clock, rules ...policydoc.Rule) *rls.Server {
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
	s := slotServer(t, sidecartest.NewClock(time.Now()))

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

	// Envoy sends a stream-done call for every request, refused ones too: the refused
	// request's ends no slot of a request still running.
	g.Expect(ask(g, s, slotDesc("slots", "a", true)).OverallCode).To(Equal(ok))
	g.Expect(ask(g, s, slotDesc("slots", "a", false)).OverallCode).To(Equal(over), "a refused request's stream-done freed a running request's slot")
	g.Expect(ask(g, s, slotDesc("slots", "a", true)).OverallCode).To(Equal(ok))
	// An admitted request's stream done: one slot back, answered OK.
	g.Expect(ask(g, s, slotDesc("slots", "a", true)).OverallCode).To(Equal(ok))
	g.Expect(ask(g, s, slotDesc("slots", "a", false)).OverallCode).To(Equal(ok))
	g.Expect(ask(g, s, slotDesc("slots", "a", false)).OverallCode).To(Equal(over))
	g.Expect(ask(g, s, slotDesc("slots", "a", true)).OverallCode).To(Equal(ok)) // the refused one's
	for range 3 {                                                               // the two running end; the third finds nothing of a's kept here, and gives nothing back
		g.Expect(ask(g, s, slotDesc("slots", "a", true)).OverallCode).To(Equal(ok))
	}
	g.Expect(s.Slots.Owed()).To(BeZero(), "every refusal paid back")
	_, held := s.Slots.Len()
	g.Expect(held).To(Equal(1), "b's slot only")
	g.Expect(ask(g, s, slotDesc("slots", "a", false)).OverallCode).To(Equal(ok))
	g.Expect(ask(g, s, slotDesc("slots", "a", false)).OverallCode).To(Equal(ok))
	g.Expect(ask(g, s, slotDesc("slots", "a", false)).OverallCode).To(Equal(over))
}

// An Envoy that never sends its stream-done call holds its slots one lease at most.
func TestEnvoySlotsOfAnEnvoyThatNeverComesBack(t *testing.T) {
	g := NewWithT(t)
	clk := sidecartest.NewClock(time.Now())
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
	s := slotServer(t, sidecartest.NewClock(time.Now()), sidecartest.WindowRule("daily", "x-user", 3))
	both := func(done bool) *rlsv3.RateLimitResponse {
		return ask(g, s, slotDesc("daily", "a", done), slotDesc("slots", "a", done))
	}
	g.Expect(both(false).OverallCode).To(Equal(ok))
	g.Expect(both(false).OverallCode).To(Equal(ok))
	refused := both(false)
	g.Expect(refused.OverallCode).To(Equal(over))
	g.Expect(refused.Statuses[0].Code).To(Equal(ok), "the window admitted it")
	g.Expect(refused.Statuses[1].Code).To(Equal(over))

	both(true) // the refused request's stream done: nothing of the window, no slot
	g.Expect(both(false).OverallCode).To(Equal(over), "a refused request's stream-done freed a slot")
	both(true)
	both(true) // an admitted request's: the window's negative hits count nothing, the slot goes back
	g.Expect(both(false).OverallCode).To(Equal(ok), "the third of the day: the refusals were given back")
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
	s := slotServer(t, sidecartest.NewClock(time.Now()), sidecartest.BudgetRule("tokens", "x-user", "FixedWindow", 1_000, 100, 1, policydoc.OnErrorUsed))
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

	// The refused request's stream done ends no slot.
	g.Expect(ask(g, s, slotDesc("slots", "a", true)).OverallCode).To(Equal(ok))
	g.Expect(s.Slots.Owed()).To(BeZero())
	_, held := s.Slots.Len()
	g.Expect(held).To(Equal(2))
	// An admitted one's: the usage settles the oldest hold, the negative hits give the slot back.
	used := slotDesc("tokens", "a", false)
	used.HitsAddend = wrapperspb.UInt64(40)
	g.Expect(ask(g, s, used, slotDesc("slots", "a", true)).OverallCode).To(Equal(ok))
	g.Expect(s.Holds.Len()).To(Equal(1))
	g.Expect(start().OverallCode).To(Equal(ok))
}

// Envoy sends the stream-done call of every request, refused ones included, while the
// admitted ones still run: the refused requests' calls end no slot, so the key never goes past
// its limit however many requests are refused; one descriptor ends one request whatever its
// hits_addend; and a refusal whose call never comes is forgotten after one lease.
func TestEnvoyRefusedStreamDoneEndsNoRunningSlot(t *testing.T) {
	g := NewWithT(t)
	clk := sidecartest.NewClock(time.Now())
	s := slotServer(t, clk)
	admitted := 0
	for range 10 { // none of the admitted requests ends
		if ask(g, s, slotDesc("slots", "a", false)).OverallCode == ok {
			admitted++
			continue
		}
		ask(g, s, slotDesc("slots", "a", true)) // the refused request's stream done
	}
	g.Expect(admitted).To(Equal(2), "admitted with 2 slots while none of them ended")
	_, held := s.Slots.Len()
	g.Expect(held).To(Equal(2))

	huge := slotDesc("slots", "a", true)
	huge.HitsAddend = wrapperspb.UInt64(1 << 62)
	ask(g, s, huge)
	_, held = s.Slots.Len()
	g.Expect(held).To(Equal(1), "one stream-done call ends one request")

	g.Expect(ask(g, s, slotDesc("slots", "a", false)).OverallCode).To(Equal(ok))
	g.Expect(ask(g, s, slotDesc("slots", "a", false)).OverallCode).To(Equal(over)) // its call never comes
	g.Expect(s.Slots.Owed()).To(Equal(1))
	clk.Add(61 * time.Second)
	ask(g, s, slotDesc("slots", "a", true))
	g.Expect(s.Slots.Owed()).To(BeZero(), "a refusal owed past its lease is forgotten")
	_, held = s.Slots.Len()
	g.Expect(held).To(Equal(1), "so the call ended the oldest kept request's slot")
}

// A request whose slots the registry has no room to keep gives every one of them back, those
// of keys after the one that did not fit included: none stays held, renewed, in the limiter.
func TestEnvoySlotsWithoutRoomAllGoBack(t *testing.T) {
	g := NewWithT(t)
	s := slotServer(t, sidecartest.NewClock(time.Now()))
	s.Slots.Max = 1
	resp := ask(g, s, slotDesc("slots", "a", false), slotDesc("slots", "b", false), slotDesc("slots", "c", false))
	g.Expect(resp.OverallCode).To(Equal(over), "no room to keep the slots: refused")
	entries, _ := s.Slots.Len()
	g.Expect(entries).To(BeZero())
	lim := s.Engine.Limiter.(*limiter.Limiter)
	g.Expect(lim.SlotStats().Held).To(BeZero(), "a slot taken for the request stayed held")
}
