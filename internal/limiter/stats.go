package limiter

import (
	"slices"
	"sync/atomic"
)

// holdCounts are the counters of holds that no metric reads: the tests read them
// (export_test.go).
type holdCounts struct {
	// reserved counts holds Reserve granted (degraded ones included) and settled those Settle
	// ended; expired counts settles that found their hold gone back by itself, and lapsed
	// holds whose deadline passed unsettled in this replica's table (see holdtable.go);
	// untracked counts holds beyond it (Options.maxHolds), which keep no share.
	reserved, settled, expired, lapsed, untracked uint64
	// returnedUnits counts units settles gave back, and debtUnits units they charged past
	// their holds (a request that used more than it held, or settled after its hold expired).
	returnedUnits, debtUnits uint64
}

func (l *Limiter) holdCounts() holdCounts {
	var lapsed uint64
	if l.shares != nil {
		lapsed = l.shares.holds.lapsed.Load()
	}
	return holdCounts{
		reserved: l.stats.holdsReserved.Load(), settled: l.stats.holdsSettled.Load(),
		expired: l.stats.holdsExpired.Load(), lapsed: lapsed, untracked: l.stats.holdsUntracked.Load(),
		returnedUnits: l.stats.returned.Load(), debtUnits: l.stats.debt.Load(),
	}
}

type counters struct {
	redis, precheck, degraded, pipelines, scriptLoads, leased, grants, stale  atomic.Uint64
	restorations, restoredUnits, reassertions, reassertErrors, unkept, held   atomic.Uint64
	holdsReserved, holdsSettled, holdsExpired, holdsUntracked, returned, debt atomic.Uint64
	givenBack, giveBackErrors                                                 atomic.Uint64
}

func (l *Limiter) leaseKeys() int {
	if l.leases == nil {
		return 0
	}
	return l.leases.cache.Len()
}

// Stats returns the limiter's counters.
func (l *Limiter) Stats() Stats {
	shards := l.breakers.states()
	var open int
	if l.shares != nil {
		open = l.shares.holds.len()
	}
	return Stats{
		HoldsOpen:         open,
		RedisDecisions:    l.stats.redis.Load(),
		PrecheckRefusals:  l.stats.precheck.Load(),
		LeaseDecisions:    l.stats.leased.Load(),
		LeaseGrants:       l.stats.grants.Load(),
		DegradedDecisions: l.stats.degraded.Load(),
		Pipelines:         l.stats.pipelines.Load(),
		ScriptLoads:       l.stats.scriptLoads.Load(),
		StaleCalls:        l.stats.stale.Load(),
		LeaseKeys:         l.leaseKeys(),
		ShareKeys:         l.shareKeys(),
		Restorations:      l.stats.restorations.Load(),
		RestoredUnits:     l.stats.restoredUnits.Load(),
		Reassertions:      l.stats.reassertions.Load(),
		ReassertErrors:    l.stats.reassertErrors.Load(),
		UnkeptShareUnits:  l.stats.unkept.Load(),
		HeldCalls:         l.stats.held.Load(),
		GivenBackUnits:    l.stats.givenBack.Load(),
		GiveBackErrors:    l.stats.giveBackErrors.Load(),
		AckedGrants:       l.durability.acked.Load(),
		Unacked: UnackedGrants{Timeout: l.durability.timeout.Load(), Unsupported: l.durability.unsupported.Load(),
			Error: l.durability.failed.Load(), Busy: l.durability.busy.Load()},
		BreakerOpen: slices.ContainsFunc(shards, func(s ShardState) bool { return s.Open }),
		Shards:      shards,
	}
}
