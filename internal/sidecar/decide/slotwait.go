package decide

import (
	"context"
	"slices"
	"strings"
	"time"

	"github.com/redline-dev/redline/internal/limiter"
	"github.com/redline-dev/redline/internal/sidecar/ruleset"
	"github.com/redline-dev/redline/internal/sidecar/slotqueue"
)

// WaitSlots is AcquireSlots, except that an in-flight rule with a queue whose key is full lets
// the request wait in e.Queue for a slot, up to the rule's timeout, first come first served
// among this sidecar's requests of the key, instead of refusing it at once. A request that
// finds the key's queue (or the sidecar's) full, or whose timeout passes, is refused as it
// would be without a queue; one whose ctx ends (its client went away) leaves the queue and is
// refused. While it waits for one key's slot it holds those it took before: every request
// takes its slots in the order of their keys, whatever order its plan gives (a /v1/check
// names its hits in its client's order), so no two wait for each other's. Outcomes stay in
// the plan's order. sh is the share of the queue of the face the request came through (nil:
// none but the queue's).
func (e *Engine) WaitSlots(ctx context.Context, plan *Plan, sh *slotqueue.Share) *Slots {
	s := &Slots{}
	order := keyOrder(plan.slots)
	for k := range plan.slots {
		i := k
		if order != nil {
			i = order[k]
		}
		if !e.acquire(ctx, s, plan.slots[i], true, sh) {
			break
		}
	}
	s.planOrder(order)
	return s
}

// keyOrder is the indexes of calls in the order of their keys (equal keys in plan order), or
// nil when that is the plan's order.
func keyOrder(calls []call) []int {
	if slices.IsSortedFunc(calls, func(a, b call) int { return strings.Compare(a.key, b.key) }) {
		return nil
	}
	order := make([]int, len(calls))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return strings.Compare(calls[a].key, calls[b].key) })
	return order
}

// planOrder puts s's outcomes, decided in order (keyOrder's), back in the plan's order.
func (s *Slots) planOrder(order []int) {
	if order == nil {
		return
	}
	decided := make([]int, len(s.Outcomes)) // the plan index of each outcome
	copy(decided, order)
	out := make([]SlotOutcome, 0, len(s.Outcomes))
	at := -1 // the refusal's place in out: the last outcome decided is the one that refused
	for i := range len(order) {
		if j := slices.Index(decided, i); j >= 0 {
			if s.Refused != nil && j == len(decided)-1 {
				at = len(out)
			}
			out = append(out, s.Outcomes[j])
		}
	}
	s.Outcomes = out
	if at >= 0 {
		s.Refused = &s.Outcomes[at]
	}
}

// takeSlot asks the limiter for a slot of r under key, once. An invalid limit or a closed
// limiter is decided as a Redis failure would be.
func takeSlot(ctx context.Context, sl Limiter, key string, r *ruleset.Rule) (limiter.SlotResult, *limiter.Slot) {
	return slotVerdict(r)(sl.Acquire(ctx, key, inFlightOf(r)))
}

// takeSlotInTurn is takeSlot for w, the head of this sidecar's queue of key.
func takeSlotInTurn(ctx context.Context, sl Limiter, key string, r *ruleset.Rule, w *limiter.Waiter) (limiter.SlotResult, *limiter.Slot) {
	return slotVerdict(r)(sl.AcquireInTurn(ctx, key, inFlightOf(r), w))
}

// inFlightOf is the rule's in-flight limit with the live replica count its LocalFallback
// divides by.
func inFlightOf(r *ruleset.Rule) limiter.InFlight {
	lim := *r.InFlight
	if r.Policy != nil && r.Policy.Replicas != nil {
		lim.Replicas = r.Policy.Replicas.Load()
	}
	return lim
}

// slotVerdict decides an acquisition that failed (an invalid limit, a closed limiter) as a
// Redis failure would be.
func slotVerdict(r *ruleset.Rule) func(limiter.SlotResult, *limiter.Slot, error) (limiter.SlotResult, *limiter.Slot) {
	return func(res limiter.SlotResult, slot *limiter.Slot, err error) (limiter.SlotResult, *limiter.Slot) {
		if err != nil {
			res = limiter.SlotResult{Allowed: r.InFlight.FailureMode != limiter.FailureModeClosed || r.Shadow, Err: err}
		}
		return res, slot
	}
}

// waitSlot takes a slot of r under key, waiting in e.Queue while the key is full. Only a full
// key waits: a slot taken, a failure mode's verdict (Redis down, the sidecar's own bound of
// slots, a failover's settling) and a shadow rule's are final at once. The Redis calls run under ctx, not the wait's
// timeout, so a timeout passing mid-call never makes a failure mode admit; a refusal for a
// timeout or a full queue is the key's last refusal, Full.
func (e *Engine) waitSlot(ctx context.Context, sl Limiter, key string, r *ruleset.Rule, sh *slotqueue.Share) (limiter.SlotResult, *limiter.Slot) {
	res := limiter.SlotResult{Full: true, InUse: r.InFlight.Max, RetryAfter: time.Second}
	var slot *limiter.Slot
	wctx, cancel := context.WithTimeout(ctx, r.Queue.Timeout)
	defer cancel()
	var queued func(int)
	if e.OnQueued != nil || r.Top != nil {
		queued = func(delta int) {
			if e.OnQueued != nil {
				e.OnQueued(r, delta)
			}
			if r.Top != nil {
				r.Top.Slots.Queue(int64(delta))
			}
		}
	}
	// The head of this sidecar's queue takes its turn in the key's line across replicas; a
	// first try, with nobody waiting here, does not join it (joining the queue, the request
	// becomes the head and joins at its next try).
	w := &limiter.Waiter{Expiry: waiterExpiry(e.Queue.PollEvery())}
	// Wait's error (no room to wait, the timeout, the client gone) leaves res the key's last
	// refusal, Full.
	_ = e.Queue.Wait(wctx, key, r.Queue.Size, sh, func(head bool) bool {
		if head {
			res, slot = takeSlotInTurn(ctx, sl, key, r, w)
		} else {
			res, slot = takeSlot(ctx, sl, key, r)
		}
		return res.Allowed || !res.Full || res.Err != nil
	}, queued)
	// Whatever ended the wait without a slot, its place in the line goes at once, not at its
	// deadline.
	sl.LeaveLine(ctx, key, w)
	return res, slot
}

// waiterTries is how many of its polls a head may miss before the key's line lets it go: a
// sidecar that died or stalled holds up the other replicas' waiters at most that long.
const waiterTries = 8

// waiterExpiry is how long the key's line keeps a head that polls every poll: waiterTries
// polls, and at least a second, so that a busy sidecar's head keeps its place.
func waiterExpiry(poll time.Duration) time.Duration {
	return max(waiterTries*poll, time.Second)
}
