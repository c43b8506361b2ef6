package membudget

import (
	"math"
	"sync"
	"testing"
)

func TestLeaseDrawsAndGivesBack(t *testing.T) {
	b := New(100)
	l, ok := b.Take(60)
	if !ok {
		t.Fatal("60 of 100 refused")
	}
	if _, ok := b.Take(41); ok {
		t.Error("41 more fit in the 40 left")
	}
	if l.Grow(41) {
		t.Error("a lease grew past the budget")
	}
	if !l.Grow(40) || b.Stats().InUse != 100 {
		t.Errorf("growing to the whole budget: in use %d", b.Stats().InUse)
	}
	l.ShrinkTo(30)
	if st := b.Stats(); st.InUse != 30 || l.Bytes() != 30 {
		t.Errorf("after shrinking to 30: in use %d, lease %d", st.InUse, l.Bytes())
	}
	l.ShrinkTo(50) // never grows
	l.Shrink(10)
	if l.Bytes() != 20 {
		t.Errorf("after shrinking by 10: lease %d, want 20", l.Bytes())
	}
	l.Shrink(100) // at most all of it
	if l.Bytes() != 0 || b.Stats().InUse != 0 {
		t.Errorf("after shrinking past it: lease %d, in use %d", l.Bytes(), b.Stats().InUse)
	}
	l.Release()
	l.Release()
	if st := b.Stats(); st.InUse != 0 || st.Refused != 2 || st.Size != 100 {
		t.Errorf("after release: %+v; want nothing in use, 2 refusals", st)
	}
	if l.Grow(1) {
		t.Error("a released lease grew")
	}
	if other, ok := b.Take(100); !ok || other.Bytes() != 100 {
		t.Error("the whole budget is not free again after the release")
	}
}

func TestNoBudgetGrantsEverything(t *testing.T) {
	b := New(0) // no budget: nil
	l, ok := b.Take(math.MaxInt64 / 2)
	if !ok || !l.Grow(math.MaxInt64/4) {
		t.Fatal("no budget refused a draw")
	}
	l.Release()
	if st := b.Stats(); st != (Stats{}) {
		t.Errorf("no budget counts %+v", st)
	}
}

// Concurrent draws never take more than the budget, and every byte comes back.
func TestConcurrentDrawsStayWithinTheBudget(t *testing.T) {
	b := New(1000)
	var wg sync.WaitGroup
	for i := range 64 {
		wg.Go(func() {
			for range 200 {
				l, ok := b.Take(int64(10 + i))
				if !ok {
					continue
				}
				if in := b.Stats().InUse; in > 1000 {
					t.Errorf("%d bytes in use of 1000", in)
				}
				l.Grow(int64(i))
				l.ShrinkTo(5)
				l.Release()
			}
		})
	}
	wg.Wait()
	if in := b.Stats().InUse; in != 0 {
		t.Errorf("%d bytes still in use", in)
	}
}

func TestSizeFor(t *testing.T) {
	for _, tc := range []struct {
		limit int64
		want  int64
	}{{57042480, 57042480 / 100 * DefaultPercent}, {math.MaxInt64, DefaultSize}, {0, DefaultSize}} {
		if got := SizeFor(tc.limit, DefaultPercent); got != tc.want {
			t.Errorf("SizeFor(%d) = %d, want %d", tc.limit, got, tc.want)
		}
	}
}

func TestDrawAndReturn(t *testing.T) {
	b := New(100)
	if !b.Draw(50, nil) || b.Stats().InUse != 50 {
		t.Fatalf("50 of 100 drawn: %+v", b.Stats())
	}
	if b.Draw(51, nil) {
		t.Error("51 more fit in the 50 left")
	}
	// What the caller can free makes room: two frees of 25, and no refusal counted.
	cache := 2
	free := func() bool {
		if cache == 0 {
			return false
		}
		cache--
		b.Return(25)
		return true
	}
	if !b.Draw(100, free) || cache != 0 {
		t.Fatalf("a draw that fits once the cache is freed: %+v, %d cached", b.Stats(), cache)
	}
	if b.Draw(1, free) {
		t.Error("a draw fit in a full budget with nothing left to free")
	}
	b.Return(100)
	if st := b.Stats(); st.InUse != 0 || st.Refused != 2 {
		t.Errorf("after the return: %+v; want nothing in use, 2 refusals", st)
	}
	var none *Budget
	if !none.Draw(1<<40, nil) {
		t.Error("no budget refused a draw")
	}
	none.Return(1 << 40)
}

// TryDraw takes what fits and never counts a refused request.
func TestTryDrawCountsNoRefusal(t *testing.T) {
	b := New(100)
	if !b.TryDraw(60) || b.TryDraw(60) {
		t.Fatal("60 of 100 fits once")
	}
	if s := b.Stats(); s.InUse != 60 || s.Refused != 0 {
		t.Fatalf("stats %+v, want 60 in use and no refusal", s)
	}
	b.Return(60)
	if !b.TryDraw(100) {
		t.Fatal("the whole budget fits once given back")
	}
}
