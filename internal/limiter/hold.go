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
// deadline goes back by itself, in Redis, so a crashed replica or a lost settle cannot leak
// budget. See holdAsk for how.
type Hold struct {
	// Units is what the hold reserved, between the least and the most asked for.
	Units int64
	// Degraded says the failure mode decided the hold: nothing is held in Redis.
	Degraded bool
	// Deadline is when the hold goes back by itself (local clock, a little before Redis's).
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
}

// Settled is what a Settle did.
type Settled struct {
	// Returned is how many of the hold's units went back (it used fewer).
	Returned int64
	// Debt is how many units were charged beyond the hold (it used more): counted past the
	// limit, so its key is refused until they are repaid. For an expired hold, all it used.
	Debt int64
	// Expired says the hold had gone back by itself before the settle, which charged what was
	// used in full.
	Expired bool
}

// Holds are grants for requests whose cost is known only after them (a rule whose cost comes
// from its response): one mechanism with leases and shares.
//
//   - Reserve runs the algorithm's own script with cost = the least the request needs and want =
//     the most it may use: the script grants min(want, what fits) when the least fits, counts it
//     at once like any grant (in the replica's share too, so a failover restores held units like
//     granted ones), and records the hold in a zset beside the state (<state key>:h, the same
//     hash slot), scored by its deadline on Redis's clock: min(now + ttl, the window's end) for
//     FixedWindow and SlidingWindowCounter, now + ttl (ttl at most the window) for TokenBucket
//     and SlidingWindowLog.
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
//   - A hold nobody settles goes back by itself: every reserve and settle first sweeps up to 16
//     expired records of the key (lua/hold_sweep.lua), and this replica stops counting it in
//     its shares at its deadline (holdtable.go), so that no later call restores it.
//
// Bounds: a hold's units are at most the limit's capacity, its deadline at most a window away,
// a settle's used at most units + capacity; an open hold costs Redis about 140 bytes (its record
// in the zset: 134 a hold at 1,000 open holds of a key, 145 at 10,000, TestHoldMemory), and
// its record lives no longer than the state.

// holdAsk is what a Reserve asks of a call beyond a decision, and what comes back.
type holdAsk struct {
	tag   string // <replica id>:<seq>, the tail of its record
	ttlMS int64
	want  int64
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
	if c.alg.leases() {
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
// known only after it; ttl bounds how long (at most a window; FixedWindow and
// SlidingWindowCounter also end a hold with its window).
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
	sk := stateKey(key, limit.Algorithm)
	now := l.opts.Now()
	if r, h, ok := l.reserveLeased(sk, limit, want, ttl, now); ok {
		l.stats.holdsReserved.Add(1)
		return finish(r, limit), h, nil
	}
	a := &holdAsk{
		tag:   l.opts.ReplicaID + ":" + l.holdTag + strconv.FormatUint(l.holdSeq.Add(1), 36),
		ttlMS: ttl.Milliseconds(),
		want:  want,
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
// debt (the key is refused until repaid). used is clamped to [0, Units + limit.Capacity()].
// Idempotent: a second call returns the first's answer. A settle that may have reached Redis
// and failed (a timeout) is final too, and returns its error again: the hold then goes back by
// itself at its deadline, and a retry could give its units back twice; until then this
// replica's share keeps what the request used of it, so a failover meanwhile restores that.
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
	used = max(min(used, h.Units+h.limit.Capacity()), 0)
	if h.Degraded {
		s := h.settleLocal(l.opts.Now(), used)
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
		if s.Returned > 0 {
			// What was refused may fit now: ask Redis again rather than repeat the refusal.
			l.precheck.forget(h.key)
		}
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
	h.local.adjust(now, h.localStart, s.Debt-s.Returned)
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
	keys := []string{h.key, holdKey(h.key)}
	var base, pre int64 // what the share counts of h now, and what leaves it before the call
	withShare := l.shares != nil && lim.Algorithm.leases()
	if withShare {
		l.shares.lapse() // a hold past its deadline here is no longer in the share
	}
	if withShare && h.entry != nil && l.shares.holds.remove(h.entry) {
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
			start, cur, prev, lv := l.shares.known(h.key)
			switch {
			case start == h.start:
				cur += pre
			case start == h.start+lim.Window.Milliseconds():
				prev += pre
			}
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
			if !l.shares.holds.add(h.entry) {
				l.addShare(h, h.start, -base)
				h.entry = nil
			}
		}
		if errors.Is(err, gobreaker.ErrOpenState) || errors.Is(err, gobreaker.ErrTooManyRequests) {
			err = ErrCircuitOpen
		}
		return Settled{}, false, fmt.Errorf("settling hold of %s: %w", h.key, err)
	}
	vals, err := cmd.Int64Slice()
	if err == nil && (len(vals) != 5 || vals[0] < 0 || vals[1] < 0 || vals[3] < 0 || vals[4] <= 0) {
		err = fmt.Errorf("%w: %v", errBadReply, vals)
	}
	if err != nil {
		// It may have run or not: Redis counts what the request used of the hold (base - pre:
		// the rest left the share before the call), or the whole hold until its deadline.
		if base > 0 {
			l.keepUsed(h, base-pre)
		}
		return Settled{}, true, fmt.Errorf("settling hold of %s: %w", h.key, err)
	}
	s := Settled{Returned: vals[0], Debt: vals[1], Expired: vals[2] == 1}
	if withShare {
		l.settleShare(h, s, base, pre, vals[4], vals[3])
	}
	return s, true, nil
}

// keepUsed keeps held units of h, what its request used of it, in this replica's share until
// h's deadline, after a settle that may or may not have run: either way Redis counts at least
// that much of it until then (what the settle left, or the whole hold), so the share never
// counts more than Redis and restores nothing that Redis did not lose. Dropping them at once
// instead left them to a failover: a replica promoted before the hold or the settle reached it
// was restored without them, and the window admitted again what the request had used.
// An excess beyond the hold keeps no share: Redis counted it only if the settle ran.
func (l *Limiter) keepUsed(h *Hold, held int64) {
	if held <= 0 {
		return
	}
	h.entry.units = held
	if !l.shares.holds.add(h.entry) {
		// The table is full: nothing would lower the share at the deadline.
		l.addShare(h, h.start, -held)
		l.stats.unkept.Add(uint64(held))
		h.entry = nil
	}
}

// addShare adds units (negative: takes them) to this replica's share of h's key in the window
// starting at start.
func (l *Limiter) addShare(h *Hold, start, units int64) {
	if units == 0 {
		return
	}
	hold, _ := l.shares.holdFor(h.limit)
	l.shares.add(h.key, h.limit.Algorithm, h.limit.Window, hold, start, units)
}

// settleShare makes this replica's share of h's key what the settle left in Redis (see the
// cases of lua/hold_settle.lua): base is what the share counted of h when the settle began,
// less pre, which left it before the call.
func (l *Limiter) settleShare(h *Hold, s Settled, base, pre, nowUS, restored int64) {
	ms := h.limit.Window.Milliseconds()
	now := nowUS / 1000
	nowStart := now - now%ms
	held := base - pre
	switch {
	case s.Expired:
		// Redis gave it back at its deadline, and charged the use in full now.
		l.addShare(h, h.start, -held)
		l.addShare(h, nowStart, s.Debt)
	case nowStart == h.start:
		target := s.Debt
		if h.entry != nil {
			// Tracked, in the table or lapsed before Redis's deadline: Redis counts it still.
			target += h.Units - s.Returned
		}
		l.addShare(h, h.start, target-held)
	default:
		// Its window ended with its units counted: only the excess counts, in this one.
		l.addShare(h, h.start, base-held)
		l.addShare(h, nowStart, s.Debt)
	}
	if restored > 0 {
		l.restored(h.key, restored)
		l.Reassert()
	}
}
