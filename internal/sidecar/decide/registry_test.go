package decide

import (
	"errors"
	"fmt"
	"testing"
	"time"
)

// clock is a settable clock for the registry's deadlines.
type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

func TestRegistryTakeByIDOnce(t *testing.T) {
	c := &clock{t: time.Unix(1000, 0)}
	g := &Registry{Now: c.now}
	h := &Holds{}
	id, err := g.Put(h, "", c.t.Add(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if len(id) != 22 {
		t.Fatalf("id %q: want 22 characters of 128 random bits", id)
	}
	if got := g.Take("not-" + id); got != nil {
		t.Fatal("a wrong id took a hold")
	}
	if got := g.Take(id); got != h {
		t.Fatalf("Take(id) = %p, want %p", got, h)
	}
	if got := g.Take(id); got != nil {
		t.Fatal("a hold was taken twice")
	}
	if g.Len() != 0 {
		t.Fatalf("Len %d after the only hold was taken", g.Len())
	}
}

// A hold is kept Grace past its deadline, for a late settle to charge what was used, and
// forgotten after.
func TestRegistryForgetsGracePastDeadline(t *testing.T) {
	c := &clock{t: time.Unix(1000, 0)}
	g := &Registry{Now: c.now, Grace: 10 * time.Second}
	late := &Holds{}
	id, _ := g.Put(late, "k", c.t.Add(time.Second))
	c.t = c.t.Add(5 * time.Second)
	if got := g.Take(id); got != late {
		t.Fatal("a hold within its grace was not handed out for a late settle")
	}
	gone, _ := g.Put(&Holds{}, "k", c.t.Add(time.Second))
	_, _ = g.Put(&Holds{}, "j", c.t.Add(time.Second))
	c.t = c.t.Add(11 * time.Second)
	if got := g.TakeOldest("k"); got != nil {
		t.Fatal("TakeOldest handed out a hold past its grace")
	}
	if got := g.Take(gone); got != nil {
		t.Fatal("Take handed out a hold past its grace")
	}
	if g.Len() != 0 {
		t.Fatalf("Len %d: holds past their grace are kept", g.Len())
	}
}

func TestRegistryOldestFirstPerKey(t *testing.T) {
	c := &clock{t: time.Unix(1000, 0)}
	g := &Registry{Now: c.now}
	a, b, other := &Holds{}, &Holds{}, &Holds{}
	_, _ = g.Put(a, "k", c.t.Add(time.Minute))
	_, _ = g.Put(other, "j", c.t.Add(time.Minute))
	_, _ = g.Put(b, "k", c.t.Add(time.Minute))
	if got := g.TakeOldest("k"); got != a {
		t.Fatal("TakeOldest did not give the oldest hold of the key")
	}
	if got := g.TakeOldest("k"); got != b {
		t.Fatal("TakeOldest did not give the next hold of the key")
	}
	if got := g.TakeOldest("k"); got != nil {
		t.Fatal("TakeOldest gave a hold of another key")
	}
	if g.Len() != 1 || g.TakeOldest("j") != other {
		t.Fatal("the other key's hold was lost")
	}
}

// A registry full of open holds refuses more, and one full of holds past their deadline frees
// them whatever their order of arrival (a long timeout in front of short ones).
func TestRegistryBounded(t *testing.T) {
	c := &clock{t: time.Unix(1000, 0)}
	g := &Registry{Max: 3, Grace: time.Second, Now: c.now}
	_, _ = g.Put(&Holds{}, "k", c.t.Add(time.Hour))
	_, _ = g.Put(&Holds{}, "k", c.t.Add(time.Second))
	_, _ = g.Put(&Holds{}, "", c.t.Add(time.Second))
	if _, err := g.Put(&Holds{}, "k", c.t.Add(time.Second)); !errors.Is(err, ErrTooManyHolds) {
		t.Fatalf("Put on a full registry: %v, want ErrTooManyHolds", err)
	}
	c.t = c.t.Add(2 * time.Second)
	for i := range 2 {
		if _, err := g.Put(&Holds{}, "k", c.t.Add(time.Second)); err != nil {
			t.Fatalf("Put %d after two holds passed their deadline: %v", i, err)
		}
	}
	if g.Len() != 3 {
		t.Fatalf("Len %d, want 3", g.Len())
	}
}

// keyed is a request's holds under the given limiter keys, for the registry's shares.
func keyed(keys ...string) *Holds {
	h := &Holds{}
	for _, k := range keys {
		h.holds = append(h.holds, held{key: k})
	}
	return h
}

// fill puts holds of key until one is refused, and returns how many were kept and the refusal.
func fill(t *testing.T, g *Registry, key string, deadline time.Time) (int, *RefusedError) {
	t.Helper()
	for n := 0; ; n++ {
		_, err := g.Put(keyed(key), key, deadline)
		if err == nil {
			continue
		}
		var re *RefusedError
		if !errors.As(err, &re) {
			t.Fatalf("Put %d of %s: %v, want a *RefusedError", n, key, err)
		}
		return n, re
	}
}

// No key fills the registry for others: one key alone may take half of it, and past half
// every key keeps at most its share, so that other keys still find room until it is whole
// full. Each refusal says why and when to retry, and is heard.
func TestRegistryShares(t *testing.T) {
	c := &clock{t: time.Unix(1000, 0)}
	var refused []error
	g := &Registry{Max: 64, Share: 8, Now: c.now, Refused: func(err error) { refused = append(refused, err) }}
	deadline := c.t.Add(30 * time.Second)
	n, re := fill(t, g, "greedy", deadline)
	if n != 32 || !errors.Is(re, ErrKeyShareFull) {
		t.Fatalf("one key alone kept %d (refused: %v), want half of 64 and then ErrKeyShareFull", n, re)
	}
	if re.RetryAfter != 30*time.Second {
		t.Fatalf("RetryAfter %v, want 30s: the key's holds have all passed their deadline by then", re.RetryAfter)
	}
	for i := range 4 {
		key := fmt.Sprintf("other-%d", i)
		want := ErrKeyShareFull
		if i == 3 {
			want = ErrTooManyHolds // 32 + 4*8 = 64
		}
		if n, re := fill(t, g, key, deadline); n != 8 || !errors.Is(re, want) {
			t.Fatalf("%s kept %d (refused: %v), want its share of 8, then %v", key, n, re, want)
		}
	}
	// Now the registry is full, for every key.
	if _, err := g.Put(keyed("late-comer"), "late-comer", deadline); !errors.Is(err, ErrTooManyHolds) {
		t.Fatalf("Put on a full registry: %v, want ErrTooManyHolds", err)
	}
	if len(refused) != 6 || !errors.Is(refused[5], ErrTooManyHolds) {
		t.Fatalf("refusals heard: %v, want 6, the last for a full registry", refused)
	}
	// A request under two keys counts toward both: a full share of either refuses it.
	g2 := &Registry{Max: 4, Share: 1, Now: c.now}
	for _, k := range []string{"a", "b"} {
		if _, err := g2.Put(keyed(k), "", deadline); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := g2.Put(keyed("c", "a"), "", deadline); !errors.Is(err, ErrKeyShareFull) {
		t.Fatalf("a request also under a key that has its share: %v, want ErrKeyShareFull", err)
	}
	if _, err := g2.Put(keyed("c", "d"), "", deadline); err != nil {
		t.Fatalf("a request under two keys with room: %v", err)
	}
}

// Holds past their deadline have gone back in Redis: they count toward no bound, yet a late
// settle still finds them (by id, or as the oldest of their key) until their grace ends, and
// at most Late of them are kept, the oldest forgotten first.
func TestRegistryExpiredHoldsDoNotCount(t *testing.T) {
	c := &clock{t: time.Unix(1000, 0)}
	g := &Registry{Max: 8, Share: 4, Late: 6, Grace: time.Minute, Now: c.now}
	var ids []string
	var hs []*Holds
	for i := range 8 {
		h := keyed(fmt.Sprintf("k%d", i%2))
		id, err := g.Put(h, fmt.Sprintf("k%d", i%2), c.t.Add(time.Duration(i+1)*time.Second))
		if err != nil {
			t.Fatalf("Put %d: %v", i, err)
		}
		ids, hs = append(ids, id), append(hs, h)
	}
	if _, err := g.Put(keyed("k0"), "k0", c.t.Add(time.Minute)); !errors.Is(err, ErrTooManyHolds) {
		t.Fatalf("Put on a full registry: %v, want ErrTooManyHolds", err)
	}
	// Every hold is past its deadline: the registry has all its room again, for any key,
	// k0 included, though the expired holds of k0 are kept.
	c.t = c.t.Add(8 * time.Second)
	if g.Open() != 0 {
		t.Fatalf("Open %d: holds past their deadline still count", g.Open())
	}
	for i := range 4 {
		if _, err := g.Put(keyed("k0"), "k0", c.t.Add(time.Hour)); err != nil {
			t.Fatalf("Put %d after the holds expired: %v", i, err)
		}
	}
	// Late is 6: the two oldest expired holds were forgotten, the six others wait.
	if g.Len() != 4+6 {
		t.Fatalf("Len %d, want 4 open and 6 late", g.Len())
	}
	if g.Take(ids[0]) != nil || g.Take(ids[1]) != nil {
		t.Fatal("holds beyond Late were kept")
	}
	if got := g.Take(ids[2]); got != hs[2] {
		t.Fatal("a late settle by id did not find its expired hold")
	}
	// k1's oldest kept hold is ids[3]: Envoy's late stream-done settles it, not a newer one.
	if got := g.TakeOldest("k1"); got != hs[3] {
		t.Fatal("TakeOldest did not give the key's oldest hold, past its deadline")
	}
	// k0's oldest is ids[4], expired, before the four open ones.
	if got := g.TakeOldest("k0"); got != hs[4] {
		t.Fatal("TakeOldest did not give the key's oldest hold, past its deadline, before the open ones")
	}
	// Past their grace, late holds are forgotten; open ones stay.
	c.t = c.t.Add(time.Minute)
	if g.Take(ids[7]) != nil {
		t.Fatal("a hold past its grace was kept")
	}
	if g.Len() != 4 || g.Open() != 4 {
		t.Fatalf("Len %d, Open %d: want the 4 open holds only", g.Len(), g.Open())
	}
}
