package topkeys

import (
	"fmt"
	"testing"
)

func TestHoldersCountSlotsByKeyWithinTheirBound(t *testing.T) {
	var h Holders
	h.Hold("a", "alice", 1)
	h.Hold("a", "", 1)
	h.Hold("b", "bob", 1)
	got := h.Take(1)
	if got.Held != 3 || got.Peak != 3 || len(got.Top.Entries) != 1 || got.Top.Min != 1 {
		t.Fatalf("take %+v, want 3 held, peak 3, alice alone and min 1", got)
	}
	if e := got.Top.Entries[0]; e.Key != "a" || e.Count != 2 || e.Label != "alice" {
		t.Fatalf("top %+v", e)
	}
	h.Hold("a", "", -1)
	h.Hold("a", "", -1)
	if got := h.Take(8); got.Held != 1 || got.Peak != 3 || len(got.Top.Entries) != 1 || got.Top.Entries[0].Key != "b" {
		t.Fatalf("after releases %+v: want 1 held, the interval's peak 3, bob alone", got)
	}
	if got := h.Take(8); got.Peak != 1 {
		t.Fatalf("peak %d, want it started again from what is held (1)", got.Peak)
	}
	// Past MaxHolderKeys keys, a new key counts in Held only, and its release moves no key.
	for i := range MaxHolderKeys + 10 {
		h.Hold(fmt.Sprint("k", i), "", 1)
	}
	if n := len(h.keys); n != MaxHolderKeys {
		t.Fatalf("%d keys kept, want %d", n, MaxHolderKeys)
	}
	h.Hold(fmt.Sprint("k", MaxHolderKeys+5), "", -1)
	if got := h.Take(8); got.Held != MaxHolderKeys+10 || len(h.keys) != MaxHolderKeys {
		t.Fatalf("held %d, keys %d", got.Held, len(h.keys))
	}
	// A release never takes the counts below zero.
	var z Holders
	z.Hold("x", "", -1)
	z.Queue(-1)
	if got := z.Take(8); got.Held != 0 || got.Queued != 0 {
		t.Fatalf("negative counts: %+v", got)
	}
}

func TestUsageKeepsTheHeaviestUsersOfThePeriod(t *testing.T) {
	var u Usage
	const start, end = 500, 1000
	for i := range UsageKeys + 5 {
		u.Use(fmt.Sprint("k", i), "", uint64(i), start, end, 1)
	}
	u.Use("k3", "", 2, start, end, 2) // an older answer of another replica: the most stays
	gotEnd, top := u.Take(3, 0, 10)
	if gotEnd != end || len(top) != 3 || top[0].Key != fmt.Sprint("k", UsageKeys+4) || top[0].Count != UsageKeys+4 {
		t.Fatalf("end %d, top %+v", gotEnd, top)
	}
	if n := len(u.keys); n != UsageKeys {
		t.Fatalf("%d keys kept, want %d", n, UsageKeys)
	}
	u.Use("late", "", 999, start-(end-start), start, 3) // a decision of the period before: ignored
	if _, top := u.Take(1, 0, 10); top[0].Key == "late" {
		t.Fatal("a count of an ended period was kept")
	}
	u.Use("next", "", 1, end, 2*end, 4) // the next period: the keys start again
	if e, top := u.Take(8, 0, 10); e != 2*end || len(top) != 1 || top[0].Key != "next" {
		t.Fatalf("next period: end %d, top %+v", e, top)
	}
	if _, top := u.Take(8, 0, 2*end); len(top) != 0 || u.Most(0, 2*end) != 0 {
		t.Fatalf("a period that ended is still reported: %+v", top)
	}
	// The rule reloaded from a calendar period to a rolling window: its counts are kept again.
	u.Use("rolled", "", 7, 0, 0, 5)
	if e, top := u.Take(8, 0, 6); e != 0 || len(top) != 1 || top[0].Key != "rolled" {
		t.Fatalf("after a change to a rolling window: end %d, top %+v", e, top)
	}
	// A rolling window: the latest count, and keys not decided since are dropped.
	var r Usage
	r.Use("a", "", 50, 0, 0, 100)
	r.Use("a", "", 40, 0, 0, 200)
	r.Use("b", "", 10, 0, 0, 150)
	if _, top := r.Take(8, 160, 300); len(top) != 1 || top[0].Count != 40 || r.Most(0, 300) != 40 {
		t.Fatalf("rolling: %+v", top)
	}
}

// A reload that makes a month's rule a day's: the day's period starts no earlier and ends sooner
// than the month's, and its counts replace the month's at once (not when the month ends). A
// straggling decision of the month before the reload does not take the place back for long: the
// next decision of the day does.
func TestUsageFollowsAReloadToAShorterPeriod(t *testing.T) {
	var u Usage
	const monthStart, monthEnd = 0, 30 * 86_400_000
	const dayStart, dayEnd = 12 * 86_400_000, 13 * 86_400_000
	u.Use("k", "", 900, monthStart, monthEnd, dayStart+1)
	u.Use("k", "", 3, dayStart, dayEnd, dayStart+2)
	if e, top := u.Take(8, 0, dayStart+3); e != dayEnd || len(top) != 1 || top[0].Count != 3 {
		t.Fatalf("after the reload to a day: end %d, top %+v; want the day's count", e, top)
	}
	u.Use("k", "", 901, monthStart, monthEnd, dayStart+4) // decided before the reload, answered after
	u.Use("k", "", 4, dayStart, dayEnd, dayStart+5)
	if e, top := u.Take(8, 0, dayStart+6); e != dayEnd || len(top) != 1 || top[0].Count != 4 {
		t.Fatalf("after a straggler of the month: end %d, top %+v; want the day's count", e, top)
	}
	// Back to a month: its period ends later, and replaces the day's.
	u.Use("k", "", 950, monthStart, monthEnd, dayStart+7)
	if e, _ := u.Take(8, 0, dayStart+8); e != monthEnd {
		t.Fatalf("after the reload to a month: end %d", e)
	}
}
