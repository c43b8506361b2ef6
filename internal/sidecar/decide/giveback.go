package decide

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/redline-dev/redline/internal/limiter"
	"github.com/redline-dev/redline/internal/sidecar/ruleset"
)

// giveBackTimeout bounds one give-back: it runs once the request is refused, whatever its
// client does meanwhile.
const giveBackTimeout = 2 * time.Second

// GiveBack undoes what the decision counted, for a request that is refused: the engine calls
// it for a request one of its rules refused, and a face calls it for a request it refuses
// after the rules admitted it (a token budget's hold refused, no memory to read its body, no
// room to keep its holds). The rules a request matches are decided as one: it counts in all
// of them or in none. A rule that counts refusals (CountRefused) keeps its count; a candidate
// keeps its count when only the rule it stands beside refused (enforced in that rule's place,
// it would have admitted the request), and gives it back otherwise.
//
// It waits for the give-back (one round trip where some count is in Redis; none where every
// count came from a lease), never longer than a few seconds, and never fails: what cannot go
// back stays counted, which only under-admits. Candidates still under way give theirs back
// when they are decided. Call it at most once, on one copy of the decision; later calls do
// nothing.
func (d *Decision) GiveBack(ctx context.Context) {
	if d.engine == nil || d.gaveBack {
		return
	}
	d.gaveBack = true
	why := &refusal{external: d.Allowed}
	for i := range d.Outcomes {
		if d.Outcomes[i].Refuses() {
			why.by = append(why.by, d.Outcomes[i].Rule)
		}
	}
	var refunds []limiter.Refund
	for i := range d.Outcomes {
		refunds = appendRefund(refunds, &d.Outcomes[i], why)
	}
	if p := d.pending; p != nil {
		refunds = p.refused(why, refunds)
	} else {
		for i := range d.Candidates {
			refunds = appendRefund(refunds, &d.Candidates[i], why)
		}
	}
	d.engine.giveBack(ctx, refunds)
}

// refusal is why a request was refused: by rules (by), or after them (external).
type refusal struct {
	external bool
	by       []*ruleset.Rule
}

// keeps says whether o keeps what it counted of the refused request.
func (why *refusal) keeps(o *Outcome) bool {
	r := o.Rule
	if r.CountRefused {
		return true
	}
	if base := r.CandidateOf; base != nil {
		// The candidate stands in its rule's place: the request is refused in that world only
		// when something else refused it too.
		return !why.external && !slices.ContainsFunc(why.by, func(x *ruleset.Rule) bool { return x != base })
	}
	return false
}

// appendRefund adds o's count to refunds unless o keeps it.
func appendRefund(refunds []limiter.Refund, o *Outcome, why *refusal) []limiter.Refund {
	if o.Result.Counted() == 0 || why.keeps(o) {
		return refunds
	}
	return append(refunds, limiter.Refund{Key: o.key, Limit: o.limit(), Result: o.Result})
}

// giveBack gives refunds back, bounded by giveBackTimeout.
func (e *Engine) giveBack(ctx context.Context, refunds []limiter.Refund) {
	if len(refunds) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), giveBackTimeout)
	defer cancel()
	// What went back, and why some could not, is in the limiter's counters (metrics).
	_, _ = e.Limiter.GiveBack(ctx, refunds)
}

// pendingCandidates are candidates' decisions still under way when the verdict was reached.
// A candidate decided after its request was refused gives its count back as it arrives.
type pendingCandidates struct {
	wg      sync.WaitGroup
	mu      sync.Mutex
	outs    []Outcome
	arrived []bool
	why     *refusal // set once the request is refused
}

// add makes room for one more candidate and returns its slot.
func (p *pendingCandidates) add() int {
	p.outs = append(p.outs, Outcome{})
	p.arrived = append(p.arrived, false)
	return len(p.outs) - 1
}

// arrive records the candidate of slot i, and gives its count back when its request was
// refused already.
func (p *pendingCandidates) arrive(e *Engine, i int, o Outcome) {
	defer p.wg.Done()
	p.mu.Lock()
	p.outs[i], p.arrived[i] = o, true
	why := p.why
	p.mu.Unlock()
	if why != nil {
		e.giveBack(context.Background(), appendRefund(nil, &o, why))
	}
}

// refused records why the request was refused, and adds to refunds the counts of the
// candidates already decided; those still under way give theirs back as they arrive.
func (p *pendingCandidates) refused(why *refusal, refunds []limiter.Refund) []limiter.Refund {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.why = why
	for i := range p.outs {
		if p.arrived[i] {
			refunds = appendRefund(refunds, &p.outs[i], why)
		}
	}
	return refunds
}
