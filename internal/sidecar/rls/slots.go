package rls

import (
	"context"
	"errors"
	"math"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/redline-dev/redline/internal/sidecar/decide"
	"github.com/redline-dev/redline/internal/sidecar/ruleset"
)

// In-flight rules follow Envoy's concurrency emulation with apply_on_stream_done: the
// descriptor sent when the request starts (without is_negative_hits; its hits_addend does not
// matter, a request holds one slot) takes a slot of the rule's key, kept here under that key;
// the same descriptor sent when the stream is done, with is_negative_hits, gives back the
// oldest slot kept under its key (one per descriptor: one request ends), unless it is the
// stream-done call of a refused request (see decide.SlotRegistry.Owe). Envoy never renews: a
// slot whose stream-done call never comes (an Envoy restarted mid-stream) is released when
// its lease runs out (Slots.Lease, the flag --in-flight-envoy-hold).

// slotHit is an in-flight descriptor that starts a request.
type slotHit struct {
	hit decide.Hit
	at  int // its descriptor's index
}

// endSlot is the stream-done call of one request under hit's key: it pays back a refusal owed
// under the key (decide.SlotRegistry.Owe), or else gives back the oldest slot kept under it.
// One descriptor ends one request, whatever its hits_addend: a larger one would end other
// requests' slots.
func (s *Server) endSlot(ctx context.Context, set *ruleset.Set, hit decide.Hit) {
	if key, _, ok := decide.HitKey(set, hit); ok {
		if sl := s.Slots.EndOne(key); sl != nil {
			sl.Release(ctx)
		}
	}
}

// oweSlots records, for each in-flight descriptor of a request that keeps no slot (refused,
// or admitted while its rule was reloaded away), that its stream-done call ends no slot.
func (s *Server) oweSlots(set *ruleset.Set, hits []slotHit) {
	for _, h := range hits {
		if key, r, ok := decide.HitKey(set, h.hit); ok && r.InFlight != nil {
			s.Slots.Owe(key)
		}
	}
}

// takeSlots takes a slot of each in-flight rule of plan and keeps each under its key for its
// stream-done call. When a rule refuses, or there is no room to keep a slot, every slot taken
// goes back (slots.Refused says which rule refused; err is the registry's error).
func (s *Server) takeSlots(ctx context.Context, plan *decide.Plan) (slots *decide.Slots, ids []string, err error) {
	slots = s.Engine.AcquireSlots(ctx, plan)
	if slots.Refused != nil {
		return slots, nil, nil
	}
	keyed := slots.Split()
	for i, k := range keyed {
		id, _, err := s.Slots.Put(k.Slots, k.Key)
		if err != nil {
			// No room: this key's slots and every later key's go back with those kept.
			for _, rest := range keyed[i:] {
				rest.Slots.Release(ctx)
			}
			s.dropSlots(ctx, ids)
			return slots, nil, err
		}
		ids = append(ids, id)
	}
	return slots, ids, nil
}

// dropSlots takes back and releases the slots kept under ids.
func (s *Server) dropSlots(ctx context.Context, ids []string) {
	for _, id := range ids {
		if sl := s.Slots.Take(id); sl != nil {
			sl.Release(ctx)
		}
	}
}

// slotStatuses fills the statuses of the in-flight descriptors from what their rules decided.
func slotStatuses(resp *rlsv3.RateLimitResponse, slots *decide.Slots, hits []slotHit) {
	for i, o := range slots.Outcomes {
		st := resp.Statuses[hits[i].at]
		st.CurrentLimit = &rlsv3.RateLimitResponse_RateLimit{Name: o.Rule.ID, RequestsPerUnit: uint32(min(o.Rule.InFlight.Max, math.MaxUint32))}
		if !o.Result.Full {
			st.LimitRemaining = uint32(max(min(o.Rule.InFlight.Max-o.Result.InUse, math.MaxUint32), 0))
		}
		if o.Refuses() {
			st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
		}
	}
}

// decideAll decides the rules per window of hits and takes the slots of slotHits, matched once
// (one plan), in the proxy's order: with token budgets' holds, the slots first, then the
// holds; otherwise the rules per window first, so a request they refuse takes no slot.
// Whichever refuses, what the other took goes back. When the registry has no room for a slot
// or hold, full says so and the request is refused as a whole. slots is nil when no in-flight
// rule was asked.
func (s *Server) decideAll(ctx context.Context, set *ruleset.Set, hits []decide.Hit, slotHits []slotHit, holds bool) (d decide.Decision, full *noRoom, slots *decide.Slots, err error) {
	all := hits
	if len(slotHits) > 0 {
		all = make([]decide.Hit, 0, len(hits)+len(slotHits))
		all = append(all, hits...)
		for _, h := range slotHits {
			all = append(all, h.hit)
		}
	}
	plan, err := s.Engine.PlanHits(set, all, 1)
	if err != nil {
		return decide.Decision{}, nil, nil, err
	}
	var ids []string
	if holds {
		if slots, ids, full, err = s.slotsOf(ctx, &plan, len(slotHits)); err != nil || full != nil || slots.Refuses() {
			return decide.Decision{}, full, slots, err
		}
		d, full, err = s.reserve(ctx, &plan)
		if err != nil || full != nil || !d.Allowed {
			s.dropSlots(ctx, ids)
		}
		return d, full, slots, err
	}
	if d = s.Engine.Decide(ctx, &plan); !d.Allowed {
		return d, nil, nil, nil
	}
	if slots, _, full, err = s.slotsOf(ctx, &plan, len(slotHits)); err != nil || full != nil || slots.Refuses() {
		d.GiveBack(ctx)
	}
	return d, full, slots, err
}

// slotsOf is takeSlots of plan's n in-flight rules with the registry's refusal as a noRoom;
// nil slots when there are none (a request of rules per window only allocates nothing here).
func (s *Server) slotsOf(ctx context.Context, plan *decide.Plan, n int) (*decide.Slots, []string, *noRoom, error) {
	if n == 0 {
		return nil, nil, nil, nil
	}
	slots, ids, err := s.takeSlots(ctx, plan)
	if re, ok := errors.AsType[*decide.RefusedError](err); ok {
		return slots, nil, &noRoom{Err: re}, nil
	}
	return slots, ids, nil, err
}
