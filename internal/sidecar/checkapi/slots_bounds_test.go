package checkapi_test

import (
	"fmt"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/redline-dev/redline/internal/sidecar/decide"
	"github.com/redline-dev/redline/internal/sidecar/membudget"
	"github.com/redline-dev/redline/internal/testutil/sidecartest"
)

// A client may keep one id alive by renewing it only up to MaxRenew from its acquire: the renew
// past it answers 410, and the slot is given back, so the key admits again.
func TestCheckSlotRenewStopsAtMaxRenew(t *testing.T) {
	g := NewWithT(t)
	clk := newClockNow()
	h := slotHandler(t, clk)
	h.Slots.MaxRenew = time.Hour
	first := answer(g, h, checkA, 200).Slot
	g.Expect(first).NotTo(BeNil())
	g.Expect(answer(g, h, checkA, 200).Slot).NotTo(BeNil())
	for range 11 {
		clk.Add(5 * time.Minute)
		answer(g, h, `{"renew":{"slot":"`+first.ID+`"}}`, 200)
	}
	g.Expect(answer(g, h, checkA, 200).Allowed).To(BeFalse(), "both of a's slots are kept")
	clk.Add(5 * time.Minute)
	answer(g, h, `{"renew":{"slot":"`+first.ID+`"}}`, 410)
	answer(g, h, `{"renew":{"slot":"`+first.ID+`"}}`, 404)
	g.Expect(answer(g, h, checkA, 200).Allowed).To(BeTrue(), "the slot renewed for an hour went back")
}

// One client keeping slots of many keys fills no more than the face's share of the memory
// budget and of the slot table: the proxy's and the other face's requests still find room.
func TestCheckKeptSlotsLeaveRoomForTheOtherFaces(t *testing.T) {
	g := NewWithT(t)
	budget := membudget.New(8 * decide.HoldBytes)
	h := slotHandler(t, newClockNow())
	h.Slots.Memory, h.Slots.MaxBytes = budget, 2*decide.HoldBytes
	for i := range 2 {
		g.Expect(answer(g, h, fmt.Sprintf(`{"policy":"p","rule":"slots","key":["k%d"]}`, i), 200).Slot).NotTo(BeNil())
	}
	for i := 2; i < 8; i++ {
		answer(g, h, fmt.Sprintf(`{"policy":"p","rule":"slots","key":["k%d"]}`, i), 503)
	}
	g.Expect(budget.Draw(6*decide.HoldBytes, nil)).To(BeTrue(), "the rest of the budget is left to the other faces")

	h = slotHandler(t, newClockNow())
	h.Slots.MaxSlots = 3
	for i := range 3 {
		g.Expect(answer(g, h, fmt.Sprintf(`{"policy":"p","rule":"slots","key":["k%d"]}`, i), 200).Slot).NotTo(BeNil())
	}
	answer(g, h, `{"policy":"p","rule":"slots","key":["k3"]}`, 503)
	entries, slots := h.Slots.Len()
	g.Expect([]int{entries, slots}).To(Equal([]int{3, 3}))
}

// newClockNow is a settable clock at the machine's time.
func newClockNow() *sidecartest.Clock { return sidecartest.NewClock(time.Now()) }
