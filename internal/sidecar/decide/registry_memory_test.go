package decide

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/redline-dev/redline/internal/sidecar/membudget"
)

// With a memory budget, the budget is the registry's total bound: each hold draws HoldBytes
// for each rule it holds for, a hold that does not fit is refused (ErrNoMemory, counted by
// the budget) until one is taken, and a taken hold gives its bytes back.
func TestRegistryDrawsFromTheMemoryBudget(t *testing.T) {
	c := &clock{t: time.Unix(1000, 0)}
	budget := membudget.New(10 * HoldBytes)
	g := &Registry{Memory: budget, Share: 100, Now: c.now}
	deadline := c.t.Add(20 * time.Second)
	var ids []string
	for i := range 8 {
		id, err := g.Put(keyed(fmt.Sprintf("k%d", i)), "", deadline)
		if err != nil {
			t.Fatalf("Put %d of 10 holds' room: %v", i, err)
		}
		ids = append(ids, id)
	}
	two, err := g.Put(keyed("x", "y"), "", deadline)
	if err != nil {
		t.Fatalf("a hold of two rules in the room of two: %v", err)
	}
	if got := budget.Stats().InUse; got != 10*HoldBytes {
		t.Fatalf("in use %d, want 10 holds' worth", got)
	}
	_, err = g.Put(keyed("z"), "", deadline)
	var re *RefusedError
	if !errors.As(err, &re) || !errors.Is(err, ErrNoMemory) || re.RetryAfter != 20*time.Second {
		t.Fatalf("Put on a full budget: %v, want ErrNoMemory retrying when the first hold ends (20s)", err)
	}
	if budget.Stats().Refused != 1 {
		t.Fatalf("refusals counted %d, want 1", budget.Stats().Refused)
	}
	g.Take(two)
	if got := budget.Stats().InUse; got != 8*HoldBytes {
		t.Fatalf("in use %d once the hold of two rules was taken, want 8 holds' worth", got)
	}
	for _, id := range ids {
		g.Take(id)
	}
	if got := budget.Stats().InUse; got != 0 {
		t.Fatalf("in use %d with no hold kept", got)
	}
}

// Holds past their deadline are spent in Redis and count toward no bound: kept for a late
// settle, they still hold their memory, but give it up, oldest first, to a hold that needs it.
func TestRegistryLateHoldsGiveWayInTheMemoryBudget(t *testing.T) {
	c := &clock{t: time.Unix(1000, 0)}
	budget := membudget.New(4 * HoldBytes)
	g := &Registry{Memory: budget, Share: 100, Grace: time.Hour, Now: c.now}
	var ids []string
	for i := range 4 {
		id, err := g.Put(keyed("k"), "k", c.t.Add(time.Duration(i+1)*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	c.t = c.t.Add(5 * time.Second) // all four are late
	for i := range 3 {
		if _, err := g.Put(keyed("k"), "k", c.t.Add(time.Minute)); err != nil {
			t.Fatalf("Put %d with the budget full of late holds: %v", i, err)
		}
	}
	if g.Take(ids[0]) != nil || g.Take(ids[2]) != nil {
		t.Fatal("the late holds that gave way are still kept")
	}
	if g.Take(ids[3]) == nil {
		t.Fatal("the newest late hold was forgotten though there was room for it")
	}
	if st := budget.Stats(); st.InUse != 3*HoldBytes || st.Refused != 0 {
		t.Fatalf("budget %+v: want the 3 open holds' worth, no refusal", st)
	}
}

// Under a memory budget, no set of keys fills the registry for a victim while the memory
// allows: 170 keys of 10 holds each, and one key alone up to half the budget, leave the
// victim its 10; past half the budget, a key at its share is refused.
func TestRegistryMemorySharesProtectAVictim(t *testing.T) {
	c := &clock{t: time.Unix(1000, 0)}
	budget := membudget.New(4096 * HoldBytes)
	g := &Registry{Memory: budget, Now: c.now}
	deadline := c.t.Add(time.Minute)
	if got := g.share(); got != 64 {
		t.Fatalf("share %d, want a 64th of 4096 holds", got)
	}
	n, re := fill(t, g, "greedy", deadline)
	if n != 2048 || !errors.Is(re, ErrKeyShareFull) {
		t.Fatalf("one key kept %d (refused: %v), want half the budget's 4096 holds, then its share", n, re)
	}
	for i := range 170 {
		for j := range 10 {
			if _, err := g.Put(keyed(fmt.Sprintf("filler-%d", i)), "", deadline); err != nil {
				t.Fatalf("filler %d, hold %d: %v", i, j, err)
			}
		}
	}
	for j := range 10 {
		if _, err := g.Put(keyed("victim"), "", deadline); err != nil {
			t.Fatalf("victim's hold %d: %v", j, err)
		}
	}
	if budget.Stats().Refused != 0 {
		t.Fatalf("%d refusals for memory while it had room", budget.Stats().Refused)
	}
	// More keys than the memory has room for fill it: then it refuses every key.
	var err error
	for i := 0; err == nil; i++ {
		_, err = g.Put(keyed(fmt.Sprintf("more-%d", i)), "", deadline)
	}
	if !errors.Is(err, ErrNoMemory) || g.Open() != 4096 {
		t.Fatalf("refused with %v at %d open holds, want ErrNoMemory at the budget's 4096", err, g.Open())
	}
}

// Late holds do not count toward the pressure that holds keys to their share either.
func TestRegistryLateHoldsDoNotPressKeys(t *testing.T) {
	c := &clock{t: time.Unix(1000, 0)}
	g := &Registry{Memory: membudget.New(4 * HoldBytes), Share: 1, Grace: time.Hour, Now: c.now}
	put := func(n int) (kept int, err error) {
		for range n {
			if _, err = g.Put(keyed("a"), "a", c.t.Add(time.Second)); err != nil {
				return kept, err
			}
			kept++
		}
		return kept, nil
	}
	if kept, err := put(3); kept != 2 || !errors.Is(err, ErrKeyShareFull) {
		t.Fatalf("kept %d (refused: %v), want 2 until half the budget, then the key's share", kept, err)
	}
	c.t = c.t.Add(2 * time.Second) // both late, still kept
	if kept, err := put(3); kept != 2 || !errors.Is(err, ErrKeyShareFull) {
		t.Fatalf("beside 2 late holds: kept %d (refused: %v), want 2 again", kept, err)
	}
	if g.Len() != 4 {
		t.Fatalf("Len %d, want 2 late and 2 open", g.Len())
	}
}
