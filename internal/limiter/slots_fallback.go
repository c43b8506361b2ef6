package limiter

import (
	"errors"
	"sync"
	"time"
)

// LocalFallback for in-flight limits: while Redis cannot be asked (or the slots settle after a
// failover), each replica admits at most its share of N requests of a key in progress at once,
// N divided by the live replica count (InFlight.Replicas, else Options.FallbackReplicas),
// rounded down but at least one, counted in this process. A request admitted so holds a local
// slot: Release gives it back here, without a Redis call, and it is never renewed or lost.
//
// What it does not do: a local slot is not in Redis, so when Redis answers again the replicas'
// Redis slots do not count it; while such a request runs on, a key may have up to its local
// holders more than N in progress. Local slots count against MaxSlots with Redis's.

// localSlots counts the local slots per key.
type localSlots struct {
	mu    sync.Mutex
	byKey map[string]int64
}

// share is a replica's part of max under LocalFallback.
func (l *Limiter) localShare(lim InFlight) int64 {
	replicas := lim.Replicas
	if replicas < 1 {
		replicas = l.opts.FallbackReplicas
	}
	return max(lim.Max/max(replicas, 1), 1)
}

// slotFailure is the failure mode's decision when Redis was not asked or its answer cannot be
// trusted (err says why): Closed refuses, Open admits without a slot, LocalFallback takes a
// local slot of key while this replica holds fewer than its share. This replica's own bound
// of slots (ErrSlotsFull) refuses whatever the mode.
func (l *Limiter) slotFailure(key string, lim InFlight, err error) (SlotResult, *Slot) {
	l.stats.degraded.Add(1)
	refused := SlotResult{Allowed: lim.Shadow, Full: true, RetryAfter: time.Second, Err: err}
	switch {
	case lim.FailureMode == FailureModeClosed || errors.Is(err, ErrSlotsFull):
		return refused, nil
	case lim.FailureMode != FailureModeLocalFallback:
		return SlotResult{Allowed: true, Err: err}, nil
	}
	share := l.localShare(lim)
	if !l.slotBook.take() {
		return SlotResult{Allowed: lim.Shadow, Full: true, RetryAfter: time.Second, Err: ErrSlotsFull}, nil
	}
	l.local.mu.Lock()
	defer l.local.mu.Unlock()
	held := l.local.byKey[key]
	if held >= share {
		l.slotBook.untake()
		refused.InUse = held
		return refused, nil
	}
	if l.local.byKey == nil {
		l.local.byKey = map[string]int64{}
	}
	l.local.byKey[key] = held + 1
	s := &Slot{key: key, max: lim.Max, book: l.slotBook, lost: make(chan struct{}), local: true}
	return SlotResult{Allowed: true, InUse: held + 1, Err: err}, s
}

// releaseLocal gives back a local slot.
func (l *Limiter) releaseLocal(s *Slot) {
	l.slotBook.untake()
	l.local.mu.Lock()
	defer l.local.mu.Unlock()
	if n := l.local.byKey[s.key] - 1; n > 0 {
		l.local.byKey[s.key] = n
	} else {
		delete(l.local.byKey, s.key)
	}
}
