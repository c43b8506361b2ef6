package decide

import (
	"container/list"
	"context"
	"errors"
	"sync"
	"time"

	"github.com/redline-dev/redline/internal/sidecar/membudget"
)

// SlotRegistry keeps the in-flight slots of requests that end by a later call rather than in
// the sidecar: /v1/check's acquire, renew and release (by id), and Envoy's
// apply_on_stream_done (the oldest slot of a key, given back by the descriptor's negative hits).
//
// A slot kept here is still a slot of the limiter: the limiter renews it in Redis with all the
// others of this replica while it is kept, so it counts as long as its client does. What the
// client owes is a lease: an entry not renewed (Renew) before its lease runs out is released by
// Sweep, which Run calls every second. A client that never comes back (a gateway that crashed,
// an Envoy restarted mid-stream) so holds its slot at most one lease and a second; a sidecar
// that dies holds it at most the limiter's slot expiry after its last renewal.
//
// Bounds, with the sidecar's one memory budget (Memory): each entry draws HoldBytes for each
// slot it keeps, as a hold kept for a settle does; one that does not fit is refused
// (ErrNoMemory) and its caller gives its slots back. Without a memory budget, Max bounds the
// entries (ErrTooManySlots). Ids are 128 random bits: an id is found only by whoever it was
// given to, never guessed into someone else's slot.
//
// A face's clients must not starve the others (the proxy, the other face) by keeping slots:
// MaxSlots and MaxBytes cap one registry's share of the limiter's slot table and of the memory
// budget; no key keeps more slots here than its rule's limit (ErrKeyFull), so one tenant's
// keys hold at most what their rules allow; and MaxRenew bounds how long a client may keep one
// id alive by renewing it (ErrRenewLimit).
type SlotRegistry struct {
	// Memory is the budget every entry draws from (nil: none, and Max bounds the entries).
	Memory *membudget.Budget
	// Max is the most entries kept (0: none beside a memory budget, else DefaultMaxHolds).
	Max int
	// MaxSlots is the most slots kept over all entries (0: no bound but Max): this face's
	// share of the limiter's slot table.
	MaxSlots int
	// MaxBytes is the most the entries draw from Memory (0: no bound but Memory's): this
	// face's share of the memory budget.
	MaxBytes int64
	// MaxRenew is how long an entry may be kept from its Put, renewals included (0: no
	// bound): a renew past it answers ErrRenewLimit and gives the slots back, and no lease
	// runs past it.
	MaxRenew time.Duration
	// Lease is how long an entry is kept without a renewal.
	Lease time.Duration
	// Now is the clock (default time.Now).
	Now func() time.Time
	// Expired, if set, hears of every entry released for its lease running out (metrics).
	Expired func(slots int)

	mu    sync.Mutex
	byID  map[string]*slotEntry
	byKey map[string]*list.List // of *slotEntry, oldest first; entries put with a key only
	// owed is the refused start calls whose stream-done call is still to come (see Owe).
	owed debts
	// slots and bytes are what all entries keep and draw; perKey counts the slots kept of
	// each limiter key.
	slots  int
	bytes  int64
	perKey map[string]int
}

type slotEntry struct {
	id, key     string
	slots       *Slots
	born        time.Time // its Put, from which MaxRenew counts
	deadline    time.Time
	bytes       int64
	inKey       *list.Element
	limiterKeys []string // of each slot it keeps
}

// ErrTooManySlots is wrapped by Put's error when a registry without a memory budget is full.
var ErrTooManySlots = errors.New("too many in-flight slots kept on this sidecar")

// ErrKeyFull is wrapped by Put's error when a key of the slots keeps as many here as its rule
// allows already (kept entries whose slots were lost and not yet renewed or swept).
var ErrKeyFull = errors.New("this key keeps as many in-flight slots on this sidecar as its rule allows")

// ErrRenewLimit is the error of Renew for an entry kept MaxRenew already: it is released, and
// its request should end.
var ErrRenewLimit = errors.New("slot renewed for as long as this sidecar allows (--in-flight-max-renew): it is released; end the request")

// ErrNoSuchSlot is the error of Renew for an id that names no entry.
var ErrNoSuchSlot = errors.New("no such slot: released already, or its lease ran out")

// ErrSlotLost is the error of Renew for an entry whose slot stopped counting (Redis no longer
// held it, or it could not be renewed in time): it is released, and its request should end.
var ErrSlotLost = errors.New("slot lost: it stopped counting before its release; end the request")

func (g *SlotRegistry) now() time.Time {
	if g.Now != nil {
		return g.Now()
	}
	return time.Now()
}

// Put keeps s under a new id until its lease runs out, and as the newest entry of key ("" for
// none). Its error is a *RefusedError when there is no room for it; s is then not kept, and
// its caller releases it.
func (g *SlotRegistry) Put(s *Slots, key string) (id string, deadline time.Time, err error) {
	now := g.now()
	bytes := HoldBytes * int64(max(s.Held(), 1))
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.byID == nil {
		g.byID, g.byKey = map[string]*slotEntry{}, map[string]*list.List{}
	}
	limit := g.Max
	if limit == 0 && g.Memory == nil {
		limit = DefaultMaxHolds
	}
	keys, limits := s.keyed()
	switch {
	case limit > 0 && len(g.byID) >= limit, g.MaxSlots > 0 && g.slots+len(keys) > g.MaxSlots:
		return "", time.Time{}, &RefusedError{Err: ErrTooManySlots, RetryAfter: g.Lease}
	case g.MaxBytes > 0 && g.bytes+bytes > g.MaxBytes:
		return "", time.Time{}, &RefusedError{Err: ErrNoMemory, RetryAfter: g.Lease}
	}
	for i, k := range keys {
		if g.perKey[k]+count(keys, k) > int(limits[i]) {
			return "", time.Time{}, &RefusedError{Err: ErrKeyFull, RetryAfter: g.Lease}
		}
	}
	if !g.Memory.Draw(bytes, nil) {
		return "", time.Time{}, &RefusedError{Err: ErrNoMemory, RetryAfter: g.Lease}
	}
	e := &slotEntry{id: newHoldID(), key: key, slots: s, born: now, bytes: bytes, limiterKeys: keys}
	e.deadline = g.leaseEnd(e, now)
	g.byID[e.id] = e
	g.slots, g.bytes = g.slots+len(keys), g.bytes+bytes
	if g.perKey == nil {
		g.perKey = map[string]int{}
	}
	for _, k := range keys {
		g.perKey[k]++
	}
	if key != "" {
		l := g.byKey[key]
		if l == nil {
			l = list.New()
			g.byKey[key] = l
		}
		e.inKey = l.PushBack(e)
	}
	return e.id, e.deadline, nil
}

// Renew extends the lease of id's entry from now, and answers how many slots it holds and its
// new deadline. ErrNoSuchSlot: no entry has that id. ErrSlotLost: its slot stopped counting;
// the entry is gone and its slots are given back.
func (g *SlotRegistry) Renew(ctx context.Context, id string) (held int, deadline time.Time, err error) {
	now := g.now()
	g.mu.Lock()
	e := g.byID[id]
	switch {
	case e == nil:
		g.mu.Unlock()
		return 0, time.Time{}, ErrNoSuchSlot
	case e.slots.LostAny():
		g.remove(e)
		g.mu.Unlock()
		e.slots.Release(ctx)
		return 0, time.Time{}, ErrSlotLost
	case g.MaxRenew > 0 && !now.Before(e.born.Add(g.MaxRenew)):
		g.remove(e)
		g.mu.Unlock()
		e.slots.Release(ctx)
		return 0, time.Time{}, ErrRenewLimit
	}
	e.deadline = g.leaseEnd(e, now)
	held, deadline = e.slots.Held(), e.deadline
	g.mu.Unlock()
	return held, deadline, nil
}

// Take takes id's entry out, or returns nil when there is none; its caller releases it.
func (g *SlotRegistry) Take(id string) *Slots {
	g.mu.Lock()
	defer g.mu.Unlock()
	e := g.byID[id]
	if e == nil {
		return nil
	}
	g.remove(e)
	return e.slots
}

// TakeOldest takes out the oldest entry put under key, or returns nil when there is none.
func (g *SlotRegistry) TakeOldest(key string) *Slots {
	g.mu.Lock()
	defer g.mu.Unlock()
	l := g.byKey[key]
	if l == nil {
		return nil
	}
	e := l.Front().Value.(*slotEntry)
	g.remove(e)
	return e.slots
}

// remove forgets e and returns what it drew; g.mu is held.
func (g *SlotRegistry) remove(e *slotEntry) {
	delete(g.byID, e.id)
	if e.inKey != nil {
		l := g.byKey[e.key]
		l.Remove(e.inKey)
		if l.Len() == 0 {
			delete(g.byKey, e.key)
		}
	}
	g.Memory.Return(e.bytes)
	g.slots, g.bytes = g.slots-len(e.limiterKeys), g.bytes-e.bytes
	for _, k := range e.limiterKeys {
		if g.perKey[k]--; g.perKey[k] <= 0 {
			delete(g.perKey, k)
		}
	}
}

// leaseEnd is when e's lease, renewed at now, runs out: a lease from now, and never past
// MaxRenew from its Put.
func (g *SlotRegistry) leaseEnd(e *slotEntry, now time.Time) time.Time {
	end := now.Add(g.Lease)
	if g.MaxRenew > 0 {
		end = minTime(end, e.born.Add(g.MaxRenew))
	}
	return end
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// count is how many times k is in keys.
func count(keys []string, k string) int {
	n := 0
	for _, x := range keys {
		if x == k {
			n++
		}
	}
	return n
}

// Len is how many entries are kept, and how many slots they hold.
func (g *SlotRegistry) Len() (entries, slots int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, e := range g.byID {
		slots += e.slots.Held()
	}
	return len(g.byID), slots
}

// Sweep releases every entry whose lease ran out before now, and says how many slots went back.
// The walk is over every entry: they are at most what the memory budget (or Max) has room for.
func (g *SlotRegistry) Sweep(ctx context.Context) int {
	now := g.now()
	var gone []*Slots
	g.mu.Lock()
	for _, e := range g.byID {
		if now.After(e.deadline) {
			g.remove(e)
			gone = append(gone, e.slots)
		}
	}
	g.mu.Unlock()
	n := 0
	for _, s := range gone {
		n += s.Held()
		s.Release(ctx)
	}
	if n > 0 && g.Expired != nil {
		g.Expired(n)
	}
	return n
}

// Run sweeps every second until ctx ends, then releases every entry: the sidecar is stopping,
// and nobody will release them.
func (g *SlotRegistry) Run(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			g.releaseAll(context.WithoutCancel(ctx))
			return
		case <-t.C:
			g.Sweep(ctx)
			g.sweepOwed()
		}
	}
}

func (g *SlotRegistry) releaseAll(ctx context.Context) {
	g.mu.Lock()
	var all []*Slots
	for _, e := range g.byID {
		g.remove(e)
		all = append(all, e.slots)
	}
	g.mu.Unlock()
	for _, s := range all {
		s.Release(ctx)
	}
}
