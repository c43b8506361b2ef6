package decide

import (
	"strconv"
	"testing"
	"time"

	"github.com/redline-dev/redline/internal/sidecar/membudget"
)

// A registry remembers at most MaxOwed refusals over all keys, forgets each at its time, and
// pays a key's back only under that key.
func TestDebtsAreBounded(t *testing.T) {
	var d debts
	now := time.Unix(1_000_000, 0)
	for i := range MaxOwed + 100 {
		d.add("k"+strconv.Itoa(i%10000), now, now.Add(time.Minute), nil)
	}
	if n := d.len(); n != MaxOwed {
		t.Fatalf("%d remembered, want the bound %d", n, MaxOwed)
	}
	if !d.pay("k1", now) || d.pay("other", now) {
		t.Fatal("a debt is paid under its own key only")
	}
	later := now.Add(2 * time.Minute)
	if d.pay("k2", later) {
		t.Fatal("a debt past its time was paid")
	}
	d.add("new", later, later.Add(time.Minute), nil) // the old ones passed their time: they gave way
	if n := d.len(); n != 1 {
		t.Fatalf("%d remembered after the old debts passed their time, want the newer one", n)
	}
}

// A hold registry remembers at most MaxOwed refusals, however many keys a client names.
func TestHoldRegistryOwesBounded(t *testing.T) {
	g := &Registry{}
	for i := range MaxOwed + 100 {
		g.Owe("k"+strconv.Itoa(i), time.Hour)
	}
	if n := g.Owed(); n != MaxOwed {
		t.Fatalf("%d refusals remembered, want the bound %d", n, MaxOwed)
	}
	if !g.PayOwed("k1") || g.PayOwed("k1") {
		t.Fatal("one refusal owed under k1 is paid once")
	}
}

// Remembered refusals draw on the sidecar's memory budget: no more are remembered than it has
// room for, and what is paid back or forgotten gives its bytes back.
func TestDebtsDrawOnTheMemoryBudget(t *testing.T) {
	const room = 10
	mem := membudget.New(room * DebtBytes)
	var d debts
	now := time.Unix(1_000_000, 0)
	for i := range room + 5 {
		d.add("k"+strconv.Itoa(i), now, now.Add(time.Minute), mem)
	}
	if n, used := d.len(), mem.Stats().InUse; n != room || used != room*DebtBytes {
		t.Fatalf("%d remembered drawing %d bytes, want %d drawing %d", n, used, room, room*DebtBytes)
	}
	if !d.pay("k0", now) {
		t.Fatal("k0's refusal is owed")
	}
	if used := mem.Stats().InUse; used != (room-1)*DebtBytes {
		t.Fatalf("%d bytes drawn after a payment, want %d", used, (room-1)*DebtBytes)
	}
	d.sweep(now.Add(2 * time.Minute))
	if n, used := d.len(), mem.Stats().InUse; n != 0 || used != 0 {
		t.Fatalf("%d remembered drawing %d bytes after every refusal passed its time, want none", n, used)
	}
}

// One key is remembered at most an eighth of the bound: a client refusing itself on one key
// leaves room for the others' refusals.
func TestDebtsOfOneKeyLeaveRoomForOthers(t *testing.T) {
	var d debts
	now := time.Unix(1_000_000, 0)
	for range MaxOwed {
		d.add("flood", now, now.Add(time.Minute), nil)
	}
	if n := d.len(); n != MaxOwed/debtShare {
		t.Fatalf("%d remembered under one key, want %d", n, MaxOwed/debtShare)
	}
	for i := range 1000 {
		d.add("k"+strconv.Itoa(i), now, now.Add(time.Minute), nil)
	}
	if n := d.len(); n != MaxOwed/debtShare+1000 {
		t.Fatalf("%d remembered, want the other keys' 1000 beside the flood's %d", n, MaxOwed/debtShare)
	}
}

// Refusals past their time give their bytes back on the registry's next use, not only once
// the table is full.
func TestStaleDebtsGiveTheirBytesBack(t *testing.T) {
	mem := membudget.New(1 << 20)
	var d debts
	now := time.Unix(1_000_000, 0)
	for i := range 100 {
		d.add("k"+strconv.Itoa(i), now, now.Add(time.Millisecond), mem)
	}
	if used := mem.Stats().InUse; used != 100*DebtBytes {
		t.Fatalf("%d bytes drawn, want %d", used, 100*DebtBytes)
	}
	d.pay("other", now.Add(time.Hour)) // any use of the registry, a second on
	if n, used := d.len(), mem.Stats().InUse; n != 0 || used != 0 {
		t.Fatalf("%d refusals drawing %d bytes an hour after their time, want none", n, used)
	}
}
