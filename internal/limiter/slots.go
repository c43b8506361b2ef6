package limiter

import (
	"cmp"
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
//     clock: in_flight(key) <= N at every instant, over every replica. The same call keeps
//     the key's line of waiting requests (slotline.go): the live slots plus the waiters ahead
//     must be fewer than N, so a freed slot goes to the replicas' waiters in turn. A renewal
//     does not look at the line: the slot it re-asserts is a request running already.
//   - Release takes it off with one ZREM: the slot is free at once.
//   - Every SlotExpiry/4 the replica renews all its slots (slotRenewer): one EVALSHA of
//     lua/slot_renew.lua per key (512 ids a call at most), all of them in one pipeline (one per
//     node on a cluster).
//   - Re-asserted as shares are: a slot Redis no longer counts (a failover to a replica that
//     had not received it, a restart) is added back by the renewal when its key has room, so
//     its request runs on. Without room another request holds its place: the slot is lost, and
//     its Slot's Lost channel closes: the face ends its request. After this replica saw Redis
//     fail (a call or a renewal, or a loss another replica signalled through Reassert) or its
//     client saw the node change (Options.NodeChanges: a Cluster slot moved, a Sentinel master
//     switched, which the client follows without failing a call), it renews all its slots
//     before it takes another, so that it never grants a place its own
//     running requests held on the node that failed; and for SlotExpiry/2 after that renewal
//     (two renewal intervals, in which every live replica's renewer re-asserts its own) its
//     new requests are decided by the failure mode, not by a count that may lack the slots of
//     other replicas. Closed refuses them: no instant over N after a failover, at the cost of
//     SlotExpiry/2 of refusals once Redis answers again. An Acquire during which Redis failed
//     another call or changed is undone and decided the same way: its count may be the new
//     node's.
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

// MaxSlots bounds the in-flight slots this replica holds at once: a Slot beyond it is refused
// with ErrSlotsFull. The faces size their kept slots from it.
const MaxSlots = 65536

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

// ErrSlotsSettling is the SlotResult.Err of an Acquire decided by the failure mode because Redis
// answered again after failing a moment ago, and the other replicas may not have re-asserted
// their slots yet.
var ErrSlotsSettling = errors.New("in-flight slots are being re-asserted: Redis answers again after failing")

// slotScripts are the slot scripts, for Exec to load after NOSCRIPT.
var slotScripts = []scripts.Script{scripts.SlotAcquire(), scripts.SlotRenew()}

// Slot is one request's place among its key's in-flight requests. Release it when the
// request ends.
type Slot struct {
	key, id  string
	max      int64     // the limit it was taken under
	book     *slotBook // of the limiter that took it, whichever releases it
	lost     chan struct{}
	lostOnce sync.Once
	done     atomic.Bool
	deadline atomic.Int64 // UnixNano on the local clock by which it must be renewed
	local    bool         // taken by LocalFallback in this process, not in Redis
}

// Lost is closed when the slot stopped counting before its release: Redis found it expired at
// a renewal, or it could not be renewed before its expiry. Its request should end, since
// another may hold its place.
func (s *Slot) Lost() <-chan struct{} { return s.lost }

// Key is the limiter key the slot counts under.
func (s *Slot) Key() string { return s.key }

func (s *Slot) lose() { s.lostOnce.Do(func() { close(s.lost) }) }

// Acquire takes a slot of key under lim. Refused (Full, not Shadow): no Slot. While Redis cannot
// be asked, the failure mode decides: Closed refuses, Open admits without a slot,
// LocalFallback admits this replica's share of the limit with local slots (see
// slots_fallback.go). It never passes a waiter of the
// key's line (see slotline.go): it is granted only when the live slots and every waiter leave
// room.
func (l *Limiter) Acquire(ctx context.Context, key string, lim InFlight) (SlotResult, *Slot, error) {
	return l.AcquireInTurn(ctx, key, lim, nil)
}

// AcquireInTurn is Acquire for w, the oldest request of this replica that waits for a slot of
// key: it is granted only when the live slots and the waiters ahead of w in the key's line
// leave room, and leaves the line with it; refused, w joins the line, or stays in it until
// its next try or its Expiry (see slotline.go). A nil w is Acquire's try without a waiter.
func (l *Limiter) AcquireInTurn(ctx context.Context, key string, lim InFlight, w *Waiter) (SlotResult, *Slot, error) {
	if lim.Max < 1 || lim.Max > MaxInFlight {
		return SlotResult{}, nil, fmt.Errorf("%w: in-flight max %d not in 1..%d", ErrInvalidLimit, lim.Max, MaxInFlight)
	}
	if l.closed.Load() {
		return SlotResult{}, nil, ErrClosed
	}
	if err := l.reassertSlots(); err != nil {
		res, local := l.slotFailure(key, lim, fmt.Errorf("re-asserting this replica's slots before taking another: %w", err))
		return res, local, nil
	}
	if time.Now().UnixNano() < l.slotFence.Load() {
		res, local := l.slotFailure(key, lim, ErrSlotsSettling)
		return res, local, nil
	}
	gen := l.slotGen()
	if gen != l.slotCleared.Load() {
		// Redis failed or changed since the renewal above: renew first, at the next call.
		res, local := l.slotFailure(key, lim, errNodeChanged)
		return res, local, nil
	}
	s := &Slot{key: key, max: lim.Max, book: l.slotBook, lost: make(chan struct{}),
		id: l.opts.ReplicaID + ":" + l.holdTag + strconv.FormatUint(l.holdSeq.Add(1), 36)}
	// Counted against MaxSlots at once, but in the book (which the renewals read) only once
	// Redis holds it: a renewal before the ZADD would find it missing and lose it.
	if !l.slotBook.take() {
		res, local := l.slotFailure(key, lim, ErrSlotsFull)
		return res, local, nil
	}
	ttl := l.opts.SlotExpiry
	s.deadline.Store(time.Now().Add(ttl).UnixNano())
	wid, wttl := w.try(l)
	line, due := lineKeys(key)
	cmd := scripts.EvalSha(ctx, scripts.SlotAcquire(), []string{key, line, due}, s.id, lim.Max, ttl.Milliseconds(), MaxInFlight, wid, wttl.Milliseconds())
	cmds := []redis.Cmder{cmd}
	sent := scripts.Exec(ctx, l.client, cmds, slotScripts)
	l.stats.pipelines.Add(sent.RoundTrips)
	l.stats.scriptLoads.Add(sent.Loads)
	vals, err := cmds[0].(*redis.Cmd).Int64Slice()
	if err == nil && len(vals) != 3 {
		err = fmt.Errorf("%w: slot acquire answered %d values", errBadReply, len(vals))
	}
	if err == nil && l.slotGen() != gen {
		// Redis failed another call meanwhile, or the node changed under this one: the count
		// it answered may lack slots other replicas hold.
		err = errNodeChanged
	}
	if err != nil {
		l.slotBook.untake()
		l.slotMarks.Add(1)
		// The script may have run: take the slot off in case it did.
		l.releaseID(ctx, key, s.id)
		res, local := l.slotFailure(key, lim, fmt.Errorf("taking an in-flight slot: %w", err))
		return res, local, nil
	}
	l.stats.redis.Add(1)
	res := SlotResult{Allowed: vals[0] == 1, InUse: vals[1]}
	w.granted(vals[0] == 1) // a grant took w out of the line; a refusal put it in
	if !res.Allowed {
		l.slotBook.untake()
		res.Full, res.RetryAfter = true, time.Second
		res.Allowed = lim.Shadow
		return res, nil, nil
	}
	l.slotBook.put(s)
	return res, s, nil
}

// Release gives the slot back at once (one ZREM). It never fails: a slot that cannot be taken
// off stops being renewed and returns at its expiry. Later calls do nothing.
func (l *Limiter) Release(ctx context.Context, s *Slot) {
	if s == nil || !s.done.CompareAndSwap(false, true) {
		return
	}
	if s.local {
		l.releaseLocal(s)
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
		l.slotMarks.Add(1)
	}
}

type slotCounters struct {
	renewals, renewErrors, lost, releaseErrors, reasserted atomic.Uint64
}

// SlotStats returns the slots' counters.
func (l *Limiter) SlotStats() SlotStats {
	return SlotStats{
		Held: l.slotBook.len(), Renewals: l.slotStats.renewals.Load(), RenewErrors: l.slotStats.renewErrors.Load(),
		Lost: l.slotStats.lost.Load(), ReleaseErrors: l.slotStats.releaseErrors.Load(), Reasserted: l.slotStats.reasserted.Load(),
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
			_ = l.renewSlots(every) // counted; a failure makes the next Acquire renew first
		}
	}
}

// reassertSlots renews every slot this replica holds when it saw Redis fail or change since
// the start of its last complete renewal: the node that answers now may be a promoted replica,
// or the same one restarted, without some of them, and a slot taken before they are
// re-asserted could take a place a running request of this replica holds. Callers that find
// it running wait for it. Its error says the renewal did not reach every key.
func (l *Limiter) reassertSlots() error {
	if l.slotGen() == l.slotCleared.Load() {
		return nil
	}
	return l.renewSlots(l.opts.SlotExpiry / 4)
}

// errNodeChanged is a slot call's error when it succeeded while Redis failed or changed.
var errNodeChanged = errors.New("the Redis node changed or failed during the call")

// slotGen is the suspicion's generation: what this limiter saw fail, plus the node changes
// its client saw.
func (l *Limiter) slotGen() uint64 {
	g := l.slotMarks.Load()
	if l.opts.NodeChanges != nil {
		g += l.opts.NodeChanges()
	}
	return g
}

// renewSlots renews every held slot in one pipeline, re-asserts those Redis no longer counted
// where their key has room, and loses the others and those whose expiry would pass before the
// next round. One runs at a time. Its error is the first of a call that failed; when none did,
// Redis is no longer suspect for what it saw before the renewal started.
func (l *Limiter) renewSlots(every time.Duration) error {
	l.slotRenewMu.Lock()
	defer l.slotRenewMu.Unlock()
	gen := l.slotGen()
	byKey := l.slotBook.snapshot()
	if len(byKey) == 0 {
		l.settled(gen)
		return nil
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
			args := make([]any, 0, n+2)
			limit := slots[0].max
			for _, s := range slots {
				limit = min(limit, s.max) // a reload may have lowered it: re-assert under the least
			}
			args = append(args, ttl.Milliseconds(), limit)
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
	var first error
	for i, cmd := range cmds {
		out, err := cmd.(*redis.Cmd).Slice()
		if err == nil && len(out) == 0 {
			err = fmt.Errorf("%w: slot renewal answered nothing", errBadReply)
		}
		if err != nil {
			l.slotStats.renewErrors.Add(1)
			first = cmp.Or(first, err)
			continue
		}
		if n, ok := out[0].(int64); ok && n > 0 {
			// Redis had lost them (a failover, a restart in place at the same address, which
			// the client may not see): as after a failed call, new slots wait for the other
			// replicas to re-assert theirs, and the heartbeat tells them (Stats.Restorations).
			l.slotStats.reasserted.Add(uint64(n))
			l.slotMarks.Add(1)
			l.stats.restorations.Add(1)
		}
		gone := make(map[string]bool, len(out)-1)
		for _, id := range out[1:] {
			if s, ok := id.(string); ok {
				gone[s] = true
			}
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
	if first != nil {
		l.slotMarks.Add(1)
		return fmt.Errorf("renewing in-flight slots: %w", first)
	}
	l.settled(gen)
	return nil
}

// settled records a complete renewal that started at generation gen: what made Redis suspect
// before it is cleared (a failure or a change during it is not). After one that followed a
// failure, new slots wait SlotExpiry/2 for the other replicas to re-assert theirs (see the top
// of this file). Only renewSlots calls it, under slotRenewMu.
func (l *Limiter) settled(gen uint64) {
	if gen != l.slotCleared.Load() {
		l.slotFence.Store(time.Now().Add(l.opts.SlotExpiry / 2).UnixNano())
	}
	l.slotCleared.Store(gen)
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
