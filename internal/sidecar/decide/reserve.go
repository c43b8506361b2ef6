package decide

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/redline-dev/redline/internal/limiter"
	"github.com/redline-dev/redline/internal/sidecar/ruleset"
)

// Reserver holds and settles units of limits whose cost is known only after the response;
// *limiter.Limiter is one.
type Reserver interface {
	Reserve(ctx context.Context, key string, limit limiter.Limit, min, want int64, ttl time.Duration) (limiter.Result, *limiter.Hold, error)
	Settle(ctx context.Context, h *limiter.Hold, used int64) (limiter.Settled, error)
}

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

// ErrNoReserver is returned by Reserve when the engine's limiter cannot hold units.
var ErrNoReserver = errors.New("the limiter cannot hold units (no Reserve)")

// held is one rule's hold of a request.
type held struct {
	rule *ruleset.Rule
	hold *limiter.Hold
}

// Holds are the holds one admitted request took, one per matching rule whose cost comes from
// its response. Settle ends them once; a request that is never settled has its holds go back
// by themselves at their deadline.
type Holds struct {
	r     Reserver
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
// joins the settles that failed (each of their holds goes back by itself at its deadline).
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

// Reserve decides req like Decide, with a cost of one for every matching rule but those whose
// cost comes from the response: each of those holds between the request's least (its prompt
// and the rule's MinOutput, or the DefaultHold of an unsized request) and its most (the prompt
// and the client's output cap, or all the limit can give). A request refused by any rule takes
// no hold: those already taken go back at once. The returned Holds (nil when no rule holds or
// the request is refused) must be settled when the response ends.
func (e *Engine) Reserve(ctx context.Context, set *ruleset.Set, req *Request, need Need) (Decision, *Holds, error) {
	if set == nil || len(set.Rules) == 0 {
		return Decision{Allowed: true}, nil, nil
	}
	a := attrs{req: req, hops: e.TrustedHops}
	var plain, reserve []call
	for _, r := range set.Rules {
		if !Matches(r.Match, req) {
			continue
		}
		if r.Cost != nil {
			reserve = append(reserve, call{rule: r, key: limiter.Key(set.Namespace, r.Policy.Name, r.StateName, a.parts(r.Key)...)})
			continue
		}
		plain = appendCalls(plain, set.Namespace, r, a.parts(r.Key), 1)
	}
	return e.reserve(ctx, plain, reserve, need)
}

// ReserveHits is Reserve for rules named with their key parts (the decision API, Envoy's
// descriptors): a hit of a rule whose cost comes from the response holds, by need; any other
// costs its own Cost, else one.
func (e *Engine) ReserveHits(ctx context.Context, set *ruleset.Set, hits []Hit, need Need) (Decision, *Holds, error) {
	if set == nil {
		return Decision{}, nil, errors.New("deciding hits: no policies loaded")
	}
	var plain, reserve []call
	for _, h := range hits {
		r := set.Find(h.Policy, h.Rule)
		if r == nil {
			return Decision{}, nil, fmt.Errorf("%w: %s/%s is not enforced by this sidecar", ErrUnknownRule, h.Policy, h.Rule)
		}
		if r.Cost != nil {
			reserve = append(reserve, call{rule: r, key: limiter.Key(set.Namespace, r.Policy.Name, r.StateName, h.Key...), parts: h.Key})
			continue
		}
		plain = appendCalls(plain, set.Namespace, r, h.Key, max(h.Cost, 1))
	}
	return e.reserve(ctx, plain, reserve, need)
}

// reserve decides the plain calls as one batch, then, if they admit, holds for each of
// reserve, concurrently.
func (e *Engine) reserve(ctx context.Context, plain, reserve []call, need Need) (Decision, *Holds, error) {
	d := e.run(ctx, plain)
	if !d.Allowed || len(reserve) == 0 {
		return d, nil, nil
	}
	rv, ok := e.Limiter.(Reserver)
	if !ok {
		return Decision{}, nil, ErrNoReserver
	}
	hs := &Holds{r: rv, holds: make([]held, 0, len(reserve)), observe: e.ObserveSettle}
	outs := make([]Outcome, len(reserve))
	taken := make([]*limiter.Hold, len(reserve))
	var wg sync.WaitGroup
	for i, c := range reserve {
		wg.Go(func() {
			lim := limitOf(c.rule)
			lo, hi := bounds(c.rule, need)
			c.cost = lo
			res, h, err := rv.Reserve(ctx, c.key, lim, lo, hi, c.rule.Cost.Timeout)
			outs[i], taken[i] = e.outcome(c, lim, res, err), h
		})
	}
	wg.Wait()
	for i := range outs {
		if taken[i] != nil {
			hs.holds = append(hs.holds, held{rule: reserve[i].rule, hold: taken[i]})
		}
	}
	d = merge(d, outs)
	if !d.Allowed {
		_, _ = hs.Settle(ctx, 0, true, false)
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

// merge adds the outcomes of reserved rules to d and finds the refusal again.
func merge(d Decision, outs []Outcome) Decision {
	d.Outcomes = append(d.Outcomes, outs...)
	for i := range d.Outcomes {
		o := &d.Outcomes[i]
		if !o.Refuses() {
			continue
		}
		d.Allowed = false
		if d.Refused == nil || retryLonger(o.Result.RetryAfter, d.Refused.Result.RetryAfter) {
			d.Refused = o
		}
	}
	return d
}
