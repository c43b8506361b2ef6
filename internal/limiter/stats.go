package limiter

import (
	"slices"
	"sync/atomic"
)

// Stats are counters since the limiter was created, for metrics.
type Stats struct {
	// RedisDecisions were answered by a script in Redis.
	RedisDecisions uint64
	// PrecheckRefusals were refused locally without a Redis call.
	PrecheckRefusals uint64
	// LeaseDecisions were admitted locally from a lease, without a Redis call.
	LeaseDecisions uint64
	// LeaseGrants are Redis decisions that granted a lease of more than their own cost.
	LeaseGrants uint64
	// DegradedDecisions were made by a failure mode (open, closed or local fallback).
	DegradedDecisions uint64
	// Pipelines is the number of Redis round trips made for decisions, NOSCRIPT retries included.
	Pipelines uint64
	// ScriptLoads counts SCRIPT LOADs after NOSCRIPT.
	ScriptLoads uint64
	// StaleCalls reached Redis after their deadline and counted nothing (see CallDeadline).
	StaleCalls uint64
	// LeaseKeys is the number of keys in the lease table now (holding a lease, or about to).
	LeaseKeys int
	// ShareKeys is the number of keys this replica keeps shares of now.
	ShareKeys int
	// Restorations counts calls whose shares found Redis short of them (a failover or a
	// restart lost counts), and RestoredUnits the units they added back.
	Restorations, RestoredUnits uint64
	// Reassertions counts re-assertions of every live share, and ReassertErrors those that
	// could not reach every key (the next one retries).
	Reassertions, ReassertErrors uint64
	// HeldCalls counts decisions that waited for the replicas to restore their shares
	// (RestoreHold) and went to the failure mode.
	HeldCalls uint64
	// UnkeptShareUnits counts units granted to keys beyond ShareKeys: those keep no share, and
	// Redis losing them could not be repaired.
	UnkeptShareUnits uint64
	// HoldsOpen is the size of this replica's table of open holds now (see holdtable.go).
	HoldsOpen int
	// GivenBackUnits counts units GiveBack gave back (requests another rule refused), and
	// GiveBackErrors the give-backs that could not be made (their units stayed counted).
	GivenBackUnits, GiveBackErrors uint64
	// AckedGrants counts grants of a limit with Durability whose wait acknowledged them, and
	// Unacked those whose wait did not (they stand: see durability.go), by reason.
	AckedGrants uint64
	Unacked     UnackedGrants
	// BreakerOpen says the circuit breaker of some shard is open now.
	BreakerOpen bool
	// Shards are the circuit breakers, one per shard (see ShardState), by name.
	Shards []ShardState
}

// UnackedGrants counts grants whose wait did not acknowledge them, by reason.
type UnackedGrants struct {
	// Timeout: no acknowledgement within the timeout. Unsupported: the server does not know
	// WAITAOF (before Redis 7.2). Error: the server refused the wait or did not answer it.
	// Busy: sent without a wait, as many waits as the pool allows running already.
	Timeout, Unsupported, Error, Busy uint64
}

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
