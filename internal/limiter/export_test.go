package limiter

import (
	"time"

	"github.com/redis/go-redis/v9"
)

// TestOptions are Options with the knobs production leaves at their defaults, which the
// tests turn: a batch of one, no pre-check, a breaker that opens at once, a clock of their own.
type TestOptions struct {
	LeaseHorizon     time.Duration
	LeaseSize        int
	CallDeadline     time.Duration
	SlotExpiry       time.Duration
	ReplicaID        string
	ShareKeys        int
	FallbackReplicas int64
	RestoreHold      time.Duration
	OnRestore        func(policy string, units int64)
	NodeChanges      func() uint64

	MaxBatch, MaxDetached, PrecheckSize, MaxHolds, MaxOpenHolds int
	BreakerFailures                                             uint32
	BreakerOpenFor                                              time.Duration
	MaxLease                                                    int64
	Now                                                         func() time.Time
}

// NewWith is New with o's knobs.
func NewWith(client redis.UniversalClient, o TestOptions) (*Limiter, error) {
	return New(client, Options{
		LeaseHorizon: o.LeaseHorizon, LeaseSize: o.LeaseSize, CallDeadline: o.CallDeadline,
		SlotExpiry: o.SlotExpiry, ReplicaID: o.ReplicaID, ShareKeys: o.ShareKeys,
		FallbackReplicas: o.FallbackReplicas, RestoreHold: o.RestoreHold, OnRestore: o.OnRestore, NodeChanges: o.NodeChanges,
		MaxBatch: o.MaxBatch, maxDetached: o.MaxDetached, PrecheckSize: o.PrecheckSize,
		maxHolds: o.MaxHolds, maxOpenHolds: o.MaxOpenHolds, breakerFailures: o.BreakerFailures,
		breakerOpenFor: o.BreakerOpenFor, maxLease: o.MaxLease, now: o.Now,
	})
}

// TestStats are Stats with the counters of holds no metric reads.
type TestStats struct {
	Stats
	HoldsReserved, HoldsSettled, HoldsExpired, HoldsLapsed, HoldsUntracked uint64
	HoldReturnedUnits, DebtUnits                                           uint64
}

// TestStats returns the limiter's counters, those of holds included.
func (l *Limiter) TestStats() TestStats {
	h := l.holdCounts()
	return TestStats{Stats: l.Stats(), HoldsReserved: h.reserved, HoldsSettled: h.settled,
		HoldsExpired: h.expired, HoldsLapsed: h.lapsed, HoldsUntracked: h.untracked,
		HoldReturnedUnits: h.returnedUnits, DebtUnits: h.debtUnits}
}

// The bounds the tests check, which callers have no use for.
const (
	DefaultMaxOpenHolds  = defaultMaxOpenHolds
	MaxDurabilityTimeout = maxDurabilityTimeout
	MaxUsed              = maxUsed
)
