package decide

import (
	"context"
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
// refused. While it waits for one rule's slot it holds those of the rules before it: every
// request takes its rules' slots in the same order, so no two wait for each other's. sh is
// the share of the queue of the face the request came through (nil: none but the queue's).
func (e *Engine) WaitSlots(ctx context.Context, plan *Plan, sh *slotqueue.Share) *Slots {
	s := &Slots{}
	for _, c := range plan.slots {
		if !e.acquire(ctx, s, c, true, sh) {
			return s
		}
	}
	return s
}

// takeSlot asks the limiter for a slot of r under key, once. An invalid limit or a closed
// limiter is decided as a Redis failure would be.
func takeSlot(ctx context.Context, sl Limiter, key string, r *ruleset.Rule) (limiter.SlotResult, *limiter.Slot) {
	res, slot, err := sl.Acquire(ctx, key, *r.InFlight)
	if err != nil {
		res = limiter.SlotResult{Allowed: r.InFlight.FailureMode != limiter.FailureModeClosed || r.Shadow, Err: err}
	}
	return res, slot
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
	// Wait's error (no room to wait, the timeout, the client gone) leaves res the key's last
	// refusal, Full.
	_ = e.Queue.Wait(wctx, key, r.Queue.Size, sh, func() bool {
		res, slot = takeSlot(ctx, sl, key, r)
		return res.Allowed || !res.Full || res.Err != nil
	}, queued)
	return res, slot
}
