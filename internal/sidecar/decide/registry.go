package decide

import (
	"container/heap"
	"container/list"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/redline-dev/redline/internal/sidecar/membudget"
)

// Registry keeps the holds of requests settled by a later call rather than by the sidecar
// itself: /v1/check's reserve and settle (by id), and Envoy's apply_on_stream_done (the oldest
// open hold of a key).
//
// It is bounded so that no key can fill it for others:
//
//   - In total by the sidecar's one memory budget (Memory): each hold kept draws HoldBytes
//     for each rule it holds for (h.Len()) until it is taken or forgotten. A hold that does
//     not fit is refused (ErrNoMemory). Without a memory budget, open holds (before their
//     deadline) are at most Max instead (ErrTooManyHolds); Max set beside a budget bounds them
//     too.
//   - Per key, under pressure: while less than half of the budget is in use by anything but
//     the late holds below (or fewer than Max/2 holds are open) any key may add one; past that, a key (each limiter key a hold is
//     under) that already has Share open holds is refused (ErrKeyShareFull). A single busy
//     key, such as a constant key counting everyone together, is not held to a small share
//     while nobody else needs the room, yet under pressure it can have taken at most half, and
//     every other key still gets its Share for as long as the memory allows. Keys as many as
//     the budget has shares can fill it, but no number of keys holding fewer than their Share
//     each refuses a victim anything the memory has room for.
//   - A hold past its deadline stays spent in Redis and no longer counts toward any bound
//     here; it is kept apart, at most Late of them and each at most Grace, for a late settle,
//     which settles it as a timely one would (limiter.Settled.Expired). Such holds still draw
//     on the memory budget, but give way: the oldest is forgotten first when an open hold (or
//     a late one beyond Late) has no room.
//
// A refused Put leaves the hold with its caller, who must give it back: a request is never
// admitted without a hold kept here.
type Registry struct {
	// Memory is the budget every hold kept draws HoldBytes from (nil: none, and Max bounds
	// the open holds).
	Memory *membudget.Budget
	// Max is the most open holds kept (0: none beside a memory budget, else
	// DefaultMaxHolds).
	Max int
	// Share is the most open holds one key keeps once half the memory budget is in use, or
	// Max/2 holds are open (default: a 64th of what the budget, or Max, has room for, at
	// least MinShare).
	Share int
	// Late is the most holds kept past their deadline for a late settle (default Max, or
	// DefaultMaxHolds).
	Late int
	// Grace is how long a hold is kept past its deadline for a late settle (default
	// DefaultGrace).
	Grace time.Duration
	// Now is the clock (default time.Now).
	Now func() time.Time
	// Refused, if set, hears of every Put refused, with its error (metrics).
	Refused func(error)

	mu    sync.Mutex
	byID  map[string]*entry
	byKey map[string]*list.List // of *entry, open and late, oldest first
	order deadlines             // open entries, soonest deadline first
	late  *list.List            // of *entry past their deadline, soonest deadline first
	// lateBytes is what the late entries draw from Memory: they give way, so no bound
	// counts them.
	lateBytes int64
	shares    map[string]int // open holds per limiter key
	owed      debts          // refused Envoy starts whose stream-done call is to come (Owe)
}

type entry struct {
	id       string
	key      string
	shares   []string // the limiter keys of its holds
	holds    *Holds
	deadline time.Time
	bytes    int64 // drawn from the memory budget
	inKey    *list.Element
	inLate   *list.Element // nil while open
	at       int           // index in order while open
}

// deadlines is a heap of entries by deadline.
type deadlines []*entry

func (d deadlines) Len() int           { return len(d) }
func (d deadlines) Less(i, j int) bool { return d[i].deadline.Before(d[j].deadline) }
func (d deadlines) Swap(i, j int) {
	d[i], d[j] = d[j], d[i]
	d[i].at, d[j].at = i, j
}
func (d *deadlines) Push(x any) {
	e := x.(*entry)
	e.at = len(*d)
	*d = append(*d, e)
}
func (d *deadlines) Pop() any {
	old := *d
	e := old[len(old)-1]
	old[len(old)-1] = nil
	*d = old[:len(old)-1]
	return e
}

// Registry defaults.
const (
	// HoldBytes is what a request's hold of one rule, kept past its decision until its
	// settle, draws from the memory budget (here, and in the proxy for its requests in
	// flight): the request's Holds and the limiter's Hold, the entry in the limiter's table
	// of open holds, a registry entry, and what a new key adds to the limiter's tables and the
	// registry's maps. Measured with 5,000 streams open: about 1,000 bytes each on 100 keys,
	// 1,200 each on a key of its own (TestHoldBytesCoversAHold holds the bound); the rest is
	// room for the maps' growth. At the injector's 64 MiB memory limit (a budget of 13.6 MiB)
	// that is about 9,300 open holds.
	HoldBytes = 1536
	// DefaultMaxHolds bounds the open holds of a registry without a memory budget, and the
	// late ones of any.
	DefaultMaxHolds = 16384
	DefaultGrace    = time.Minute
	// MinShare is the least default Share of a key.
	MinShare = 16
)

var (
	// ErrTooManyHolds is wrapped by Put's error when the registry is full of open holds.
	ErrTooManyHolds = errors.New("too many open holds on this sidecar")
	// ErrKeyShareFull is wrapped by Put's error when the hold's key has its share of open
	// holds and the registry is at least half full.
	ErrKeyShareFull = errors.New("this key has its share of open holds")
	// ErrNoMemory is wrapped by Put's error when the sidecar's memory budget has no room for
	// the hold.
	ErrNoMemory = errors.New("the sidecar's memory budget has no room for another open hold")
)

// RefusedError is the error of a Put refused: Err is ErrTooManyHolds, ErrKeyShareFull or
// ErrNoMemory.
type RefusedError struct {
	Err error
	// RetryAfter is when a hold in the way will have passed its deadline at the latest.
	RetryAfter time.Duration
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("%v: settle some first, or retry in %v", e.Err, e.RetryAfter.Round(time.Second))
}

func (e *RefusedError) Unwrap() error { return e.Err }

// Put keeps h until deadline under a new id, and as the newest open hold of key ("" for none).
// Its error is a *RefusedError when there is no room for it (see Registry); h is then not
// kept.
func (g *Registry) Put(h *Holds, key string, deadline time.Time) (string, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.init()
	now := g.now()
	g.sweep(now)
	e, err := g.put(h, key, deadline, now)
	if err != nil {
		return "", err
	}
	return e.id, nil
}

// PutSplit keeps each of ks (Holds.Split) under its key until its deadline, as the newest open
// hold of that key: all of them, or none when one does not fit. Its error is then the
// *RefusedError of the first that did not, and failed that one's index in ks.
func (g *Registry) PutSplit(ks []Keyed) (failed int, err error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.init()
	now := g.now()
	g.sweep(now)
	kept := make([]*entry, 0, len(ks))
	for i, k := range ks {
		e, err := g.put(k.Holds, k.Key, k.Holds.Deadline(), now)
		if err != nil {
			for _, e := range kept {
				g.remove(e)
			}
			return i, err
		}
		kept = append(kept, e)
	}
	return -1, nil
}

// put keeps h if it fits; g.mu is held.
func (g *Registry) put(h *Holds, key string, deadline, now time.Time) (*entry, error) {
	shares := h.limiterKeys()
	bytes := HoldBytes * int64(max(h.Len(), 1))
	err := g.room(shares, deadline, now)
	if err == nil && !g.Memory.Draw(bytes, g.forgetOldestLate) {
		err = &RefusedError{Err: ErrNoMemory, RetryAfter: g.soonest(now)}
	}
	if err != nil {
		if g.Refused != nil {
			g.Refused(err)
		}
		return nil, err
	}
	e := &entry{id: newHoldID(), key: key, shares: shares, holds: h, deadline: deadline, bytes: bytes}
	heap.Push(&g.order, e)
	for _, s := range shares {
		g.shares[s]++
	}
	if key != "" {
		l := g.byKey[key]
		if l == nil {
			l = list.New()
			g.byKey[key] = l
		}
		e.inKey = l.PushBack(e)
	}
	g.byID[e.id] = e
	return e, nil
}

// room says whether a hold under shares fits the bounds other than memory's.
func (g *Registry) room(shares []string, deadline, now time.Time) error {
	open, most := len(g.order), g.max()
	if most > 0 && open >= most {
		return &RefusedError{Err: ErrTooManyHolds, RetryAfter: g.soonest(now)}
	}
	if (most <= 0 || open < most/2) && !g.pressed() {
		return nil
	}
	share := g.share()
	for _, s := range shares {
		if g.shares[s] >= share {
			// The key's holds are of the same rule: they have all passed their deadline by the
			// time this one would.
			return &RefusedError{Err: ErrKeyShareFull, RetryAfter: max(deadline.Sub(now), time.Second)}
		}
	}
	return nil
}

// Take removes and returns the hold of id, open or past its deadline; nil when there is none
// (never kept, settled already, or forgotten).
func (g *Registry) Take(id string) *Holds {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.init()
	g.sweep(g.now())
	e := g.byID[id]
	if e == nil {
		return nil
	}
	g.remove(e)
	return e.holds
}

// TakeOldest removes and returns the oldest hold of key, open or past its deadline; nil when
// there is none.
func (g *Registry) TakeOldest(key string) *Holds {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.init()
	g.sweep(g.now())
	l := g.byKey[key]
	if l == nil {
		return nil
	}
	e := l.Front().Value.(*entry)
	g.remove(e)
	return e.holds
}

// Len is how many holds are kept, open or past their deadline.
func (g *Registry) Len() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.byID)
}

// Open is how many holds are kept that have not passed their deadline: what the bounds count.
func (g *Registry) Open() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.init()
	g.sweep(g.now())
	return len(g.order)
}

func (g *Registry) init() {
	if g.byID == nil {
		g.byID, g.byKey, g.shares, g.late = map[string]*entry{}, map[string]*list.List{}, map[string]int{}, list.New()
	}
}

// pressed says whether half the memory budget is in use by anything but the late holds.
func (g *Registry) pressed() bool {
	st := g.Memory.Stats()
	return st.Size > 0 && st.InUse-g.lateBytes >= st.Size/2
}

// soonest is when the first open hold passes its deadline (and so gives way), at least a
// second from now.
func (g *Registry) soonest(now time.Time) time.Duration {
	if len(g.order) == 0 {
		return time.Second
	}
	return max(g.order[0].deadline.Sub(now), time.Second)
}

// max is the most open holds, 0 for no count (a memory budget bounds them).
func (g *Registry) max() int {
	switch {
	case g.Max > 0:
		return g.Max
	case g.Memory != nil:
		return 0
	}
	return DefaultMaxHolds
}

func (g *Registry) share() int {
	if g.Share > 0 {
		return g.Share
	}
	room := g.max()
	if room <= 0 {
		room = int(g.Memory.Stats().Size / HoldBytes) // holds of one rule
	}
	return max(room/64, MinShare)
}

func (g *Registry) lateMax() int {
	if g.Late > 0 {
		return g.Late
	}
	if g.Max > 0 {
		return g.Max
	}
	return DefaultMaxHolds
}

// forgetOldestLate forgets the late hold nearest its end of grace to make room in the memory
// budget (membudget.Budget.Draw's free); false when there is none. g.mu is held.
func (g *Registry) forgetOldestLate() bool {
	if g.late.Len() == 0 {
		return false
	}
	g.remove(g.late.Front().Value.(*entry))
	return true
}

func (g *Registry) now() time.Time {
	if g.Now != nil {
		return g.Now()
	}
	return time.Now()
}

// sweep moves the holds past their deadline out of the bounds into the late ones, soonest
// first, and forgets late holds past their grace or beyond Late, oldest first: O(log n) for
// each hold moved.
func (g *Registry) sweep(now time.Time) {
	g.owed.tick(now)
	for len(g.order) > 0 && !now.Before(g.order[0].deadline) {
		e := heap.Pop(&g.order).(*entry)
		g.unshare(e)
		e.inLate = g.late.PushBack(e)
		g.lateBytes += e.bytes
	}
	grace := g.Grace
	if grace <= 0 {
		grace = DefaultGrace
	}
	for g.late.Len() > 0 {
		e := g.late.Front().Value.(*entry)
		if g.late.Len() <= g.lateMax() && now.Before(e.deadline.Add(grace)) {
			break
		}
		g.remove(e)
	}
}

func (g *Registry) unshare(e *entry) {
	for _, s := range e.shares {
		if g.shares[s]--; g.shares[s] <= 0 {
			delete(g.shares, s)
		}
	}
}

func (g *Registry) remove(e *entry) {
	delete(g.byID, e.id)
	g.Memory.Return(e.bytes)
	if e.inLate != nil {
		g.late.Remove(e.inLate)
		g.lateBytes -= e.bytes
	} else {
		heap.Remove(&g.order, e.at)
		g.unshare(e)
	}
	if e.inKey != nil {
		l := g.byKey[e.key]
		l.Remove(e.inKey)
		if l.Len() == 0 {
			delete(g.byKey, e.key)
		}
	}
}

// limiterKeys are the distinct limiter keys h holds under: the shares it counts toward.
func (h *Holds) limiterKeys() []string {
	if h == nil {
		return nil
	}
	keys := make([]string, 0, len(h.holds))
	for _, x := range h.holds {
		dup := false
		for _, k := range keys {
			dup = dup || k == x.key
		}
		if !dup {
			keys = append(keys, x.key)
		}
	}
	return keys
}

// newHoldID is 128 random bits: a client cannot settle another's hold by guessing its id.
func newHoldID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return base64.RawURLEncoding.EncodeToString(b[:])
}
