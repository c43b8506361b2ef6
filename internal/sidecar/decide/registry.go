package decide

import (
	"container/heap"
	"container/list"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"sync"
	"time"
)

// Registry keeps the holds of requests settled by a later call rather than by the sidecar
// itself: /v1/check's reserve and settle (by id), and Envoy's apply_on_stream_done (the oldest
// open hold of a key). It is bounded: a hold is forgotten Grace after its deadline, and a full
// registry refuses to keep more, so that a client that reserves and never settles costs at most
// Max entries. A hold settled after its deadline but before it is forgotten went back by itself
// in Redis already, and its settle charges what was used in full (limiter.Settled.Expired).
type Registry struct {
	// Max is the most open holds kept (default 16384).
	Max int
	// Grace is how long a hold is kept past its deadline for a late settle (default
	// DefaultGrace).
	Grace time.Duration
	// Now is the clock (default time.Now).
	Now func() time.Time

	mu    sync.Mutex
	byID  map[string]*entry
	byKey map[string]*list.List // of *entry, oldest first
	order deadlines             // every entry, soonest deadline first
}

type entry struct {
	id       string
	key      string
	holds    *Holds
	deadline time.Time
	inKey    *list.Element
	at       int // index in order
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

// Registry defaults. An entry costs about 300 bytes with its holds.
const (
	DefaultMaxHolds = 16384
	DefaultGrace    = time.Minute
)

// ErrTooManyHolds is returned by Put when the registry is full of open holds.
var ErrTooManyHolds = errors.New("too many open holds: settle some first")

// Put keeps h until deadline under a new id, and as the newest open hold of key ("" for none).
func (g *Registry) Put(h *Holds, key string, deadline time.Time) (string, error) {
	id := newHoldID()
	g.mu.Lock()
	defer g.mu.Unlock()
	g.init()
	g.sweep()
	if len(g.byID) >= g.max() {
		return "", ErrTooManyHolds
	}
	e := &entry{id: id, key: key, holds: h, deadline: deadline}
	heap.Push(&g.order, e)
	if key != "" {
		l := g.byKey[key]
		if l == nil {
			l = list.New()
			g.byKey[key] = l
		}
		e.inKey = l.PushBack(e)
	}
	g.byID[id] = e
	return id, nil
}

// Take removes and returns the hold of id; nil when there is none (never kept, settled
// already, or forgotten).
func (g *Registry) Take(id string) *Holds {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.init()
	g.sweep()
	e := g.byID[id]
	if e == nil {
		return nil
	}
	g.remove(e)
	return e.holds
}

// TakeOldest removes and returns the oldest hold of key; nil when there is none.
func (g *Registry) TakeOldest(key string) *Holds {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.init()
	g.sweep()
	l := g.byKey[key]
	if l == nil {
		return nil
	}
	e := l.Front().Value.(*entry)
	g.remove(e)
	return e.holds
}

// Len is how many holds are kept.
func (g *Registry) Len() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.byID)
}

func (g *Registry) init() {
	if g.byID == nil {
		g.byID, g.byKey = map[string]*entry{}, map[string]*list.List{}
	}
}

func (g *Registry) max() int {
	if g.Max > 0 {
		return g.Max
	}
	return DefaultMaxHolds
}

func (g *Registry) now() time.Time {
	if g.Now != nil {
		return g.Now()
	}
	return time.Now()
}

// sweep forgets holds Grace past their deadline, soonest first: O(log n) for each one freed.
func (g *Registry) sweep() {
	grace := g.Grace
	if grace <= 0 {
		grace = DefaultGrace
	}
	now := g.now()
	for len(g.order) > 0 && !now.Before(g.order[0].deadline.Add(grace)) {
		g.remove(g.order[0])
	}
}

func (g *Registry) remove(e *entry) {
	delete(g.byID, e.id)
	heap.Remove(&g.order, e.at)
	if e.inKey != nil {
		l := g.byKey[e.key]
		l.Remove(e.inKey)
		if l.Len() == 0 {
			delete(g.byKey, e.key)
		}
	}
}

// newHoldID is 128 random bits: a client cannot settle another's hold by guessing its id.
func newHoldID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return base64.RawURLEncoding.EncodeToString(b[:])
}
