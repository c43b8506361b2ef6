package decide

import (
	"strconv"
	"testing"
	"time"
)

// A registry remembers at most MaxOwed refusals over all keys, forgets each at its time, and
// pays a key's back only under that key.
func TestDebtsAreBounded(t *testing.T) {
	var d debts
	now := time.Unix(1_000_000, 0)
	for i := range MaxOwed + 100 {
		d.add("k"+strconv.Itoa(i%1000), now, now.Add(time.Minute))
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
	fills := 0
	for d.len() < MaxOwed {
		d.add("fill", later, later.Add(time.Minute))
		fills++
	}
	d.add("new", later, later.Add(time.Minute)) // full, mostly of debts past their time: they give way
	if n := d.len(); n != fills+1 {
		t.Fatalf("%d remembered after the old debts passed their time, want the %d newer ones", n, fills+1)
	}
}
