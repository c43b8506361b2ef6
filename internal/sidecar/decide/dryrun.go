package decide

import (
	"context"
	"errors"
	"fmt"
	"sync"
)

// ErrNoDryRun is wrapped by the error of a dry run the limiter could not answer.
var ErrNoDryRun = errors.New("dry run unavailable")

// DryRun is Decide without counting anything: each rule per window of plan is asked what it
// would answer (Limiter.Peek), under the same key a decision would count, so a dry run reads
// only what the request itself could spend. Nothing is counted, leased, held or given back; no
// metric, decision log line or top key hears of it. The verdict is the decision's: refused
// when some Enforce rule would refuse, by the one with the longest retry-after. A dry run
// takes no slot: a plan of hits that names an in-flight rule has none.
func (e *Engine) DryRun(ctx context.Context, plan *Plan) (Decision, error) {
	if plan.hits && len(plan.slots) > 0 {
		r := plan.slots[0].rule
		return Decision{}, fmt.Errorf("%w: %s/%s is an in-flight rule, which a dry run does not decide", ErrUnknownRule, r.Policy.Name, r.Name)
	}
	if len(plan.calls) == 0 {
		return Decision{Allowed: true}, nil
	}
	return e.peek(ctx, plan.calls)
}

// peek asks every call's limit concurrently (one round trip's wait, not one per rule).
func (e *Engine) peek(ctx context.Context, calls []call) (Decision, error) {
	results := make([]Outcome, len(calls))
	errs := make([]error, len(calls))
	var wg sync.WaitGroup
	for i, c := range calls {
		wg.Go(func() {
			lim := limitOf(c.rule)
			res, err := e.Limiter.Peek(ctx, c.key, lim, c.cost)
			results[i], errs[i] = Outcome{Rule: c.rule, Result: res, key: c.key, replicas: lim.Replicas, peers: lim.Peers}, err
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return Decision{}, fmt.Errorf("%w: %w", ErrNoDryRun, err)
	}
	d := Decision{Allowed: true}
	for _, o := range results {
		if o.Rule.CandidateOf != nil {
			d.Candidates = append(d.Candidates, o)
		} else {
			d.Outcomes = append(d.Outcomes, o)
		}
	}
	d.verdict()
	return d, nil
}
