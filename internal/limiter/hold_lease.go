package limiter

import (
	"context"
	"strconv"
	"time"
)

// A hold from a lease: where the rule leases and this replica's lease of the key holds at least
// want units, Reserve takes them from it locally, without a call. Those units were counted in
// Redis (and in this replica's share) when the lease was granted, so the limit holds as for any
// leased admission. Its settle puts the unused units back into the lease while the lease's
// window stands (a lease gone meanwhile sends them back to Redis as its return does), and an
// excess goes to Redis as debt. A leased hold nobody settles stays spent: its units were the
// lease's, admitted, and count as used (never more than the limit), which costs under-admission
// only until the window ends.
//
// A lease gives at most maxOpen holds of its window that are not settled; beyond, Reserve asks
// Redis, whose script bounds the key's open holds there. Holds from leases are local, so a key
// that plain decisions lease as well may have that many more open per replica leasing it (the
// sidecar's token budgets never lease: their keys only reserve, settle and charge).

// takeHold takes want units of key's lease for a hold, or says the lease cannot give them. It
// never asks Redis, nor makes other callers wait.
func (ls *leases) takeHold(key string, limit Limit, want, maxOpen int64, now time.Time) (e *lease, start int64, deadline time.Time, remaining int64, ok bool) {
	e, found := ls.cache.Get(key)
	if !found {
		return nil, 0, time.Time{}, 0, false
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.gone || !sameLimit(e.limit, limit) || !now.Before(e.deadline) || e.units < want {
		return nil, 0, time.Time{}, 0, false
	}
	if e.holdsStart != e.windowStart {
		e.holds, e.holdsStart = 0, e.windowStart // the holds of a window that ended are over
	}
	if e.holds >= maxOpen {
		return nil, 0, time.Time{}, 0, false
	}
	e.holds++
	e.units -= want
	e.served += want
	e.lastUse = now
	return e, e.windowStart, e.deadline, e.remaining + e.units, true
}

// putBack returns units of a hold taken from e in the window starting at start: into e while
// that window stands and e is still the key's, to Redis as a lease return otherwise while it
// stands, and nowhere once it ended (they ended with it).
func (ls *leases) putBack(key string, e *lease, limit Limit, start, units int64, now time.Time) {
	if units <= 0 {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.windowStart != start || !now.Before(e.deadline) {
		return // the lease moved on to a later window, or this one ended
	}
	if !e.gone && sameLimit(e.limit, limit) {
		e.units += units
		return
	}
	ls.queueReturn(leaseReturn{key: key, policy: limit.Policy, window: limit.Window, windowStart: start, units: units})
}

// reserveLeased is Reserve from the key's lease, when it holds want units.
func (l *Limiter) reserveLeased(sk string, limit Limit, want int64, ttl time.Duration, now time.Time) (Result, *Hold, bool) {
	if l.leases == nil || !limit.Algorithm.leases() || limit.Calendar != nil {
		return Result{}, nil, false
	}
	e, start, deadline, remaining, ok := l.leases.takeHold(sk, limit, want, int64(l.opts.maxOpenHolds), now)
	if !ok {
		return Result{}, nil, false
	}
	l.stats.leased.Add(1)
	h := &Hold{Units: want, Deadline: now.Add(ttl), key: sk, limit: limit, start: start, lease: e}
	if deadline.Before(h.Deadline) {
		h.Deadline = deadline
	}
	// A record of no units, which no zset holds: should its use pass the hold, the settle
	// script charges the excess in full, which is what a debt is.
	h.record = strconv.FormatInt(start, 10) + ":0:" + l.opts.ReplicaID + ":lease"
	return Result{Allowed: true, Remaining: remaining, ResetAfter: deadline.Sub(now), Source: SourceLease}, h, true
}

// settleLeased settles a hold taken from a lease: unused units back into it, an excess to Redis
// as debt.
func (l *Limiter) settleLeased(ctx context.Context, h *Hold, used int64) (Settled, bool, error) {
	if !h.leaseFreed {
		h.leaseFreed = true
		h.lease.mu.Lock()
		if h.lease.holdsStart == h.start && h.lease.holds > 0 {
			h.lease.holds--
		}
		h.lease.mu.Unlock()
	}
	if used <= h.Units {
		l.leases.putBack(h.key, h.lease, h.limit, h.start, h.Units-used, l.opts.now())
		return Settled{Returned: h.Units - used}, true, nil
	}
	excess := used - h.Units
	s, sent, err := l.settleRedis(ctx, h, excess)
	s.Expired = false // the debt path of the script, not an expiry
	return s, sent, err
}
