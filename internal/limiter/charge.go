package limiter

import (
	"context"
)

// chargeTag ends the record of a charge, which no hold ever has: the settle scripts find no
// such record, of a window long ended, and count what was used in full.
const chargeTag = ":charge"

// Charge counts units used on key under limit that no hold of this limiter was taken for: a
// usage reported after its hold was forgotten, or to another replica than the one holding it
// (the hold goes back by itself at its deadline; until then both count, which under-admits).
// Like a settle's excess, they count past the limit when they do not fit (debt), in this
// replica's share. units is clamped to [0, limit.Capacity()]; Settled.Debt is what was counted.
func (l *Limiter) Charge(ctx context.Context, key string, limit Limit, units int64) (Settled, error) {
	if err := limit.Validate(); err != nil {
		return Settled{}, err
	}
	units = min(units, limit.Capacity())
	if units <= 0 {
		return Settled{}, nil
	}
	if l.closed.Load() {
		return Settled{}, ErrClosed
	}
	// A hold of one unit counted in window 0, past its deadline and gone: the settle charges
	// what was used in full, now (clamped to its units and the capacity, which units is within).
	h := &Hold{Units: 1, key: stateKey(key, limit.Algorithm), limit: limit, record: "0:1:" + l.opts.ReplicaID + chargeTag}
	s, _, err := l.settleRedis(ctx, h, units)
	if err != nil {
		return Settled{}, err
	}
	l.stats.debt.Add(uint64(s.Debt))
	return Settled{Debt: s.Debt}, nil
}
