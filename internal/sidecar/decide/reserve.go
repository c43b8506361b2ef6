package decide

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/redline-dev/redline/internal/keyscheme"
	"github.com/redline-dev/redline/internal/limiter"
	"github.com/redline-dev/redline/internal/sidecar/ruleset"
)

// Need is what a request is known to need before it is sent, read from its body: the
// request's share of a rule whose cost comes from its response.
type Need struct {
	// Sized says the body was read and its shape understood; when false, every response-cost
	// rule holds its DefaultHold.
	Sized bool
	// Prompt is the estimate of the input's cost.
	Prompt int64
	// Output is the output cap the client asked for (0: none).
	Output int64
}

// settleTimeout bounds one settle: it runs after the request, whose context may be gone.
const settleTimeout = 5 * time.Second

// held is one rule's hold of a request.
type held struct {
	rule *ruleset.Rule
	key  string // the limiter key it holds under
	hold *limiter.Hold
}

// Holds are the holds one admitted request took, one per matching rule whose cost comes from
// its response. Settle ends them once; the holds of a request that is never settled stay spent
// (its holder is taken for dead at their deadline: its stream may have been served).
type Holds struct {
	r     Limiter
	holds []held
	once  sync.Once
	sum   limiter.Settled
	err   error
	// Observe hears of each settle (metrics), as the Engine's Observe does of decisions.
	observe func(*ruleset.Rule, limiter.Settled, error)
}

// Afford is the most the request may cost: the smallest hold of its Enforce rules. capped
// is false when no Enforce rule holds (Shadow rules count, but never cap a request).
func (h *Holds) Afford() (units int64, capped bool) {
	if h == nil {
		return 0, false
	}
	for _, x := range h.holds {
		if x.rule.Shadow {
			continue
		}
		if !capped || x.hold.Units < units {
			units, capped = x.hold.Units, true
		}
	}
	return units, capped
}

// Len is how many holds the request took.
func (h *Holds) Len() int {
	if h == nil {
		return 0
	}
	return len(h.holds)
}

// Settle ends every hold with what the request used: used when known, else by each rule's
// OnError when the request failed (upstream error, timeout, client abort), else the whole
// hold (a response that ended without saying its cost costs what was held). Only the first
// call settles; later ones return what it did. The sum is over the holds; the error
// joins the settles that failed (each of their holds stays counted until its window ends).
func (h *Holds) Settle(ctx context.Context, used int64, known, failed bool) (limiter.Settled, error) {
	if h == nil {
		return limiter.Settled{}, nil
	}
	h.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), settleTimeout)
		defer cancel()
		got := make([]limiter.Settled, len(h.holds))
		errs := make([]error, len(h.holds))
		var wg sync.WaitGroup
		for i, x := range h.holds {
			u := settledCost(x.rule.Cost, x.hold.Units, used, known, failed)
			wg.Go(func() {
				got[i], errs[i] = h.r.Settle(ctx, x.hold, u)
				if h.observe != nil {
					h.observe(x.rule, got[i], errs[i])
				}
			})
		}
		wg.Wait()
		for i := range got {
			h.sum.Returned += got[i].Returned
			h.sum.Debt += got[i].Debt
			h.sum.Expired = h.sum.Expired || got[i].Expired
		}
		h.err = errors.Join(errs...)
	})
	return h.sum, h.err
}

// settledCost is what one hold of units settles at.
func settledCost(c *ruleset.Cost, units, used int64, known, failed bool) int64 {
	switch {
	case failed && c != nil && c.ZeroOnError:
		return 0
	case known:
		return max(used, 0)
	default:
		return units
	}
}

// bounds are the least and most units a rule holds for a request of need.
func bounds(r *ruleset.Rule, need Need) (lo, hi int64) {
	capacity := r.Limit.Capacity()
	if !need.Sized {
		d := min(r.Cost.DefaultHold, capacity)
		return d, d
	}
	lo = sat(need.Prompt, r.Cost.MinOutput)
	hi = capacity
	if need.Output > 0 {
		hi = min(sat(need.Prompt, need.Output), capacity)
	}
	return max(lo, 1), max(hi, lo, 1)
}

// sat is a+b for non-negative counts, saturating instead of wrapping.
func sat(a, b int64) int64 {
	a, b = max(a, 0), max(b, 0)
	if s := a + b; s >= a {
		return s
	}
	return 1<<63 - 1
}

// Reserve decides plan like Decide, but each rule whose cost comes from the response holds
// between the request's least (its prompt and the rule's MinOutput, or the DefaultHold of an
// unsized request) and its most (the prompt and the client's output cap, or all the limit can
// give). A request refused by any rule takes no hold and counts in no rule: those already taken
// go back at once. The outcomes are in the plan's order. The returned Holds (nil when no rule
// holds or the request is refused) must be settled when the response ends.
func (e *Engine) Reserve(ctx context.Context, plan *Plan, need Need) (Decision, *Holds, error) {
	if len(plan.calls) == 0 {
		return Decision{Allowed: true}, nil, nil
	}
	var b batch
	for _, c := range plan.calls {
		switch {
		case c.rule.CandidateOf != nil:
			b.plain = append(b.plain, c) // beside its rule, which has no Cost
		case c.rule.Cost != nil:
			b.reserve = append(b.reserve, c)
			b.held = append(b.held, true)
		default:
			b.plain = append(b.plain, c)
			b.held = append(b.held, false)
		}
	}
	return e.reserve(ctx, &b, need)
}

// batch is the calls of one reserve: plain ones (a cost known before, candidates included) and
// holds, with the order of their rules.
type batch struct {
	plain, reserve []call
	held           []bool // per rule in order: does it hold (else it is the next plain rule)
}

// reserve decides the plain calls as one batch and holds for each of reserve, all at once, so
// that an admitted request waits for one round trip. A request refused by any rule keeps no
// hold: what was held goes back at once.
func (e *Engine) reserve(ctx context.Context, b *batch, need Need) (Decision, *Holds, error) {
	if len(b.reserve) == 0 {
		return e.decided(ctx, e.run(ctx, b.plain)), nil, nil
	}
	outs := make([]Outcome, len(b.reserve))
	taken := make([]*limiter.Hold, len(b.reserve))
	var d Decision
	var wg sync.WaitGroup
	wg.Go(func() { d = e.run(ctx, b.plain) })
	for i, c := range b.reserve {
		wg.Go(func() {
			lim := limitOf(c.rule)
			lo, hi := bounds(c.rule, need)
			c.cost = lo
			res, h, err := e.Limiter.Reserve(ctx, c.key, lim, lo, hi, c.rule.Cost.Timeout)
			outs[i], taken[i] = e.outcome(c, lim, res, err), h
		})
	}
	wg.Wait()
	hs := &Holds{r: e.Limiter, holds: make([]held, 0, len(b.reserve)), observe: e.ObserveSettle}
	for i := range outs {
		if taken[i] != nil {
			hs.holds = append(hs.holds, held{rule: b.reserve[i].rule, key: b.reserve[i].key, hold: taken[i]})
		}
	}
	d = merge(d, b.held, outs)
	if !d.Allowed {
		_, _ = hs.Settle(ctx, 0, true, false)
		d.GiveBack(ctx)
		return d, nil, nil
	}
	return d, hs, nil
}

// Deadline is the soonest deadline of the holds: a registry forgets them then.
func (h *Holds) Deadline() time.Time {
	var t time.Time
	for _, x := range h.holds {
		if t.IsZero() || x.hold.Deadline.Before(t) {
			t = x.hold.Deadline
		}
	}
	return t
}

// merge puts the outcomes of held rules among d's in the rules' order, and finds the
// refusal again.
func merge(d Decision, held []bool, outs []Outcome) Decision {
	all := make([]Outcome, 0, len(d.Outcomes)+len(outs))
	p, r := 0, 0
	for _, h := range held {
		if h {
			all = append(all, outs[r])
			r++
		} else {
			all = append(all, d.Outcomes[p])
			p++
		}
	}
	d.Outcomes = all
	d.verdict()
	return d
}

// Keyed is one rule's hold of a request and the limiter key it holds under.
type Keyed struct {
	Key   string
	Holds *Holds
}

// Split returns one Holds per rule that held, each settled on its own: for a face whose
// settles name one rule at a time (Envoy's stream-done descriptors). h must not be settled
// as well.
func (h *Holds) Split() []Keyed {
	if h == nil {
		return nil
	}
	out := make([]Keyed, len(h.holds))
	for i, x := range h.holds {
		out[i] = Keyed{Key: x.key, Holds: &Holds{r: h.r, holds: []held{x}, observe: h.observe}}
	}
	return out
}

// HitKey is the limiter key of a hit's rule (per window or in flight) and key parts; ok is
// false when the set has no such rule. It is the key Holds.Split names a hold of the hit by,
// and Slots.Split a slot.
func HitKey(set *ruleset.Set, h Hit) (key string, r *ruleset.Rule, ok bool) {
	if r = set.FindInFlight(h.Policy, h.Rule); r == nil {
		if r = set.Find(h.Policy, h.Rule); r == nil {
			return "", nil, false
		}
	}
	return keyscheme.Key(set.Namespace, r.Policy.Name, r.StateName, h.Key...), r, true
}

// Charge counts units used on the key of hit, whose hold (if it had one) is not at hand: a
// settle that reached another sidecar than its reserve, or came after its hold was forgotten.
// The hold, if any, stays spent past its deadline: both count until its window ends.
func (e *Engine) Charge(ctx context.Context, set *ruleset.Set, hit Hit, units int64) (limiter.Settled, error) {
	key, r, ok := HitKey(set, hit)
	if !ok || r.InFlight != nil {
		return limiter.Settled{}, fmt.Errorf("%w: %s/%s is not enforced by this sidecar", ErrUnknownRule, hit.Policy, hit.Rule)
	}
	s, err := e.Limiter.Charge(ctx, key, limitOf(r), units)
	if e.ObserveSettle != nil {
		e.ObserveSettle(r, s, err)
	}
	return s, err
}
