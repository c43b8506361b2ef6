package limiter

import (
	"context"
	"errors"
	"fmt"

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
// What a calendar's holds do not do, as its plain decisions do not: leases (a hold is asked of
// Redis every time) and shares (a failover loses what the lost writes held, unless the rule's
// durability waits for a replica; see calendar.go).

// calendarSettleScripts are the scripts a calendar settle runs, for Exec to load after NOSCRIPT.
var calendarSettleScripts = []scripts.Script{scripts.CalendarSettle()}

// settleCalendar settles h, a hold of a calendar window, with used units (see settleRedis).
// sent says it may have run.
func (l *Limiter) settleCalendar(ctx context.Context, h *Hold, used int64) (Settled, bool, error) {
	at := l.redisNowMS()
	for range 2 {
		keys, args := calendarArgs(h.key, h.limit, 0, at)
		args = append(args, h.record, used, h.deadlineMS)
		cmd := scripts.EvalSha(ctx, scripts.CalendarSettle(), append(keys, holdKey(h.key)), args...)
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
			return Settled{}, false, fmt.Errorf("settling hold of %s: %w", h.key, err)
		}
		vals, err := cmd.Int64Slice()
		if err == nil && len(vals) == 6 && vals[2] == -4 && vals[4] > 0 {
			at = vals[4] / 1000 // nothing was done: again around Redis's clock
			continue
		}
		if err == nil && (len(vals) != 6 || vals[0] < 0 || vals[1] < 0 || vals[2] < 0 || vals[4] <= 0 || vals[5] < 0 || vals[5] > vals[1]) {
			err = fmt.Errorf("%w: %v", errBadReply, vals)
		}
		if err != nil {
			// It may have run or not: the hold stays counted in its period, whole or what the
			// settle left, until the period ends; a retry could give its units back twice.
			return Settled{}, true, fmt.Errorf("settling hold of %s: %w", h.key, err)
		}
		return Settled{Returned: vals[0], Debt: vals[1], Expired: vals[2] == 1}, true, nil
	}
	// Redis's clock moved by more than a period between two calls: nothing was done.
	return Settled{}, false, fmt.Errorf("settling hold of %s: %w", h.key, errCalendarMiss)
}
