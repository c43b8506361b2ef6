package limiter

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redline-dev/redline/internal/limiter/scripts"
)

// Calendar windows (Limit.Calendar): a FixedWindow whose periods are days, weeks or months in a
// time zone, 23 to 25 hours, 28 to 31 days long. Lua has no zone data, and the periods must be
// those of Redis's clock like every other window, so the two meet half way: this process
// computes three consecutive periods around its estimate of Redis's clock (redisClock, or its
// own clock before the first reply), each with a key of its own named by its start, and the
// script (lua/calendar_window.lua) reads TIME and counts in the one containing it. Every replica
// computes the same periods from the same embedded zone data, so every replica names the same
// key for the same instant on Redis's clock. When Redis's clock is in none of the three (the
// estimate is off by more than a period), the script counts nothing and says its time; the call
// is made once more around it.
//
// What a period's key holds is only what was admitted in it, and it expires at the period's end:
// no roll, nothing of the period before, so none of the machinery of windows that roll applies.
// A calendar window takes no leases (a lease's units would be counted in a period they might not
// be admitted in, near a boundary the two clocks disagree on). Its decisions keep shares, with
// the period as the share's window (see calendar_shares.go): a failover or a restart loses only
// what replicas that are gone admitted. It takes holds and charges, a token budget per day or
// month, in its periods (see calendar_hold.go), which keep shares too.

// calendarSuffix names the state of a calendar window: <key>:cal:<unit>:<period start, ms>.
// Apart from every other algorithm's, so a rule moving to or from a calendar starts afresh; and
// named by its unit, so a rule moving from months to days on the 1st (or to weeks starting
// then) starts afresh too, instead of counting the month's units as the day's.
const calendarSuffix = "cal"

// errCalendarMiss is wrapped by the error of a calendar call whose periods did not hold Redis's
// clock: nothing was counted.
var errCalendarMiss = errors.New("redis's clock is in none of the calendar periods sent")

// limitKey is the state key of key under limit.
func limitKey(key string, limit Limit) string {
	if limit.Calendar != nil {
		return key + ":" + calendarSuffix + ":" + strings.ToLower(string(limit.Calendar.Spec().Unit))
	}
	return stateKey(key, limit.Algorithm)
}

// periodKey is the key of the period starting at startMS of the calendar state sk.
func periodKey(sk string, startMS int64) string {
	return sk + ":" + strconv.FormatInt(startMS, 10)
}

// longWindow is where a window counts as long: a calendar's, or a rolling window of more than a
// day. longRefusalRepeat bounds how long the pre-check repeats a refusal of one (see finishCall),
// and the local fallback enforces a long window at its daily pace (see fallback.take).
const (
	longWindow        = 24 * time.Hour
	longRefusalRepeat = time.Second
	maxLongWindow     = 32 * 24 * time.Hour
)

var calendarSHA, calendarReserveSHA any = scripts.CalendarWindow().SHA, scripts.CalendarReserve().SHA

// prepareCalendar makes c the calendar call of cost units of sk, around atMS on Redis's clock:
// the periods before, at and after it. Its deadline is ARGV[4], two keys after a plain call's
// (one more for a hold's records, three more with shares: the periods' share hashes).
// A Reserve's call (c.ask set) holds up to its want (lua/calendar_reserve.lua): its hold
// records, and the hold's arguments after the periods'. With shares, the share hashes and what
// this replica knows come last, read as the call leaves (pipeline).
func (c *call) prepareCalendar(sk string, limit Limit, cost, atMS int64, sh *shares) {
	keys, args := calendarArgs(sk, limit, cost, atMS)
	c.cal, c.calendar, c.known, c.hold = true, limit.Calendar, 0, 0
	sha := calendarSHA
	if c.ask != nil {
		keys = append(keys, holdKey(sk))
		args = append(args, c.ask.want, c.ask.tag, c.ask.ttlMS, c.ask.maxOpen)
		sha = calendarReserveSHA
	}
	if sh != nil {
		// lua/calendar_shares_open.lua: a decision's ARGV[9..15], a reserve's ARGV[13..19].
		keys = append(keys, shareHashKey(keys[0]), shareHashKey(keys[1]), shareHashKey(keys[2]))
		var hold any
		c.hold, hold = sh.holdFor(limit)
		c.known = 3 + len(keys) + len(args) + 1
		args = append(args, sh.idArg, nil, nil, nil, hold, limit.Peers, nil)
	}
	c.dlArg = deadlineArg - 1 + len(keys)
	c.args = append(c.args[:0], "evalsha", sha, len(keys))
	for _, k := range keys {
		c.args = append(c.args, k)
	}
	c.args = append(c.args, args...)
}

// calendarArgs are the keys and arguments of a calendar call (lua/calendar_window.lua and its
// dry run) of cost units of sk around atMS on Redis's clock: the periods before, at and after it.
func calendarArgs(sk string, limit Limit, cost, atMS int64) ([]string, []any) {
	s1, e1 := limit.Calendar.PeriodMS(atMS)
	s0, _ := limit.Calendar.PeriodMS(s1 - 1)
	_, e2 := limit.Calendar.PeriodMS(e1)
	return []string{periodKey(sk, s0), periodKey(sk, s1), periodKey(sk, e1)},
		[]any{limit.Requests, limit.Window.Milliseconds(), cost, noDeadline, s0, s1, e1, e2}
}

// peekCalendar is Peek for a calendar limit: the dry run around the estimate of Redis's clock,
// and once more around Redis's own when its clock was in none of the periods.
func (l *Limiter) peekCalendar(ctx context.Context, sk string, limit Limit, cost int64) (Result, error) {
	at := l.redisNowMS()
	for range 2 {
		keys, args := calendarArgs(sk, limit, cost, at)
		cmd := scripts.EvalSha(ctx, scripts.PeekCalendarWindow(), keys, args...)
		scripts.Exec(ctx, l.client, []redis.Cmder{cmd}, scripts.Peeks())
		n, err := cmd.Int64Slice()
		if err != nil {
			return Result{}, fmt.Errorf("dry run of a calendar window on Redis: %w", err)
		}
		res, g, err := decodeReply(n)
		if errors.Is(err, errCalendarMiss) {
			at = g.nowUS / 1000
			continue
		}
		if err != nil {
			return Result{}, fmt.Errorf("dry run of a calendar window on Redis: %w", err)
		}
		start, end := limit.Calendar.PeriodMS(g.nowUS / 1000)
		res.Period = time.Duration(end-start) * time.Millisecond
		return finish(res, limit), nil
	}
	return Result{}, fmt.Errorf("dry run of a calendar window on Redis: %w", errCalendarMiss)
}

// redisNowMS is this process's estimate of Redis's clock, in ms: its own clock until a reply.
func (l *Limiter) redisNowMS() int64 {
	now := time.Now()
	if us := l.clock.deadline(now); us > 0 {
		return us / 1000
	}
	return now.UnixMilli()
}

// askCalendar is ask for a calendar limit: around the estimate of Redis's clock, and once more
// around Redis's own when its clock was in none of the periods.
func (l *Limiter) askCalendar(ctx context.Context, sk string, limit Limit, cost, want int64, now time.Time, m *member, h *holdAsk) (Result, grant, bool, error) {
	res, g, answered, err := l.askAt(ctx, sk, limit, cost, want, now, m, h, l.redisNowMS())
	if errors.Is(err, errCalendarMiss) {
		res, g, answered, err = l.askAt(ctx, sk, limit, cost, want, now, nil, h, g.nowUS/1000)
	}
	if errors.Is(err, errCalendarMiss) {
		// Redis's clock moved by more than a period between two calls: the failure mode decides.
		return l.degraded(sk, limit, cost, now, err, h), grant{}, false, nil
	}
	return res, g, answered, err
}
