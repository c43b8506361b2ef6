package limiter

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sony/gobreaker/v2"

	"github.com/redline-dev/redline/internal/limiter/scripts"
)

// Hold is units reserved for one request whose cost is known only after it (a rule whose cost
// comes from its response): counted in the key's window state like any grant when Reserve
// answers, and ended by Settle with what the request really used. A hold not settled by its
// deadline counts as spent, in Redis: its holder is taken for dead, and what its request may
// have been served is never given back to the budget. See holdAsk for how.
type Hold struct {
	// Units is what the hold reserved, between the least and the most asked for.
	Units int64
	// Degraded says the failure mode decided the hold: nothing is held in Redis.
	Degraded bool
	// Deadline is when its holder is taken for dead and the hold counts as spent (local clock,
	// a little before Redis's).
	Deadline time.Time

	mu      sync.Mutex
	done    bool
	settled Settled
	err     error

	key        string // the state key
	limit      Limit
	record     string // its member in <key>:h
	deadlineMS int64  // on Redis's clock
	start      int64  // the window it was counted in (ms on Redis's clock; 0 for TokenBucket and SlidingWindowLog)
	entry      *openHold
	local      *localWindow // LocalFallback's window, for a degraded hold
	localStart time.Time
	lease      *lease // the lease it was taken from (see hold_lease.go), or nil
	leaseFreed bool   // its lease no longer counts it among its open holds
}

// defaultMaxOpenHolds is Options.maxOpenHolds when not set: a key holds at most 64 holds at
// once. Enough for a key's streams where each holds a sixty-fourth of the budget or more (a
// budget's worth of requests at once), and what its requests may spend beyond their holds before
// the first settle refuses the key is at most 64 requests' worth.
const defaultMaxOpenHolds = 64

// maxOpenHoldsBound is the most Options.maxOpenHolds can say, as the scripts check it.
const maxOpenHoldsBound = 1_000_000

// maxUsed is the most a settle or a charge counts, 2^50 (about 1.1e15) units: Redis's Lua
// numbers are doubles, exact for whole numbers below 2^53, and a count adds a debt to what it
// holds (at most 2^40 a window state, 1e15 a limit), so every sum in the scripts stays exact.
// No response uses that many tokens: a larger usage is a lie, counted as this.
const maxUsed = 1 << 50

// Holds are grants for requests whose cost is known only after them (a rule whose cost comes
// from its response): one mechanism with leases and shares.
//
//   - Reserve runs the algorithm's own script with cost = the least the request needs and want =
//     the most it may use: the script grants min(want, what fits) when the least fits, counts it
//     at once like any grant (in the replica's share too, so a failover restores held units like
//     granted ones), and records the hold in a zset beside the state (<state key>:h, the same
//     hash slot), scored by its deadline on Redis's clock: now + ttl, ttl at most the window
//     (FixedWindow's and SlidingWindowCounter's units end with their window all the same).
//   - SlidingWindowLog counts a hold beside its log, not in it: its members are named by running
//     totals, so units of a member could not go back without rewriting every later one. The
//     units held are a sum of their own (<state key>:held, same hash slot), counted with the
//     log's window by a reserve; the settle takes the hold off that sum and appends what the
//     request used to the log at its own time (lua/hold_settle_swl.lua). Usage then counts
//     from the reserve (held) to a window after the settle (the log): longer than a grant at
//     the reserve would, which under-admits, never over. The log keeps no shares, so neither do
//     its holds: a failover loses what the lost writes held, as it loses its admissions.
//   - Settle ends the hold with what the request used (see lua/hold_settle.lua): the unused part
//     goes back, an excess counts past the limit as debt, refused until repaid.
//   - Every reserve and settle first sweeps up to 16 expired records of the key
//     (lua/hold_sweep.lua): a hold nobody settled, whose units stay spent (below).
//   - A calendar window (Limit.Calendar) reserves and settles in its periods, with scripts of
//     its own, its shares being of its periods (see calendar_hold.go).
//
// A hold nobody settles by its deadline counts as spent: its holder died (or lost the settle),
// and its request may have been served in full, so no unit of it goes back to the budget. Its
// record is swept and stops counting among the key's open holds; its units stay counted until
// the window ends (FixedWindow, SlidingWindowCounter), stay taken from the bucket (TokenBucket),
// or move from held into the log for a window (SlidingWindowLog). A late settle finds them
// counted and settles as a timely one would (SlidingWindowLog gives nothing back then).
//
// A key has at most Options.maxOpenHolds holds open at once (refused beyond, atomically in the
// reserve's script, see lua/hold_bound.lua), so that what its requests spend beyond their holds
// before their settles refuse it is bounded by that many requests.
//
// Debt is counted in full in Settled.Debt (up to maxUsed); each algorithm carries it for as
// long as its state lives: FixedWindow counts it in its window and carries at most one limit
// into the next (refused for the rest of the window and at most the whole next one);
// SlidingWindowCounter counts it in its window, which the next one weighs; TokenBucket runs the
// TAT at most one window past its tolerance; SlidingWindowLog appends at most the hold plus one
// limit, which refuses the key until it leaves the window. None keeps a key longer than that.
//
// Bounds: a hold's units are at most the limit's capacity, its deadline at most a window away,
// a settle's used at most maxUsed; an open hold costs Redis about 140 bytes (its record
// in the zset: 134 a hold at 1,000 open holds of a key, 145 at 10,000, TestHoldMemory), and
// its record lives no longer than the state.

// holdAsk is what a Reserve asks of a call beyond a decision, and what comes back.
type holdAsk struct {
	tag     string // <replica id>:<seq>, the tail of its record
	ttlMS   int64
	want    int64
	maxOpen int64 // the most holds its key has open at once
	// A grant's, set by the flusher that decoded it.
	deadlineMS int64
	deadline   time.Time
	start      int64
	entry      *openHold
	// A failure mode's, set by degraded.
	degradedUnits int64
	local         *localWindow
}

// holdScripts are the settles, for Exec to load after NOSCRIPT.
var holdScripts = []scripts.Script{scripts.HoldSettle(), scripts.HoldSettleTokenBucket(), scripts.HoldSettleSlidingWindowLog()}

// holdKey is the zset of a state's hold records: the state key's hash tag, so on its slot.
func holdKey(stateKey string) string { return stateKey + ":h" }

// heldKey is the units SlidingWindowLog's open holds hold, beside its log, on its slot.
func heldKey(stateKey string) string { return stateKey + ":held" }

// cut takes the hold's deadline off a reply: the algorithms' scripts append it to their own.
func (a *holdAsk) cut(alg Algorithm, vals []int64) []int64 {
	n := 7
	if !alg.leases() {
		n = 6 // TokenBucket's and SlidingWindowLog's replies carry no restored units
	}
	if len(vals) == n+1 {
		a.deadlineMS = vals[n]
		return vals[:n]
	}
	return vals
}

// granted records where the call's grant was counted and when it lapses on the local clock:
// local is when the call left, so the local deadline is no later than Redis's.
func (a *holdAsk) granted(c *call, local time.Time) error {
	if a.deadlineMS <= 0 {
		return fmt.Errorf("%w: a hold granted without a deadline", errBadReply)
	}
	switch {
	case c.cal:
		a.start, _ = c.calendar.PeriodMS(c.g.nowUS / 1000) // the period the script counted in
	case c.alg.leases():
		a.start, _ = c.g.window(c.window) // the others' holds are of no window: start 0
	}
	left := time.Duration(a.deadlineMS*1000-c.g.nowUS) * time.Microsecond
	a.deadline = local.Add(max(left, 0))
	return nil
}

// trackHold puts a's grant in the shares' table of open holds, or says it is full.
func (l *Limiter) trackHold(a *holdAsk, key string, window time.Duration, units int64) bool {
	e := &openHold{key: key, window: window, start: a.start, units: units, deadline: a.deadline}
	if !l.shares.holds.add(e) {
		l.stats.holdsUntracked.Add(1)
		return false
	}
	a.entry = e
	return true
}

// Reserve holds between least and want units of key under limit for one request whose cost is
// known only after it; ttl bounds how long it waits for its settle (at most a window; the
// units of a FixedWindow or SlidingWindowCounter hold end with their window all the same).
// Refused (least does not fit): a Result refused with RetryAfter like Allow, and a nil Hold; in
// shadow mode that Result admits, still without a hold. While Redis cannot be asked, the
// failure mode decides: Open holds want, Closed refuses, LocalFallback holds what the local
// window affords up to want, at least least; such a hold is Degraded.
func (l *Limiter) Reserve(ctx context.Context, key string, limit Limit, least, want int64, ttl time.Duration) (Result, *Hold, error) {
	if err := limit.Validate(); err != nil {
		return Result{}, nil, err
	}
	if least < 1 || want < least {
		return Result{}, nil, fmt.Errorf("%w: a hold needs 1 <= least <= want, got %d and %d", ErrInvalidLimit, least, want)
	}
	if ttl < time.Millisecond {
		return Result{}, nil, fmt.Errorf("%w: a hold's ttl must be at least 1ms, got %s", ErrInvalidLimit, ttl)
	}
	if l.closed.Load() {
		return Result{}, nil, ErrClosed
	}
	if least > limit.Capacity() {
		return finish(Result{OverLimit: true, RetryAfter: -1, Source: SourceCapacity}, limit), nil, nil
	}
	want = min(want, limit.Capacity())
	ttl = min(ttl, limit.Window)
	sk := limitKey(key, limit)
	now := l.opts.now()
	if r, h, ok := l.reserveLeased(sk, limit, want, ttl, now); ok {
		l.stats.holdsReserved.Add(1)
		return finish(r, limit), h, nil
	}
	a := &holdAsk{
		tag:     l.opts.ReplicaID + ":" + l.holdTag + strconv.FormatUint(l.holdSeq.Add(1), 36),
		ttlMS:   ttl.Milliseconds(),
		want:    want,
		maxOpen: int64(l.opts.maxOpenHolds),
	}
	res, g, answered, err := l.ask(ctx, sk, limit, least, want, now, nil, a)
	if err != nil {
		return Result{}, nil, err
	}
	res = finish(res, limit)
	var h *Hold
	switch {
	case answered && g.units > 0:
		h = &Hold{Units: g.units, Deadline: a.deadline, key: sk, limit: limit, deadlineMS: a.deadlineMS,
			start: a.start, entry: a.entry, record: strconv.FormatInt(a.start, 10) + ":" + strconv.FormatInt(g.units, 10) + ":" + a.tag}
	case !answered && a.degradedUnits > 0:
		h = &Hold{Units: a.degradedUnits, Degraded: true, Deadline: now.Add(ttl), key: sk, limit: limit, local: a.local}
		if a.local != nil {
			h.localStart = a.local.startOf(now)
		}
	default:
		return res, nil, nil
	}
	l.stats.holdsReserved.Add(1)
	return res, h, nil
}

// holdRefusalRepeat is the longest a refused reserve is repeated from the pre-check.
const holdRefusalRepeat = 250 * time.Millisecond

// Settle ends h with what its request used: the unused part goes back, an excess is charged as
// debt (the key is refused until repaid). used is clamped to [0, maxUsed].
// Idempotent: a second call returns the first's answer. A settle that may have reached Redis
// and failed (a timeout) is final too, and returns its error again: the hold then stays
// counted until its window ends (whole, or what the settle left), and a retry could give its
// units back twice; this replica's share keeps what the request used of it, so a failover
// restores that.
// One that could not be sent (the breaker open, the limiter closed) may be retried.
func (l *Limiter) Settle(ctx context.Context, h *Hold, used int64) (Settled, error) {
	if h == nil {
		return Settled{}, errors.New("settling a hold: nil hold")
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.done {
		return h.settled, h.err
	}
	used = max(min(used, maxUsed), 0)
	if h.Degraded {
		s := h.settleLocal(l.opts.now(), used)
		h.done, h.settled = true, s
		l.countSettle(s)
		return s, nil
	}
	if l.closed.Load() {
		return Settled{}, ErrClosed
	}
	var s Settled
	var sent bool
	var err error
	if h.lease != nil {
		s, sent, err = l.settleLeased(ctx, h, used)
	} else {
		s, sent, err = l.settleRedis(ctx, h, used)
	}
	if err != nil && !sent {
		return Settled{}, err
	}
	h.done, h.settled, h.err = true, s, err
	if err == nil {
		l.countSettle(s)
		// What was refused may fit now (units went back, or a hold of the key's bound ended):
		// ask Redis again rather than repeat the refusal.
		l.precheck.forget(h.key)
	}
	return s, err
}

func (l *Limiter) countSettle(s Settled) {
	l.stats.holdsSettled.Add(1)
	l.stats.returned.Add(uint64(s.Returned))
	l.stats.debt.Add(uint64(s.Debt))
	if s.Expired {
		l.stats.holdsExpired.Add(1)
	}
}

// settleLocal settles a degraded hold: LocalFallback's window gets back what was not used, or
// counts the excess; a hold that failed open counted nothing, and settles nothing.
func (h *Hold) settleLocal(now time.Time, used int64) Settled {
	if h.local == nil {
		return Settled{}
	}
	var s Settled
	if used < h.Units {
		s.Returned = h.Units - used
	} else {
		s.Debt = used - h.Units
	}
	// The local window counts at most a capacity of debt, which refuses it as long as more.
	h.local.adjust(now, h.localStart, min(s.Debt, h.limit.Capacity())-s.Returned)
	return s
}

// settleRedis runs h's settle script through its shard's breaker. sent says it may have run.
//
// This replica's share never counts more of the key than Redis does while the settle is in
// flight: a call of the same key that carried more would restore the difference
// (shares_open.lua). So the units the settle may give back leave the share before it is sent,
// and what it did not give back returns with its answer (settleShare).
func (l *Limiter) settleRedis(ctx context.Context, h *Hold, used int64) (Settled, bool, error) {
	lim := h.limit
	if lim.Calendar != nil {
		return l.settleCalendar(ctx, h, used)
	}
	keys := []string{h.key, holdKey(h.key)}
	var base, pre int64 // what the share counts of h now, and what leaves it before the call
	withShare := l.shares != nil && lim.Algorithm.leases()
	if withShare {
		l.shares.lapse() // a hold past its deadline here is no longer in the share
	}
	if withShare && h.entry != nil {
		// Tracked: the share counts the hold, in the table or lapsed (a hold past its deadline
		// stays spent in Redis, and in the share).
		l.shares.holds.remove(h.entry)
		base, pre = h.Units, max(h.Units-used, 0)
		if pre > 0 {
			l.shares.lower(h.key, lim.Window, h.start, pre)
		}
	}
	var cmd *redis.Cmd
	switch lim.Algorithm {
	case TokenBucket:
		cmd = scripts.EvalSha(ctx, scripts.HoldSettleTokenBucket(), keys,
			lim.Requests, lim.Window.Milliseconds(), lim.burst(), h.record, used, h.deadlineMS)
	case SlidingWindowLog:
		cmd = scripts.EvalSha(ctx, scripts.HoldSettleSlidingWindowLog(), append(keys, heldKey(h.key)),
			lim.Requests, lim.Window.Milliseconds(), h.record, used, h.deadlineMS)
	default:
		fixed := 0
		if lim.Algorithm == FixedWindow {
			fixed = 1
		}
		args := []any{lim.Requests, lim.Window.Milliseconds(), h.record, used, h.deadlineMS, fixed}
		if l.shares != nil {
			// What it knows before its own lowering, which the script makes after restoring.
			start, cur, prev, lv := l.shares.knownBefore(h.key, lim.Window, h.start, pre)
			args = append(args, l.shares.id, start, cur, prev, lv)
		}
		cmd = scripts.EvalSha(ctx, scripts.HoldSettle(), keys, args...)
	}
	sent := false
	_, err := l.breakers.of(ctx, h.key).cb.Execute(func() (struct{}, error) {
		sent = true
		n := scripts.Exec(ctx, l.client, []redis.Cmder{cmd}, holdScripts)
		l.stats.pipelines.Add(n.RoundTrips)
		l.stats.scriptLoads.Add(n.Loads)
		if err := cmd.Err(); err != nil && isOutage(err) {
			return struct{}{}, err
		}
		return struct{}{}, nil
	})
	if !sent {
		// Nothing ran: the hold is open as before, for a retry or its deadline.
		if base > 0 {
			l.addShare(h, h.start, pre)
			l.shares.holds.add(h.entry) // a full table only stops counting it in HoldsOpen
		}
		if errors.Is(err, gobreaker.ErrOpenState) || errors.Is(err, gobreaker.ErrTooManyRequests) {
			err = ErrCircuitOpen
		}
		return Settled{}, false, fmt.Errorf("settling hold of %s: %w", h.key, err)
	}
	vals, err := cmd.Int64Slice()
	if err == nil && (len(vals) != 6 || vals[0] < 0 || vals[1] < 0 || vals[3] < 0 || vals[4] <= 0 || vals[5] < 0 || vals[5] > vals[1]) {
		err = fmt.Errorf("%w: %v", errBadReply, vals)
	}
	if err != nil {
		// It may have run or not: Redis counts what the request used of the hold (base - pre,
		// which the share keeps: the rest left it before the call), or the whole hold, until
		// its window ends either way. An excess beyond the hold keeps no share: Redis counted
		// it only if the settle ran. Dropping the used part at once instead left it to a
		// failover: a replica promoted before the hold or the settle reached it was restored
		// without it, and the window admitted again what the request had used.
		return Settled{}, true, fmt.Errorf("settling hold of %s: %w", h.key, err)
	}
	s := Settled{Returned: vals[0], Debt: vals[1], Expired: vals[2] == 1}
	if withShare {
		l.settleShare(h, s, vals[5], base, pre, vals[4], vals[3])
	}
	return s, true, nil
}

// addShare adds units (negative: takes them) to this replica's share of h's key in the window
// starting at start.
func (l *Limiter) addShare(h *Hold, start, units int64) {
	if units == 0 {
		return
	}
	hold, _ := l.shares.holdFor(h.limit)
	l.shares.add(h.key, h.limit.Algorithm, h.limit.Policy, h.limit.Window, hold, start, units)
}

// settleShare makes this replica's share of h's key what the settle left in Redis (see the
// cases of lua/hold_settle.lua): counted is what the window counted of the debt, base is what
// the share counted of h when the settle began, less pre, which left it before the call.
func (l *Limiter) settleShare(h *Hold, s Settled, counted, base, pre, nowUS, restored int64) {
	ms := h.limit.Window.Milliseconds()
	now := nowUS / 1000
	nowStart := now - now%ms
	held := base - pre
	if nowStart == h.start {
		target := counted
		if h.entry != nil {
			// Tracked: Redis counts it still, deadline or not (a hold past it stays spent).
			target += h.Units - s.Returned
		}
		l.addShare(h, h.start, target-held)
	} else {
		// Its window ended with its units counted: only the excess counts, in this one.
		l.addShare(h, h.start, base-held)
		l.addShare(h, nowStart, counted)
	}
	if restored > 0 {
		l.restored(h.limit.Policy, restored)
		l.Reassert()
	}
}
