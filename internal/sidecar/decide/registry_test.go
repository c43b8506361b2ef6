package decide

import (
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
	if _, err := g.Put(&Holds{}, "k", c.t.Add(time.Second)); err != ErrTooManyHolds {
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
