package limiter

import (
	"context"
)

// chargeTag ends the record of a charge, which no hold ever has: a record of 0 units, which the
// settle scripts count what was used of in full.
const chargeTag = ":charge"

// Charge counts units used on key under limit that no hold of this limiter was taken for: a
// usage reported after its hold was forgotten, or to another replica than the one holding it
// (the hold stays spent past its deadline: both count until its window ends, which
// under-admits).
// Like a settle's excess, they count past the limit when they do not fit (debt), in this
// replica's share. units is clamped to [0, maxUsed]; Settled.Debt is what was charged, in full
// (the algorithm carries it as a settle's debt: see Settled.Debt).
func (l *Limiter) Charge(ctx context.Context, key string, limit Limit, units int64) (Settled, error) {
	if err := limit.Validate(); err != nil {
		return Settled{}, err
	}
	units = min(units, maxUsed)
	if units <= 0 {
		return Settled{}, nil
	}
	if l.closed.Load() {
		return Settled{}, ErrClosed
	}
	// A hold of no units counted in window 0 (period 0 of a calendar): the settle charges what was used in full, now.
	h := &Hold{key: limitKey(key, limit), limit: limit, record: "0:0:" + l.opts.ReplicaID + chargeTag}
	s, _, err := l.settleRedis(ctx, h, units)
	if err != nil {
		return Settled{}, err
	}
	l.stats.debt.Add(uint64(s.Debt))
	return Settled{Debt: s.Debt}, nil
}
