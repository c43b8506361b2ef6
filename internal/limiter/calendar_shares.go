package limiter

import (
	"context"

	"github.com/redis/go-redis/v9"

	"github.com/redline-dev/redline/internal/calendar"
	"github.com/redline-dev/redline/internal/limiter/scripts"
)

// Shares of calendar windows (see shares.go for the mechanism): a replica keeps what it was
// granted in the period its grants were counted in, the period being the share's window, and
// every decision of the key, every give-back and every re-assertion carries it, so a Redis
// that lost the period's count (a failover, a restart without persistence) is raised back to
// what the live replicas were granted, exactly (lua/calendar_shares_open.lua).
//
//   - Each period's count has a hash beside it (<period key>:r) with a field per replica: its
//     share of that period, in units. The hash expires with the count at the period's end, so
//     a share names its period by its key and nothing carries over between periods (a period
//     counts only what was admitted in it).
//   - In the share table a calendar key keeps one period (the one before counts nothing), and
//     its entry is dropped when that period ends, not a window later.
//   - Lowerings (a give-back) go first and stamp the call, as a lease's return does.
//   - The hold (grants wait for the other replicas to re-assert once one restored a share) is
//     the windows' own, on the hash's field s.
//
// Holds and charges (Reserve, Settle, Charge) keep shares of the same periods, as on windows
// that roll (see calendar_hold.go).

// shareHashKey is the share hash beside the count of the period named pk.
func shareHashKey(pk string) string { return pk + ":r" }

// recordCalendarShare is recordShare for a calendar decision: its grant goes to the share of
// the period holding Redis's clock when the script ran.
func (l *Limiter) recordCalendarShare(c *call) {
	if c.g.units > 0 {
		start, end := c.calendar.PeriodMS(c.g.nowUS / 1000)
		switch {
		case c.ask != nil && !l.trackHold(c.ask, c.skey, msDuration(end-start), c.g.units):
			l.stats.unkept.Add(uint64(c.g.units))
		case !l.shares.addCalendar(c.skey, c.calendar, c.policy, c.hold, start, c.g.units):
			l.stats.unkept.Add(uint64(c.g.units))
			if c.ask != nil && c.ask.entry != nil {
				l.shares.holds.remove(c.ask.entry)
				c.ask.entry = nil
			}
		}
	}
	if c.g.restored > 0 {
		l.restored(c.policy, c.g.restored)
		l.Reassert()
	}
}

// addCalendar records units (negative: given back) granted to key, of a calendar limit of
// policy, in the period starting at start. It returns false when the table had no room for
// the key: those units keep no share.
func (s *shares) addCalendar(key string, cal *calendar.Calendar, policy string, hold, start, units int64) bool {
	sh := s.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e, ok := sh.m[key]
	if !ok {
		if units <= 0 {
			return true
		}
		if s.n.Load() >= s.size {
			return false
		}
		s.n.Add(1)
		e = &share{}
		sh.m[key] = e
	}
	// Not by the calendar's identity: every reload of the policies makes a new one, and a share
	// dropped then would leave the period's units before it unrestorable. A new period starts
	// afresh; the calendar kept is the latest, for re-assertions.
	switch {
	case e.cal == nil || start > e.start:
		_, end := cal.PeriodMS(start)
		e.window, e.start, e.cur, e.prev = msDuration(end-start), start, 0, 0
	case start < e.start:
		return true // its period is over
	}
	e.cal, e.alg, e.policy, e.hold = cal, FixedWindow, policy, hold
	e.cur = max(e.cur+units, 0)
	return true
}

// ended says whether e's last two windows have ended by nowMS, or, for a calendar window, its
// period.
func (e *share) ended(nowMS int64) bool {
	if e.cal != nil {
		return e.start+e.window.Milliseconds() <= nowMS
	}
	return e.start+2*e.window.Milliseconds() <= nowMS
}

// calendarReassertCmd re-asserts s, a calendar share, with a cost of 0: the decision script
// around the share's period, which restores what is missing there and counts nothing else
// (nothing when Redis's clock has left that period: the period is over).
func (l *Limiter) calendarReassertCmd(ctx context.Context, s liveShare) *redis.IntSliceCmd {
	lim := Limit{Algorithm: FixedWindow, Requests: 1, Window: s.cal.MaxLength(), Calendar: s.cal}
	keys, args := calendarArgs(s.key, lim, 0, s.start)
	args = append(args, l.shares.id, s.start, s.cur, 0, s.hold, 0, s.lv)
	cmdArgs := make([]any, 0, 3+2*len(keys)+len(args))
	cmdArgs = append(cmdArgs, "evalsha", calendarSHA, 2*len(keys))
	for _, k := range keys {
		cmdArgs = append(cmdArgs, k)
	}
	for _, k := range keys {
		cmdArgs = append(cmdArgs, shareHashKey(k))
	}
	cmd := redis.NewIntSliceCmd(ctx, append(cmdArgs, args...)...)
	cmd.SetFirstKeyPos(3)
	return cmd
}

// calendarBackCmd builds the call that gives sp back to its period of the calendar state sk.
// With shares, the units leave this replica's share first and the call says what it knew
// before (see giveBackCmd).
func (l *Limiter) calendarBackCmd(ctx context.Context, sk string, lim Limit, sp spent) *pendingBack {
	_, end := lim.Calendar.PeriodMS(sp.startMS)
	p := &pendingBack{key: sk, limit: lim, sp: sp}
	pk := periodKey(sk, sp.startMS)
	if l.shares == nil {
		p.cmd = scripts.EvalSha(ctx, scripts.CalendarReturn(), []string{pk}, sp.units, end)
		return p
	}
	p.lowered = l.shares.lower(sk, msDuration(end-sp.startMS), sp.startMS, sp.units)
	p.share = true
	from, cur, _, lv := l.shares.knownBefore(sk, msDuration(end-sp.startMS), sp.startMS, p.lowered)
	if from != sp.startMS {
		cur = 0 // a share of another period says nothing of this one
	}
	p.cmd = scripts.EvalSha(ctx, scripts.CalendarReturn(), []string{pk, shareHashKey(pk)}, sp.units, end,
		l.shares.id, sp.startMS, cur, lv)
	return p
}
