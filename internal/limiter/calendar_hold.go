package limiter

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sony/gobreaker/v2"

	"github.com/redline-dev/redline/internal/limiter/scripts"
)

// Token budgets on calendar windows (a rule whose cost comes from its response, counted per day
// or month in a zone): holds and charges as on any window (see hold.go), in the periods of
// calendar.go.
//
//   - Reserve runs lua/calendar_reserve.lua around the estimate of Redis's clock, as a decision
//     does (askCalendar): the hold is counted at once in the period holding Redis's clock and
//     recorded as <period start>:<units>:<tag> beside the periods (<state key>:h), with a
//     deadline at most the longest period away.
//   - Settle runs lua/calendar_settle.lua around the estimate of Redis's clock, and once more
//     around Redis's own when its clock was in none of the periods sent. A hold of the period
//     holding Redis's clock gives back what its request did not use, and counts an excess there
//     as debt. A hold taken before a reset and settled after it gives nothing back (its units
//     ended with their period, and the new period never counted them), and its excess counts
//     in the new period, the one its settle ran in: a request that ran across midnight is
//     charged its overrun in the day it ended, never in neither.
//   - Charge is a settle of a hold of no units of period 0, which counts in full in the period
//     holding Redis's clock.
//
// Debt stays in the period it was counted in: each period has its own key, and the next starts
// from nothing (a window of fixed length carries up to a limit of debt into the next; a month
// carrying a month's overrun would refuse a customer for all of the next).
//
// Shares (see calendar_shares.go): with a ReplicaID, a hold's units count in this replica's
// share of the period they are counted in, in Redis (the period's share hash) and here, as a
// decision's grant does, and the reserve and the settle restore what Redis lacks of the share
// first (max, never added twice), so a failover or a restart without persistence loses no held
// or used unit of a live replica. As on windows that roll (see settleRedis), the units a settle
// may give back leave the share before it is sent and come back with its answer if they did
// not go back; an excess counts in the share of the period it is counted in; a hold settled
// after its period ended changes nothing of that period's share, and its excess counts in the
// new period's. A charge counts in the share like an excess.
//
// What a calendar's holds do not do, as its plain decisions do not: leases (a hold is asked of
// Redis every time).

// calendarSettleScripts are the scripts a calendar settle runs, for Exec to load after NOSCRIPT.
var calendarSettleScripts = []scripts.Script{scripts.CalendarSettle()}

// settleCalendar settles h, a hold of a calendar window, with used units (see settleRedis).
// sent says it may have run.
func (l *Limiter) settleCalendar(ctx context.Context, h *Hold, used int64) (Settled, bool, error) {
	var base, pre int64 // what the share counts of h now, and what leaves it before the call
	var period time.Duration
	if l.shares != nil {
		l.shares.lapse() // a hold past its deadline here is no longer in the share's table
		_, end := h.limit.Calendar.PeriodMS(h.start)
		period = msDuration(end - h.start)
		if h.entry != nil {
			// Tracked: the share counts the hold, in the table or lapsed (spent in Redis).
			l.shares.holds.remove(h.entry)
			base = h.Units
			if back := h.Units - used; back > 0 {
				pre = l.shares.lower(h.key, period, h.start, back)
			}
		}
	}
	vals, sent, err := l.runCalendarSettle(ctx, h, used, period, pre)
	if !sent {
		// Nothing ran: the hold is open as before, for a retry or its deadline.
		if base > 0 {
			l.addCalendarShare(h, h.start, pre)
			l.shares.holds.add(h.entry) // a full table only stops counting it in HoldsOpen
		}
		return Settled{}, false, err
	}
	if err != nil {
		// It may have run or not: the hold stays counted in its period, whole or what the
		// settle left, until the period ends; a retry could give its units back twice. The
		// share keeps what the request used of it (see settleRedis).
		return Settled{}, true, err
	}
	s := Settled{Returned: vals[0], Debt: vals[1], Expired: vals[2] == 1}
	if l.shares != nil {
		l.settleCalendarShare(h, s, vals[5], base, pre, vals[4], vals[3])
	}
	return s, true, nil
}

// runCalendarSettle runs h's settle around the estimate of Redis's clock, and once more around
// Redis's own when its clock was in none of the periods sent. With shares, it says what this
// replica knew of its share before lowering pre units of the period h was counted in, which
// lasts period.
func (l *Limiter) runCalendarSettle(ctx context.Context, h *Hold, used int64, period time.Duration, pre int64) ([]int64, bool, error) {
	at := l.redisNowMS()
	for range 2 {
		keys, args := calendarArgs(h.key, h.limit, 0, at)
		keys = append(keys, holdKey(h.key))
		args = append(args, h.record, used, h.deadlineMS)
		if l.shares != nil {
			// What it knows before its own lowering, which the script makes after restoring.
			from, cur, _, lv := l.shares.knownBefore(h.key, period, h.start, pre)
			keys = append(keys, shareHashKey(keys[0]), shareHashKey(keys[1]), shareHashKey(keys[2]))
			args = append(args, l.shares.id, from, cur, 0, 0, 0, lv)
		}
		cmd := scripts.EvalSha(ctx, scripts.CalendarSettle(), keys, args...)
		sent := false
		_, err := l.breakers.of(ctx, h.key).cb.Execute(func() (struct{}, error) {
			sent = true
			n := scripts.Exec(ctx, l.client, []redis.Cmder{cmd}, calendarSettleScripts)
			l.stats.pipelines.Add(n.RoundTrips)
			l.stats.scriptLoads.Add(n.Loads)
			if err := cmd.Err(); err != nil && isOutage(err) {
				return struct{}{}, err
			}
			return struct{}{}, nil
		})
		if !sent {
			if errors.Is(err, gobreaker.ErrOpenState) || errors.Is(err, gobreaker.ErrTooManyRequests) {
				err = ErrCircuitOpen
			}
			return nil, false, fmt.Errorf("settling hold of %s: %w", h.key, err)
		}
		vals, err := cmd.Int64Slice()
		if err == nil && len(vals) == 6 && vals[2] == -4 && vals[4] > 0 {
			at = vals[4] / 1000 // nothing was done: again around Redis's clock
			continue
		}
		if err == nil && (len(vals) != 6 || vals[0] < 0 || vals[1] < 0 || vals[2] < 0 || vals[3] < 0 || vals[4] <= 0 || vals[5] < 0 || vals[5] > vals[1]) {
			err = fmt.Errorf("%w: %v", errBadReply, vals)
		}
		if err != nil {
			return nil, true, fmt.Errorf("settling hold of %s: %w", h.key, err)
		}
		return vals, true, nil
	}
	// Redis's clock moved by more than a period between two calls: nothing was done.
	return nil, false, fmt.Errorf("settling hold of %s: %w", h.key, errCalendarMiss)
}

// settleCalendarShare makes this replica's share of h's key what the settle left in Redis, as
// settleShare does for windows that roll: counted is what the period the settle ran in counted
// of the debt, base what the share counted of h when the settle began, less pre, which left it
// before the call.
func (l *Limiter) settleCalendarShare(h *Hold, s Settled, counted, base, pre, nowUS, restored int64) {
	nowStart, _ := h.limit.Calendar.PeriodMS(nowUS / 1000)
	held := base - pre
	if nowStart == h.start {
		target := counted
		if h.entry != nil {
			target += h.Units - s.Returned // Redis counts the rest still, deadline or not
		}
		l.addCalendarShare(h, h.start, target-held)
	} else {
		// Its period ended with its units counted there: that share is as it was, and only the
		// excess counts, in the period the settle ran in.
		l.addCalendarShare(h, h.start, base-held)
		l.addCalendarShare(h, nowStart, counted)
	}
	if restored > 0 {
		l.restored(h.limit.Policy, restored)
		l.Reassert()
	}
}

// addCalendarShare adds units (negative: takes them) to this replica's share of h's key in the
// period starting at start.
func (l *Limiter) addCalendarShare(h *Hold, start, units int64) {
	if units == 0 {
		return
	}
	hold, _ := l.shares.holdFor(h.limit)
	if !l.shares.addCalendar(h.key, h.limit.Calendar, h.limit.Policy, hold, start, units) && units > 0 {
		l.stats.unkept.Add(uint64(units))
	}
}
