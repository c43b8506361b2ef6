package decide

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/redline-dev/redline/internal/limiter"
	"github.com/redline-dev/redline/internal/sidecar/ruleset"
)

// Peeker answers what a decision would be without counting it; *limiter.Limiter is one.
type Peeker interface {
	Peek(ctx context.Context, key string, limit limiter.Limit, cost int64) (limiter.Result, error)
}

// ErrNoDryRun is wrapped by the error of a dry run whose limiter cannot answer one.
var ErrNoDryRun = errors.New("dry run unavailable")

// DryRun is Decide without counting anything: each matching rule's limit is asked what it
// would answer (Peeker), under the same key a decision would count, so a dry run reads only
// what the request itself could spend. Nothing is counted, leased, held or given back; no
// metric, decision log line or top key hears of it. The verdict is the decision's: refused
// when some Enforce rule would refuse, by the one with the longest retry-after.
func (e *Engine) DryRun(ctx context.Context, set *ruleset.Set, req *Request, cost int64) (Decision, error) {
	if set == nil || len(set.Rules) == 0 {
		return Decision{Allowed: true}, nil
	}
	a := attrs{req: req, hops: e.TrustedHops}
	var calls []call
	for _, r := range set.Rules {
		if Matches(r.Match, req) {
			calls = appendCalls(calls, set.Namespace, r, a.parts(r.Key), cost)
		}
	}
	return e.peek(ctx, calls)
}

// DryRunHits is DecideHits without counting anything (see DryRun).
func (e *Engine) DryRunHits(ctx context.Context, set *ruleset.Set, hits []Hit, cost int64) (Decision, error) {
	if set == nil {
		return Decision{}, errors.New("dry run of hits: no policies loaded")
	}
	calls := make([]call, 0, len(hits))
	for _, h := range hits {
		r := set.Find(h.Policy, h.Rule)
		if r == nil {
			return Decision{}, fmt.Errorf("%w: %s/%s is not enforced by this sidecar", ErrUnknownRule, h.Policy, h.Rule)
		}
		c := cost
		if h.Cost > 0 {
			c = h.Cost
		}
		calls = appendCalls(calls, set.Namespace, r, h.Key, c)
	}
	return e.peek(ctx, calls)
}

// peek asks every call's limit concurrently (one round trip's wait, not one per rule).
func (e *Engine) peek(ctx context.Context, calls []call) (Decision, error) {
	p, ok := e.Limiter.(Peeker)
	if !ok {
		return Decision{}, fmt.Errorf("%w: the limiter cannot answer one", ErrNoDryRun)
	}
	results := make([]Outcome, len(calls))
	errs := make([]error, len(calls))
	var wg sync.WaitGroup
	for i, c := range calls {
		wg.Go(func() {
			lim := limitOf(c.rule)
			res, err := p.Peek(ctx, c.key, lim, c.cost)
			results[i], errs[i] = Outcome{Rule: c.rule, Result: res, key: c.key, lim: lim}, err
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
