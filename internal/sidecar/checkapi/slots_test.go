package checkapi_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/redline-dev/redline/internal/policydoc"
	"github.com/redline-dev/redline/internal/sidecar/checkapi"
	"github.com/redline-dev/redline/internal/sidecar/decide"
	"github.com/redline-dev/redline/internal/testutil/sidecartest"
)

// slotHandler serves the decision API with a real limiter on a real Redis for policy "p": an
// in-flight rule "slots" of 2 per X-Key, and the rules given. Its slots' leases run on clk.
func slotHandler(t *testing.T, clk *sidecartest.Clock, rules ...policydoc.Rule) *checkapi.Handler {
	t.Helper()
	sidecartest.AwayFromDayEnd(t)
	doc := sidecartest.DocumentRules("ns", "p", "web", append([]policydoc.Rule{sidecartest.InFlightRule("slots", "x-key", 2)}, rules...)...)
	return &checkapi.Handler{Engine: &decide.Engine{Limiter: sidecartest.Limiter(t)}, Store: sidecartest.StoreOf(t, doc),
		Holds: &decide.Registry{}, Slots: &decide.SlotRegistry{Lease: 10 * time.Second, Now: clk.Now}}
}

const checkA = `{"method":"GET","path":"/","headers":{"X-Key":"a"}}`

func TestCheckAcquiresRenewsAndReleasesSlots(t *testing.T) {
	g := NewWithT(t)
	clk := sidecartest.NewClock(time.Now())
	h := slotHandler(t, clk)

	first := answer(g, h, checkA, 200)
	g.Expect(first.Allowed).To(BeTrue())
	g.Expect(first.Slot).NotTo(BeNil())
	g.Expect(first.Slot.ID).To(HaveLen(22))
	g.Expect(first.Slot.Held).To(Equal(1))
	g.Expect(first.Results).To(ConsistOf(HaveField("Unit", checkapi.UnitConcurrentRequests)))
	g.Expect(first.Headers).To(HaveKeyWithValue("RateLimit-Policy", `"p/slots";q=2;qu="concurrent-requests"`))
	g.Expect(first.Headers).To(HaveKeyWithValue("RateLimit", `"p/slots";r=1;t=1`))

	// A hit naming the rule takes a slot of the same key.
	second := answer(g, h, `{"policy":"p","rule":"slots","key":["a"]}`, 200)
	g.Expect(second.Allowed).To(BeTrue())
	g.Expect(second.Slot).NotTo(BeNil())

	// The key is full: refused with Retry-After and the concurrent-requests fields, no slot.
	full := answer(g, h, checkA, 200)
	g.Expect(full.Allowed).To(BeFalse())
	g.Expect(full.Rule).To(Equal("slots"))
	g.Expect(full.RetryAfterSeconds).To(Equal(int64(1)))
	g.Expect(full.Slot).To(BeNil())
	g.Expect(full.Headers).To(HaveKeyWithValue("Retry-After", "1"))
	g.Expect(full.Headers).To(HaveKeyWithValue("RateLimit", `"p/slots";r=0;t=1`))
	// Another key has its own slots.
	g.Expect(answer(g, h, `{"policy":"p","rule":"slots","key":["b"]}`, 200).Allowed).To(BeTrue())

	// Renew extends the lease; release gives the slot back at once, once.
	renewed := answer(g, h, `{"renew":{"slot":"`+first.Slot.ID+`"}}`, 200)
	g.Expect(renewed.Slot).To(Equal(&checkapi.Slot{ID: first.Slot.ID, Held: 1, ExpiresSeconds: renewed.Slot.ExpiresSeconds}))
	g.Expect(answer(g, h, `{"release":{"slot":"`+first.Slot.ID+`"}}`, 200).Released).To(Equal(&checkapi.Released{Slots: 1}))
	answer(g, h, `{"release":{"slot":"`+first.Slot.ID+`"}}`, 404)
	answer(g, h, `{"renew":{"slot":"`+first.Slot.ID+`"}}`, 404)
	g.Expect(answer(g, h, checkA, 200).Allowed).To(BeTrue(), "the released slot is free")
	g.Expect(answer(g, h, checkA, 200).Allowed).To(BeFalse())

	// An id the sidecar never gave (or a hold's id) is an error, never another's slot.
	answer(g, h, `{"release":{"slot":"AAAAAAAAAAAAAAAAAAAAAA"}}`, 404)
	answer(g, h, `{"release":{"slot":"x"},"policy":"p"}`, 400)
	answer(g, h, `{"release":{"slot":"x"},"renew":{"slot":"x"}}`, 400)
	g.Expect(answer(g, h, `{"policy":"p","rule":"slots","key":["a"]}`, 200).Allowed).To(BeFalse(), "a's two slots are still held")
}

// A client that neither renews nor releases loses its slot when its lease runs out, and the key
// admits again; one that renews keeps it.
func TestCheckSlotLeaseRunsOut(t *testing.T) {
	g := NewWithT(t)
	clk := sidecartest.NewClock(time.Now())
	h := slotHandler(t, clk)
	kept := answer(g, h, checkA, 200).Slot
	abandoned := answer(g, h, checkA, 200).Slot
	g.Expect(kept).NotTo(BeNil())
	g.Expect(abandoned).NotTo(BeNil())

	clk.Add(6 * time.Second)
	answer(g, h, `{"renew":{"slot":"`+kept.ID+`"}}`, 200)
	clk.Add(6 * time.Second)
	g.Expect(h.Slots.Sweep(context.Background())).To(Equal(1), "only the slot not renewed goes back")
	answer(g, h, `{"renew":{"slot":"`+abandoned.ID+`"}}`, 404)
	answer(g, h, `{"renew":{"slot":"`+kept.ID+`"}}`, 200)
	g.Expect(answer(g, h, checkA, 200).Allowed).To(BeTrue(), "the abandoned slot is free again")
	g.Expect(answer(g, h, checkA, 200).Allowed).To(BeFalse())
}

// A request refused by its rule per window takes no slot; one refused for want of a slot counts
// in no rule per window.
func TestCheckSlotsAndWindowsDecideAsOne(t *testing.T) {
	g := NewWithT(t)
	h := slotHandler(t, sidecartest.NewClock(time.Now()), sidecartest.WindowRule("daily", "x-key", 3))
	a := answer(g, h, checkA, 200)
	b := answer(g, h, checkA, 200)
	g.Expect(a.Slot).NotTo(BeNil())
	g.Expect(b.Slot).NotTo(BeNil())
	refused := answer(g, h, checkA, 200)
	g.Expect(refused.Allowed).To(BeFalse())
	g.Expect(refused.Rule).To(Equal("slots"))
	g.Expect(refused.Headers).To(HaveKeyWithValue("Retry-After", "1"))
	g.Expect(refused.Headers["RateLimit-Policy"]).To(ContainSubstring(`qu="concurrent-requests"`))
	g.Expect(refused.Headers["RateLimit-Policy"]).To(ContainSubstring(`"p/daily";q=3`))

	// The refusal was given back: one more of the day's three is admitted.
	answer(g, h, `{"release":{"slot":"`+a.Slot.ID+`"}}`, 200)
	answer(g, h, `{"release":{"slot":"`+b.Slot.ID+`"}}`, 200)
	third := answer(g, h, checkA, 200)
	g.Expect(third.Allowed).To(BeTrue())
	answer(g, h, `{"release":{"slot":"`+third.Slot.ID+`"}}`, 200)
	over := answer(g, h, checkA, 200)
	g.Expect(over.Allowed).To(BeFalse())
	g.Expect(over.Rule).To(Equal("daily"))
	g.Expect(over.Slot).To(BeNil())
	// Refused by the window, it took no slot: both are free.
	g.Expect(answer(g, h, `{"policy":"p","rule":"slots","key":["a"]}`, 200).Slot.Held).To(Equal(1))
	g.Expect(answer(g, h, `{"policy":"p","rule":"slots","key":["a"]}`, 200).Slot.Held).To(Equal(1))
}

// A token budget and an in-flight limit on one request: the answer holds both; a request
// refused for want of a slot holds nothing of the budget.
func TestCheckTokenBudgetWithInFlight(t *testing.T) {
	g := NewWithT(t)
	h := slotHandler(t, sidecartest.NewClock(time.Now()), sidecartest.BudgetRule("tokens", "x-key", "FixedWindow", 1_000, 100, 10, policydoc.OnErrorUsed))
	reserve := `{"method":"POST","path":"/v1/chat","headers":{"X-Key":"a"},"reserve":{"prompt":100,"maxOutput":200}}`
	var slots []string
	for range 2 {
		r := answer(g, h, reserve, 200)
		g.Expect(r.Allowed).To(BeTrue())
		g.Expect(r.Hold.Units).To(Equal(int64(300)))
		g.Expect(r.Slot).NotTo(BeNil())
		slots = append(slots, r.Slot.ID)
	}
	refused := answer(g, h, reserve, 200)
	g.Expect(refused.Allowed).To(BeFalse())
	g.Expect(refused.Rule).To(Equal("slots"))
	g.Expect(refused.Hold).To(BeNil())
	g.Expect(refused.Slot).To(BeNil())

	// 600 of 1000 held: after a release a request gets the 400 left, so the refused one held
	// nothing.
	answer(g, h, `{"release":{"slot":"`+slots[0]+`"}}`, 200)
	r := answer(g, h, `{"method":"POST","path":"/v1/chat","headers":{"X-Key":"a"},"reserve":{"prompt":100}}`, 200)
	g.Expect(r.Allowed).To(BeTrue())
	g.Expect(r.Hold.Units).To(Equal(int64(400)))
	g.Expect(r.Slot).NotTo(BeNil())
}

// A registry with no room refuses the check with 503 and Retry-After, and the slot goes back.
func TestCheckSlotRegistryFull(t *testing.T) {
	g := NewWithT(t)
	h := slotHandler(t, sidecartest.NewClock(time.Now()))
	h.Slots.Max = 1
	g.Expect(answer(g, h, checkA, 200).Slot).NotTo(BeNil())
	rec := do(h, http.MethodPost, checkA)
	g.Expect(rec.Code).To(Equal(http.StatusServiceUnavailable), rec.Body.String())
	g.Expect(rec.Header().Get("Retry-After")).NotTo(BeEmpty())
	h.Slots.Max = 2
	g.Expect(answer(g, h, checkA, 200).Slot).NotTo(BeNil(), "the refused check's slot went back")
}
