package limiter

import (
	"container/heap"
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// holdTable is this replica's open holds whose units its share counts (see shares.go), until
// their deadline: Stats.HoldsOpen and the lapsed count (a hold that reached its deadline unsettled:
// its holder is taken for dead in Redis, and its units stay spent there and in the share).
//
// Bounded: at most max holds. A hold beyond the bound keeps no share at all (its units are
// Stats.UnkeptShareUnits, as a grant beyond ShareKeys): a failover cannot restore them. A heap
// by deadline, so that the check every call makes (lapse) is one atomic load while no hold is
// due.
type holdTable struct {
	mu   sync.Mutex
	max  int
	h    holdHeap
	next atomic.Int64 // UnixNano of the earliest deadline; MaxInt64 while empty
	// lapsed counts the holds that reached their deadline in the table, unsettled.
	lapsed atomic.Uint64
}

// openHold is one hold the share counts: units granted to key in the window starting at start.
type openHold struct {
	key      string
	window   time.Duration
	start    int64
	units    int64
	deadline time.Time // local clock, no later than Redis's deadline
	idx      int       // in the heap; -1 once out of it
}

func newHoldTable(maxHolds int) *holdTable {
	t := &holdTable{max: maxHolds}
	t.next.Store(math.MaxInt64)
	return t
}

// add puts e in the table, or returns false when it is full.
func (t *holdTable) add(e *openHold) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.h) >= t.max {
		return false
	}
	heap.Push(&t.h, e)
	t.next.Store(t.h[0].deadline.UnixNano())
	return true
}

// remove takes e out of the table, if it is still in it (not yet lapsed).
func (t *holdTable) remove(e *openHold) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if e.idx < 0 || e.idx >= len(t.h) || t.h[e.idx] != e {
		return
	}
	heap.Remove(&t.h, e.idx)
	t.updateNext()
}

// due takes out every hold whose deadline is not after now.
func (t *holdTable) due(now time.Time) []*openHold {
	if now.UnixNano() < t.next.Load() {
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []*openHold
	for len(t.h) > 0 && !t.h[0].deadline.After(now) {
		out = append(out, heap.Pop(&t.h).(*openHold))
	}
	t.updateNext()
	t.lapsed.Add(uint64(len(out)))
	return out
}

func (t *holdTable) updateNext() {
	if len(t.h) == 0 {
		t.next.Store(math.MaxInt64)
		return
	}
	t.next.Store(t.h[0].deadline.UnixNano())
}

func (t *holdTable) len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.h)
}

type holdHeap []*openHold

func (h holdHeap) Len() int           { return len(h) }
func (h holdHeap) Less(i, j int) bool { return h[i].deadline.Before(h[j].deadline) }
func (h holdHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].idx, h[j].idx = i, j
}
func (h *holdHeap) Push(x any) {
	e := x.(*openHold)
	e.idx = len(*h)
	*h = append(*h, e)
}
func (h *holdHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	e.idx = -1
	return e
}
