package limiter

import (
	"cmp"
	"context"
	"strconv"
	"time"
)

// The line: the requests that wait for a slot of a full key take turns across replicas.
//
// Each replica keeps its waiters of a key in its own queue, first come first served; only the
// oldest of them, its head, asks Redis for a slot, as a Waiter. A waiter refused joins the
// key's line in Redis, beside its slots on the same hash slot: a zset of waiter ids scored by
// their arrival on Redis's clock (<key>:q) and one of their deadlines (<key>:qd). Each try
// moves its deadline Expiry on; a waiter whose deadline passed (its replica died, or stalled
// for Expiry) leaves the line by itself, swept 16 a call as dead slots are. A waiter is
// granted a slot only when the live slots plus the waiters ahead of it leave room, and leaves
// the line in the same call; a try without a waiter (a request that found its replica's queue
// empty, or a rule without a queue) only when the live slots plus every live waiter do. So a
// slot given back goes to the earliest head of the line, whichever replica it waits in: the
// replicas take turns, one request of each at a time, and each keeps its own order. A waiter
// that leaves without a slot (its timeout, its client gone, a failure mode's verdict) is
// taken off the line at once by LeaveLine, one round trip.
//
// It is the slots' mechanism, not a second one: the same scripts, zsets scored on Redis's
// clock, bounded sweeps, and the line's own bounds: at most MaxInFlight waiters (a waiter that
// finds it full is decided as a try without one), ids of at most 100 bytes, each call
// O(log n) whatever a tenant stuffed in its own line.

// DefaultWaiterExpiry is Waiter.Expiry when not set.
const DefaultWaiterExpiry = 2 * time.Second

// Waiter is the request of this replica that waits for a slot of a key and asks Redis for it:
// its place in the key's line across replicas. One request uses it at a time. The zero value
// is ready to use; it takes an id at its first try.
type Waiter struct {
	// Expiry is how long the line keeps it after its last try (0: DefaultWaiterExpiry): each
	// try moves its deadline on, so it must try more often than that.
	Expiry time.Duration

	id     string
	inLine bool // a try may have put it in the line, and no grant took it out since
}

// lineKeys are the zsets of key's line: its waiters by arrival, and by deadline. The suffixes
// keep them on key's hash slot (key ends in its hash tag).
func lineKeys(key string) (line, due string) { return key + ":q", key + ":qd" }

// try is the waiter id and expiry an acquisition sends ("" without a waiter). From here on
// the script may put w in the line.
func (w *Waiter) try(l *Limiter) (string, time.Duration) {
	if w == nil {
		return "", DefaultWaiterExpiry
	}
	if w.id == "" {
		w.id = l.opts.ReplicaID + ":" + l.holdTag + "w" + strconv.FormatUint(l.holdSeq.Add(1), 36)
	}
	w.inLine = true
	return w.id, cmp.Or(max(w.Expiry, 0), DefaultWaiterExpiry)
}

// granted records a try Redis answered: a grant took w out of the line.
func (w *Waiter) granted(ok bool) {
	if w != nil && ok {
		w.inLine = false
	}
}

// LeaveLine takes w, which no longer waits for a slot of key, off the key's line (one round
// trip, both zsets), unless it is not in it: it never tried, or its last try was granted.
// It never fails: a waiter that cannot be taken off leaves at its deadline, Expiry after its
// last try. While Redis is suspect (a call failed or the node changed since this replica's
// last complete renewal) it sends nothing: the request it ends, refused by its failure mode
// perhaps, is not held up by a Redis that fails, and the waiter leaves at its deadline.
func (l *Limiter) LeaveLine(ctx context.Context, key string, w *Waiter) {
	if w == nil || !w.inLine {
		return
	}
	w.inLine = false
	if l.slotGen() != l.slotCleared.Load() {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), lineLeaveTimeout)
	defer cancel()
	line, due := lineKeys(key)
	pipe := l.client.Pipeline()
	pipe.ZRem(ctx, line, w.id)
	pipe.ZRem(ctx, due, w.id)
	_, _ = pipe.Exec(ctx) // a waiter left behind leaves at its deadline
}

// lineLeaveTimeout bounds a leave: its request is answered after it, and a waiter not taken
// off leaves at its deadline, a few seconds on, anyway.
const lineLeaveTimeout = 500 * time.Millisecond
