package limiter

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sony/gobreaker/v2"

	"github.com/redline-dev/redline/internal/limiter/scripts"
)

// A request matched by several rules is admitted only when every one of them admits it; one
// that another rule refuses must count in none of them (a client over its own limit would
// otherwise spend everyone's shared limit). The rules are decided together, in one round
// trip, each in its own script (their keys live on any shard of a cluster), so a rule's
// decision cannot wait for the others'. What an admitted decision counted is given back
// instead, once the request is known refused: GiveBack.
//
// Each admitted Result says what it counted (spent). GiveBack returns it where it came from:
//   - a lease's units to the lease, locally and at no cost, while the lease stands in the
//     window they were counted in; otherwise to that window in Redis, as below;
//   - units counted by a script to Redis, one script per decision, all in one round trip (one
//     per shard): a FixedWindow or SlidingWindowCounter window through the hold settle's
//     script, as a hold that used nothing (the replica's share is lowered with it, stamped, so
//     that no call in flight restores them; see shares_open.lua); a TokenBucket's tokens by
//     moving its TAT back (token_return.lua); a SlidingWindowLog's member by taking it out of
//     the log (log_return.lua);
//   - LocalFallback's units to its local window.
//
// Between the decision and the give-back another request may see the units counted and be
// refused (a transient refusal); none is ever admitted on units that were not counted. A
// give-back that fails, or finds its window ended, leaves the units counted: the limit admits
// less for the rest of that window, never more. Units counted in a window that has ended by
// the time they go back stay in it; a SlidingWindowCounter weighs them, decaying, in the next.

// spent is what an admitted decision counted, for GiveBack.
type spent struct {
	units   int64        // cost counted (0: nothing)
	startMS int64        // FixedWindow, SlidingWindowCounter: the window it counted in; SlidingWindowLog: the member's score
	lease   *lease       // SourceLease: the lease it was taken from
	local   *localWindow // SourceFallback: the local window
	localAt time.Time    // SourceFallback: that window's start
}

// Counted is how many units r counted that GiveBack can give back: its cost when it was
// admitted by a lease, a script or the local fallback; 0 otherwise (refused, failed open, a
// hold's Result, which its Settle ends).
func (r Result) Counted() int64 { return r.spent.units }

// giveBackScripts are what GiveBack runs, for scripts.Exec to load after NOSCRIPT.
var giveBackScripts = []scripts.Script{scripts.HoldSettle(), scripts.TokenReturn(), scripts.LogReturn(), scripts.CalendarReturn()}

// giveBackTag ends the record a give-back names in the hold settle's script: no hold's record
// ends with it (theirs end with a sequence number), so it never takes a hold's record.
const giveBackTag = ":giveback"

// GiveBack gives back what each refund's Result counted (see Counted), and returns how many
// units went back. Best effort: what cannot go back (Redis unreachable, the breaker of its
// shard open, its window ended) stays counted, which only under-admits; the error says why,
// for logs. The caller calls it once per Result.
func (l *Limiter) GiveBack(ctx context.Context, refunds []Refund) (int64, error) {
	var returned int64
	var cmds []redis.Cmder
	var sent []*pendingBack
	var errs []error
	now := l.opts.now()
	for _, rf := range refunds {
		sp := rf.Result.spent
		if sp.units <= 0 {
			continue
		}
		sk := limitKey(rf.Key, rf.Limit)
		switch rf.Result.Source {
		case SourceFallback:
			if sp.local != nil {
				sp.local.adjust(now, sp.localAt, -sp.units)
				returned += sp.units
			}
			continue
		case SourceLease:
			if l.leases != nil && l.leases.refill(sp.lease, rf.Limit, sp.startMS, sp.units, now) {
				returned += sp.units
				continue
			}
		case SourceRedis:
		default:
			continue
		}
		if sh := l.breakers.of(ctx, sk); sh.cb.State() == gobreaker.StateOpen {
			errs = append(errs, fmt.Errorf("giving back %d units of %s: %w", sp.units, sk, ErrCircuitOpen))
			continue
		}
		p := l.giveBackCmd(ctx, sk, rf.Limit, sp)
		cmds, sent = append(cmds, p.cmd), append(sent, p)
	}
	if len(cmds) > 0 {
		n := scripts.Exec(ctx, l.client, cmds, giveBackScripts)
		l.stats.pipelines.Add(n.RoundTrips)
		l.stats.scriptLoads.Add(n.Loads)
		for i, p := range sent {
			back, err := p.done(l, cmds[i])
			returned += back
			if err != nil {
				errs = append(errs, err)
			}
		}
	}
	l.stats.givenBack.Add(uint64(returned))
	err := errors.Join(errs...)
	if err != nil {
		l.stats.giveBackErrors.Add(uint64(len(errs)))
	}
	return returned, err
}

// pendingBack is one give-back sent to Redis.
type pendingBack struct {
	cmd     *redis.Cmd
	key     string // the state key
	limit   Limit
	sp      spent
	share   bool  // the replica's share was lowered before it was sent
	lowered int64 // by how much (sp.units at most: what it held of sp's window)
}

// giveBackCmd builds the script call that gives sp back to sk in Redis.
func (l *Limiter) giveBackCmd(ctx context.Context, sk string, lim Limit, sp spent) *pendingBack {
	if lim.Calendar != nil {
		return l.calendarBackCmd(ctx, sk, lim, sp)
	}
	p := &pendingBack{key: sk, limit: lim, sp: sp}
	switch lim.Algorithm {
	case TokenBucket:
		p.cmd = scripts.EvalSha(ctx, scripts.TokenReturn(), []string{sk}, lim.Requests, lim.Window.Milliseconds(), lim.burst(), sp.units)
	case SlidingWindowLog:
		p.cmd = scripts.EvalSha(ctx, scripts.LogReturn(), []string{sk}, lim.Window.Milliseconds(), sp.startMS, sp.units)
	default:
		// A hold of sp.units in sp's window that used none (hold_settle.lua): it gives back at
		// most what this Redis counts, of the window and of this replica's share.
		fixed := 0
		if lim.Algorithm == FixedWindow {
			fixed = 1
		}
		record := strconv.FormatInt(sp.startMS, 10) + ":" + strconv.FormatInt(sp.units, 10) + ":" + l.holdTag + giveBackTag
		args := []any{lim.Requests, lim.Window.Milliseconds(), record, 0, 0, fixed}
		if l.shares != nil {
			// The units leave the share before the call, as a settle's do (settleRedis): a
			// decision of this key in flight that read the share before would otherwise find
			// Redis short of it once they went back, and restore them. The call says what
			// this replica knew before its own lowering, which the script makes after restoring.
			p.lowered = l.shares.lower(sk, lim.Window, sp.startMS, sp.units)
			p.share = true
			start, cur, prev, lv := l.shares.knownBefore(sk, lim.Window, sp.startMS, p.lowered)
			args = append(args, l.shares.id, start, cur, prev, lv)
		}
		p.cmd = scripts.EvalSha(ctx, scripts.HoldSettle(), []string{sk, holdKey(sk)}, args...)
	}
	return p
}

// done reads the answer of a give-back: the units that went back. Those that did not (an
// error, an ended window) are in this replica's share again where they were lowered, since
// Redis still counts them (or may: an error may come after the script ran, and a share above
// Redis's count only ever under-admits).
func (p *pendingBack) done(l *Limiter, cmd redis.Cmder) (int64, error) {
	vals, err := cmd.(*redis.Cmd).Int64Slice()
	var back int64
	switch {
	case err != nil:
	case len(vals) < 2 || vals[0] < 0 || vals[0] > p.sp.units:
		err = fmt.Errorf("%w: %v", errBadReply, vals)
	default:
		back = vals[0]
	}
	if d := p.lowered - back; p.share && d != 0 {
		// Never more than was lowered: a share above what this replica knows it was granted
		// would restore units in Redis.
		hold, _ := l.shares.holdFor(p.limit)
		if p.limit.Calendar != nil {
			l.shares.addCalendar(p.key, p.limit.Calendar, p.limit.Policy, hold, p.sp.startMS, d)
		} else {
			l.shares.add(p.key, p.limit.Algorithm, p.limit.Policy, p.limit.Window, hold, p.sp.startMS, d)
		}
	}
	if err == nil && len(vals) >= 4 && p.share && vals[3] > 0 {
		l.restored(p.limit.Policy, vals[3])
		l.Reassert()
	}
	if back > 0 {
		// What was refused may fit now.
		l.precheck.forget(p.key)
	}
	if err != nil {
		return back, fmt.Errorf("giving back %d units of %s: %w", p.sp.units, p.key, err)
	}
	return back, nil
}

// spentOf is what a decision of cost answered by Redis with grant g counted, for GiveBack.
func spentOf(limit Limit, g grant, cost int64) spent {
	sp := spent{units: cost}
	switch limit.Algorithm {
	case FixedWindow, SlidingWindowCounter:
		sp.startMS, _ = g.window(limit.Window)
		if limit.Calendar != nil {
			sp.startMS, _ = limit.Calendar.PeriodMS(g.nowUS / 1000)
		}
	case SlidingWindowLog:
		sp.startMS = g.nowUS / 1000
	}
	return sp
}

// refill gives units taken from lease e in the window starting at startMS back to it, when e
// still holds that window's units under limit; false otherwise, and they go back to Redis.
func (ls *leases) refill(e *lease, limit Limit, startMS, units int64, now time.Time) bool {
	if e == nil {
		return false
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.gone || !sameLimit(e.limit, limit) || e.windowStart != startMS || !now.Before(e.deadline) {
		return false
	}
	e.units += units
	e.served = max(e.served-units, 0)
	return true
}
