package limiter

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redline-dev/redline/internal/limiter/scripts"
)

// In-flight limits: at most N requests of a key in progress at once, over every replica.
//
// A slot is a hold of one unit that goes back, not charged, when its request ends. It shares
// with holds (hold.go) the way it is named (<replica id>:<tag><seq>, the same sequence), the
// record beside the key on its hash slot in a zset scored by a deadline on Redis's clock, the
// sweep of a few dead records per call and the bound checked in one ZCOUNT (lua/hold_bound.lua
// counts open holds the same way). They differ in what an expiry means: a hold past its deadline
// counts as spent (its request may have been served), a slot past its expiry is released (a
// request no longer running takes no slot), so slots are renewed while their request runs, and
// holds never are.
//
//   - Acquire takes a slot in one script (lua/slot_acquire.lua): sweep up to 16 expired
//     members, count the live ones (ZCOUNT, O(log n) whatever the key holds), and add the
//     slot scored by now + SlotExpiry when fewer than N are live. Atomic in Redis, on Redis's
//     clock: in_flight(key) <= N at every instant, over every replica.
//   - Release takes it off with one ZREM: the slot is free at once.
//   - Every SlotExpiry/4 the replica renews all its slots (slotRenewer): one EVALSHA of
//     lua/slot_renew.lua per key (512 ids a call at most), all of them in one pipeline (one per
//     node on a cluster). A slot found expired is lost: another request may hold its place, so
//     it is not renewed, and its Slot's Lost channel closes: the face ends its request.
//   - A slot whose renewals fail (Redis unreachable, a partition) is given up on the local
//     clock before Redis lets it go: when its expiry would pass before the next renewal, its
//     Lost channel closes. A SIGKILLed replica renews nothing: its slots return at most
//     SlotExpiry after their last renewal, and never while it lives and renews them.
//
// Bounds: a key's zset holds at most N live members plus what expired (swept 16 a call, and
// the key expires SlotExpiry after its last write); a replica holds at most MaxSlots slots
// (ErrSlotsFull beyond); a slot id is at most 100 bytes.

// DefaultSlotExpiry is Options.SlotExpiry when not set: a dead replica's slots return within
// 10 s, renewed every 2.5 s.
const DefaultSlotExpiry = 10 * time.Second

// DefaultMaxSlots is Options.MaxSlots when not set.
const DefaultMaxSlots = 65536

// MaxInFlight is the most an in-flight limit may be.
const MaxInFlight = 100_000

const (
	minSlotExpiry = 2 * time.Second
	maxSlotExpiry = 10 * time.Minute
	// slotRenewIDs is the most ids one renewal call carries (lua/slot_renew.lua reads no more).
	slotRenewIDs = 512
	// slotReleaseTimeout bounds a release: its request is over, whatever its client does.
	slotReleaseTimeout = 2 * time.Second
)

// ErrSlotsFull is the SlotResult.Err of an Acquire refused because the replica holds MaxSlots
// slots already.
var ErrSlotsFull = errors.New("this replica holds as many in-flight slots as it may")

// slotScripts are the slot scripts, for Exec to load after NOSCRIPT.
var slotScripts = []scripts.Script{scripts.SlotAcquire(), scripts.SlotRenew()}

// InFlight is an in-flight limit.
type InFlight struct {
	// Max is the most requests of a key in progress at once, 1 to MaxInFlight.
	Max         int64
	FailureMode FailureMode
	// Shadow takes slots and reports a full key, but never refuses.
	Shadow bool
}

// SlotResult is what an Acquire decided.
type SlotResult struct {
	// Allowed says the request may proceed (with a slot, or by its failure mode or shadow).
	Allowed bool
	// Full says the key had Max requests in progress (the request would be refused).
	Full bool
	// InUse is how many slots of the key were taken after the call (as Redis counted them).
	InUse int64
	// RetryAfter is how long a refused request should wait: a slot may free at any time.
	RetryAfter time.Duration
	// Err is why Redis did not decide (the failure mode did), or ErrSlotsFull.
	Err error
}

// Slot is one request's place among its key's in-flight requests. Release it when the
// request ends.
type Slot struct {
	key, id  string
	book     *slotBook // of the limiter that took it, whichever releases it
	lost     chan struct{}
	lostOnce sync.Once
	done     atomic.Bool
	deadline atomic.Int64 // UnixNano on the local clock by which it must be renewed
}

// Lost is closed when the slot stopped counting before its release: Redis found it expired at
// a renewal, or it could not be renewed before its expiry. Its request should end, since
// another may hold its place.
func (s *Slot) Lost() <-chan struct{} { return s.lost }

// Key is the limiter key the slot counts under.
func (s *Slot) Key() string { return s.key }

func (s *Slot) lose() { s.lostOnce.Do(func() { close(s.lost) }) }

// Acquire takes a slot of key under lim. Refused (Full, not Shadow): no Slot. While Redis cannot
// be asked, the failure mode decides without a slot: Closed refuses, Open and LocalFallback
// admit (LocalFallback keeps no local in-flight count yet).
func (l *Limiter) Acquire(ctx context.Context, key string, lim InFlight) (SlotResult, *Slot, error) {
	if lim.Max < 1 || lim.Max > MaxInFlight {
		return SlotResult{}, nil, fmt.Errorf("%w: in-flight max %d not in 1..%d", ErrInvalidLimit, lim.Max, MaxInFlight)
	}
	if l.closed.Load() {
		return SlotResult{}, nil, ErrClosed
	}
	s := &Slot{key: key, book: l.slotBook, lost: make(chan struct{}),
		id: l.opts.ReplicaID + ":" + l.holdTag + strconv.FormatUint(l.holdSeq.Add(1), 36)}
	// Counted against MaxSlots at once, but in the book (which the renewals read) only once
	// Redis holds it: a renewal before the ZADD would find it missing and lose it.
	if !l.slotBook.take() {
		return l.slotFailure(lim, ErrSlotsFull), nil, nil
	}
	ttl := l.opts.SlotExpiry
	s.deadline.Store(time.Now().Add(ttl).UnixNano())
	cmd := scripts.EvalSha(ctx, scripts.SlotAcquire(), []string{key}, s.id, lim.Max, ttl.Milliseconds(), MaxInFlight)
	cmds := []redis.Cmder{cmd}
	sent := scripts.Exec(ctx, l.client, cmds, slotScripts)
	l.stats.pipelines.Add(sent.RoundTrips)
	l.stats.scriptLoads.Add(sent.Loads)
	vals, err := cmds[0].(*redis.Cmd).Int64Slice()
	if err == nil && len(vals) != 3 {
		err = fmt.Errorf("%w: slot acquire answered %d values", errBadReply, len(vals))
	}
	if err != nil {
		l.slotBook.untake()
		// The script may have run: take the slot off in case it did.
		l.releaseID(ctx, key, s.id)
		return l.slotFailure(lim, fmt.Errorf("taking an in-flight slot: %w", err)), nil, nil
	}
	l.stats.redis.Add(1)
	res := SlotResult{Allowed: vals[0] == 1, InUse: vals[1]}
	if !res.Allowed {
		l.slotBook.untake()
		res.Full, res.RetryAfter = true, time.Second
		res.Allowed = lim.Shadow
		return res, nil, nil
	}
	l.slotBook.put(s)
	return res, s, nil
}

// slotFailure is the failure mode's decision without a slot.
func (l *Limiter) slotFailure(lim InFlight, err error) SlotResult {
	l.stats.degraded.Add(1)
	r := SlotResult{Allowed: true, Err: err}
	if lim.FailureMode == FailureModeClosed || errors.Is(err, ErrSlotsFull) {
		r = SlotResult{Allowed: lim.Shadow, Full: true, RetryAfter: time.Second, Err: err}
	}
	return r
}

// Release gives the slot back at once (one ZREM). It never fails: a slot that cannot be taken
// off stops being renewed and returns at its expiry. Later calls do nothing.
func (l *Limiter) Release(ctx context.Context, s *Slot) {
	if s == nil || !s.done.CompareAndSwap(false, true) {
		return
	}
	s.book.remove(s)
	l.releaseID(ctx, s.key, s.id) // a lost slot too: given up locally, it may still be in Redis
}

func (l *Limiter) releaseID(ctx context.Context, key, id string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), slotReleaseTimeout)
	defer cancel()
	if err := l.client.ZRem(ctx, key, id).Err(); err != nil {
		l.slotStats.releaseErrors.Add(1)
	}
}

// SlotStats counts what the in-flight slots did.
type SlotStats struct {
	// Held is how many slots this replica holds now.
	Held int
	// Renewals counts renewal rounds, RenewErrors the renewal calls that failed.
	Renewals, RenewErrors uint64
	// Lost counts slots lost before their release (expired in Redis, or not renewed in time).
	Lost uint64
	// ReleaseErrors counts releases that failed (their slot returned at its expiry).
	ReleaseErrors uint64
}

type slotCounters struct {
	renewals, renewErrors, lost, releaseErrors atomic.Uint64
}

// SlotStats returns the slots' counters.
func (l *Limiter) SlotStats() SlotStats {
	return SlotStats{
		Held: l.slotBook.len(), Renewals: l.slotStats.renewals.Load(), RenewErrors: l.slotStats.renewErrors.Load(),
		Lost: l.slotStats.lost.Load(), ReleaseErrors: l.slotStats.releaseErrors.Load(),
	}
}

// slotRenewer renews every slot this replica holds each SlotExpiry/4, until Close.
func (l *Limiter) slotRenewer() {
	every := l.opts.SlotExpiry / 4
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-l.quit:
			return
		case <-t.C:
			l.renewSlots(every)
		}
	}
}

// renewSlots renews every held slot in one pipeline, and loses those Redis found expired and
// those whose expiry would pass before the next round.
func (l *Limiter) renewSlots(every time.Duration) {
	byKey := l.slotBook.snapshot()
	if len(byKey) == 0 {
		return
	}
	l.slotStats.renewals.Add(1)
	ttl := l.opts.SlotExpiry
	ctx, cancel := context.WithTimeout(context.Background(), every)
	defer cancel()
	var cmds []redis.Cmder
	var sent [][]*Slot
	for key, slots := range byKey {
		for len(slots) > 0 {
			n := min(len(slots), slotRenewIDs)
			args := make([]any, 0, n+1)
			args = append(args, ttl.Milliseconds())
			for _, s := range slots[:n] {
				args = append(args, s.id)
			}
			cmds = append(cmds, scripts.EvalSha(ctx, scripts.SlotRenew(), []string{key}, args...))
			sent = append(sent, slots[:n])
			slots = slots[n:]
		}
	}
	start := time.Now()
	l.stats.scriptLoads.Add(scripts.Exec(ctx, l.client, cmds, slotScripts).Loads)
	for i, cmd := range cmds {
		lost, err := cmd.(*redis.Cmd).StringSlice()
		if err != nil {
			l.slotStats.renewErrors.Add(1)
			continue
		}
		gone := make(map[string]bool, len(lost))
		for _, id := range lost {
			gone[id] = true
		}
		for _, s := range sent[i] {
			if gone[s.id] {
				l.loseSlot(s)
				continue
			}
			s.deadline.Store(start.Add(ttl).UnixNano())
		}
	}
	// A slot not renewed in time is given up before Redis lets it go: its expiry would pass
	// before the next round could renew it.
	horizon := time.Now().Add(every + every/2).UnixNano()
	for _, slots := range byKey {
		for _, s := range slots {
			if s.deadline.Load() < horizon {
				l.loseSlot(s)
			}
		}
	}
}

// loseSlot ends a slot that stopped counting before its release.
func (l *Limiter) loseSlot(s *Slot) {
	if s.done.Load() || !l.slotBook.remove(s) {
		return // released meanwhile (the renewal found it gone), or lost already
	}
	l.slotStats.lost.Add(1)
	s.lose()
}

// slotBook is the slots this replica holds, by key, at most max.
type slotBook struct {
	mu    sync.Mutex
	max   int
	n     int
	byKey map[string]map[*Slot]struct{}
}

func newSlotBook(maxSlots int) *slotBook {
	return &slotBook{max: maxSlots, byKey: map[string]map[*Slot]struct{}{}}
}

// take counts one more slot, or says the book is full.
func (b *slotBook) take() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.n >= b.max {
		return false
	}
	b.n++
	return true
}

// untake undoes a take whose slot was not granted.
func (b *slotBook) untake() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.n--
}

// put records a taken slot that Redis granted.
func (b *slotBook) put(s *Slot) {
	b.mu.Lock()
	defer b.mu.Unlock()
	m := b.byKey[s.key]
	if m == nil {
		m = map[*Slot]struct{}{}
		b.byKey[s.key] = m
	}
	m[s] = struct{}{}
}

// remove takes s out of the book, and says whether it was in it.
func (b *slotBook) remove(s *Slot) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	m := b.byKey[s.key]
	if _, ok := m[s]; !ok {
		return false
	}
	delete(m, s)
	b.n--
	if len(m) == 0 {
		delete(b.byKey, s.key)
	}
	return true
}

func (b *slotBook) len() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.n
}

func (b *slotBook) snapshot() map[string][]*Slot {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make(map[string][]*Slot, len(b.byKey))
	for k, m := range b.byKey {
		ss := make([]*Slot, 0, len(m))
		for s := range m {
			ss = append(ss, s)
		}
		out[k] = ss
	}
	return out
}
