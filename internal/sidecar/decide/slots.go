package decide

import (
	"context"
	"strconv"
	"strings"

	"github.com/redline-dev/redline/internal/keyscheme"
	"github.com/redline-dev/redline/internal/limiter"
	"github.com/redline-dev/redline/internal/sidecar/ruleset"
	"github.com/redline-dev/redline/internal/sidecar/slotqueue"
)

// SlotOutcome is one in-flight rule's decision.
type SlotOutcome struct {
	Rule   *ruleset.Rule
	Result limiter.SlotResult
}

// Refuses says whether this outcome refuses the request: an Enforce rule whose key is full.
func (o *SlotOutcome) Refuses() bool { return !o.Result.Allowed }

// Slots are what a request's in-flight rules decided, and the slots it holds until it ends.
type Slots struct {
	// Outcomes has one entry per matching in-flight rule, in rule order, up to the first that
	// refused.
	Outcomes []SlotOutcome
	// Refused is the refusing outcome, or nil when the request may proceed.
	Refused *SlotOutcome

	slotter  Limiter
	held     []*limiter.Slot
	rules    []*ruleset.Rule // of each held slot
	onSlots  func(r *ruleset.Rule, delta int)
	released func(key string)      // wakes the key's waiters (Engine.Queue)
	finished func(r *ruleset.Rule) // Engine.OnLetFinish
}

// AcquireSlots takes a slot of every in-flight rule of plan, in its order (one Redis call
// each). When one refuses, the slots taken already go back at once and Refused says which; the
// request then holds nothing. A plan without in-flight rules holds nothing and costs nothing.
// Release what it returns when the request ends, whatever the verdict.
func (e *Engine) AcquireSlots(ctx context.Context, plan *Plan) *Slots {
	s := &Slots{}
	for _, c := range plan.slots {
		if !e.acquire(ctx, s, c, false, nil) {
			return s
		}
	}
	return s
}

// acquire takes a slot of c's rule under its key into s, and says whether the request may go on;
// when it may not, s.Refused is set and every slot s held went back. With wait, a rule with a
// queue waits in e.Queue, within sh, for a slot of a full key (see WaitSlots).
func (e *Engine) acquire(ctx context.Context, s *Slots, c call, wait bool, sh *slotqueue.Share) bool {
	sl, r, key := e.Limiter, c.rule, c.key
	s.slotter, s.onSlots, s.finished = sl, e.OnSlots, e.OnLetFinish
	if e.Queue != nil {
		s.released = e.Queue.Released
	}
	var res limiter.SlotResult
	var slot *limiter.Slot
	if wait && r.Queue != nil && e.Queue != nil {
		res, slot = e.waitSlot(ctx, sl, key, r, sh)
	} else {
		res, slot = takeSlot(ctx, sl, key, r)
	}
	if e.ObserveSlot != nil {
		e.ObserveSlot(r, res)
	}
	if t := r.Top; t != nil {
		label := ""
		if r.ReportValues {
			label = strings.Join(c.parts, " ")
		}
		hash := keyscheme.Hash(key)
		t.Observe(hash, label, res.Full)
		if slot != nil {
			t.Slots.Hold(hash, label, 1)
		}
	}
	s.Outcomes = append(s.Outcomes, SlotOutcome{Rule: r, Result: res})
	if slot != nil {
		s.held, s.rules = append(s.held, slot), append(s.rules, r)
		if s.onSlots != nil {
			s.onSlots(r, 1)
		}
	}
	if !res.Allowed {
		s.Refused = &s.Outcomes[len(s.Outcomes)-1]
		s.Release(ctx)
		return false
	}
	return true
}

// Split hands each slot s holds to a Slots of its own, with the limiter key it counts under, in
// the order taken; s then holds nothing. Envoy gives back each descriptor's slot on its own.
func (s *Slots) Split() []KeyedSlots {
	out := make([]KeyedSlots, len(s.held))
	for i, sl := range s.held {
		out[i] = KeyedSlots{Key: sl.Key(), Slots: &Slots{slotter: s.slotter, held: []*limiter.Slot{sl}, rules: s.rules[i : i+1], onSlots: s.onSlots, released: s.released, finished: s.finished}}
	}
	s.held, s.rules = nil, nil
	return out
}

// KeyedSlots is a Slots whose one slot counts under Key.
type KeyedSlots struct {
	Key   string
	Slots *Slots
}

// LostAny says whether a slot s holds stopped counting before its release.
func (s *Slots) LostAny() bool {
	for _, sl := range s.held {
		select {
		case <-sl.Lost():
			return true
		default:
		}
	}
	return false
}

// WatchLost watches, until ctx ends, the slots s holds for one that stops counting before the
// request ends (see limiter.Slot.Lost). Of a rule that ends its requests then (the default),
// it calls end: another request may hold its place. Of a rule that lets them finish
// (LetFinish), the request runs on uncounted, and the engine's OnLetFinish hears of it. One
// goroutine per slot held, each gone when ctx ends.
func (s *Slots) WatchLost(ctx context.Context, end func()) {
	for i, sl := range s.held {
		r := s.rules[i]
		go func() {
			select {
			case <-sl.Lost():
			case <-ctx.Done():
				return
			}
			if !r.LetFinish {
				end()
			} else if s.finished != nil {
				s.finished(r)
			}
		}()
	}
}

// keyed is the limiter key of each slot s holds, and the limit of its rule.
func (s *Slots) keyed() (keys []string, limits []int64) {
	for i, sl := range s.held {
		keys, limits = append(keys, sl.Key()), append(limits, s.rules[i].InFlight.Max)
	}
	return keys, limits
}

// Held says how many slots the request holds (0 for nil: no in-flight rule).
func (s *Slots) Held() int {
	if s == nil {
		return 0
	}
	return len(s.held)
}

// Refuses says whether an in-flight rule refused the request; false for nil (no in-flight rule).
func (s *Slots) Refuses() bool { return s != nil && s.Refused != nil }

// Release gives back every slot the request holds (one ZREM each). Later calls do nothing,
// and so does a call on nil.
func (s *Slots) Release(ctx context.Context) {
	if s == nil {
		return
	}
	for i, sl := range s.held {
		s.slotter.Release(ctx, sl)
		if s.onSlots != nil {
			s.onSlots(s.rules[i], -1)
		}
		if t := s.rules[i].Top; t != nil {
			t.Slots.Hold(keyscheme.Hash(sl.Key()), "", -1)
		}
		if s.released != nil {
			s.released(sl.Key())
		}
	}
	s.held, s.rules = nil, nil
}

// WriteFields adds the in-flight rules' RateLimit fields to f, in the draft's
// concurrent-requests quota unit: "<policy>/<rule>";q=<max>;qu="concurrent-requests" and
// "<policy>/<rule>";r=<free slots>;t=<seconds>. On a refusal Retry-After is 1 s: a slot may
// free at any time. Shadow rules are left out, and on an admitted request the rules of policies
// that publish their limits on refusal only.
func (s *Slots) WriteFields(f *Fields) {
	for i := range s.Outcomes {
		o := &s.Outcomes[i]
		if o.Rule.Shadow || s.Refused == nil && o.Rule.Policy.HeadersOnRefusal {
			continue
		}
		pol, rl := []byte(f.Policy), []byte(f.RateLimit)
		if len(pol) > 0 {
			pol = append(pol, ", "...)
			rl = append(rl, ", "...)
		}
		pol = appendSFString(pol, o.Rule.ID)
		pol = append(pol, ";q="...)
		pol = strconv.AppendInt(pol, o.Rule.InFlight.Max, 10)
		pol = append(pol, `;qu="concurrent-requests"`...)
		rl = appendSFString(rl, o.Rule.ID)
		rl = append(rl, ";r="...)
		free := int64(0)
		if !o.Result.Full {
			free = max(o.Rule.InFlight.Max-o.Result.InUse, 0)
		}
		rl = strconv.AppendInt(rl, free, 10)
		rl = append(rl, ";t=1"...)
		f.Policy, f.RateLimit = string(pol), string(rl)
	}
	if s.Refused != nil {
		f.RetryAfter = strconv.FormatInt(max(CeilSeconds(s.Refused.Result.RetryAfter), 1), 10)
	}
}
