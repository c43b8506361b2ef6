package decide

import (
	"errors"
	"fmt"

	"github.com/redline-dev/redline/internal/keyscheme"
	"github.com/redline-dev/redline/internal/sidecar/ruleset"
)

// Plan is one request matched against a rule set, once: per rule it matches (or hit names),
// in order, the key the rule counts it under and what the rule needs of it: a cost known
// before (plain), units held until its response says what it cost (the rule's Cost), or an
// in-flight slot. Decide, DryRun, Reserve and AcquireSlots consume it, and the faces read it
// (Costed, RefusesUnsized) instead of matching the request again. A Plan is immutable.
type Plan struct {
	// calls are the rules per window, each followed by its candidate's call.
	calls []call
	// slots are the in-flight rules.
	slots []call
	// hits says the plan was made of rule hits, not of a request.
	hits bool
}

// call is one rule's part of a plan: the key it counts under (from parts) and its cost.
type call struct {
	rule  *ruleset.Rule
	key   string
	parts []string
	cost  int64
}

// Plan matches req against every rule of set, the rules per window each at cost units. A
// request that carries more than one field of a header that a rule it matches keys on is a
// *RepeatedHeaderError, and has no plan. A nil set (no policies loaded) plans nothing, which
// admits.
//
// Such a request has no one key. Applications disagree on which field they read: Go's
// Header.Get and a servlet's getHeader read the first, others the last or all of them joined.
// Counting it under any one choice lets a client spend another key's count, or escape its own
// by varying the field the application does not read (a fresh key per request), so the faces
// refuse it before deciding: that is right whichever field the application reads.
func (e *Engine) Plan(set *ruleset.Set, req *Request, cost int64) (Plan, error) {
	var p Plan
	if set == nil {
		return p, nil
	}
	a := attrs{req: req, hops: e.TrustedHops}
	for _, r := range set.Rules {
		if matches(r.Match, req) {
			if err := repeatedKeyHeader(r, req); err != nil {
				return Plan{}, err
			}
			p.calls = appendCalls(p.calls, set.Namespace, r, a.parts(r.Key), cost)
		}
	}
	for _, r := range set.InFlight {
		if matches(r.Match, req) {
			if err := repeatedKeyHeader(r, req); err != nil {
				return Plan{}, err
			}
			p.slots = append(p.slots, newCall(set.Namespace, r, a.parts(r.Key), 0))
		}
	}
	return p, nil
}

// PlanHits plans the rules hits name with their key parts, in the order given: a hit of a rule
// per window at cost units (or its own Cost), a hit of an in-flight rule a slot. A hit naming no
// rule of the set is an ErrUnknownRule.
func (e *Engine) PlanHits(set *ruleset.Set, hits []Hit, cost int64) (Plan, error) {
	if set == nil {
		return Plan{}, errors.New("deciding hits: no policies loaded")
	}
	p := Plan{hits: true, calls: make([]call, 0, len(hits))}
	for _, h := range hits {
		if r := set.FindInFlight(h.Policy, h.Rule); r != nil {
			p.slots = append(p.slots, newCall(set.Namespace, r, h.Key, 0))
			continue
		}
		r := set.Find(h.Policy, h.Rule)
		if r == nil {
			return Plan{}, fmt.Errorf("%w: %s/%s is not enforced by this sidecar", ErrUnknownRule, h.Policy, h.Rule)
		}
		c := cost
		if h.Cost > 0 {
			c = h.Cost
		}
		p.calls = appendCalls(p.calls, set.Namespace, r, h.Key, c)
	}
	return p, nil
}

// newCall is rule r's call for key parts at cost.
func newCall(namespace string, r *ruleset.Rule, parts []string, cost int64) call {
	return call{rule: r, key: keyscheme.Key(namespace, r.Policy.Name, r.StateName, parts...), parts: parts, cost: cost}
}

// appendCalls adds the call of rule r for key parts, and its candidate's under the candidate's
// own state name, with the same parts and cost.
func appendCalls(calls []call, namespace string, r *ruleset.Rule, parts []string, cost int64) []call {
	calls = append(calls, newCall(namespace, r, parts, cost))
	if c := r.Candidate; c != nil {
		calls = append(calls, newCall(namespace, c, parts, cost))
	}
	return calls
}

// repeatedKeyHeader is a *RepeatedHeaderError when req carries more than one field of a header
// that rule r keys on; nil otherwise, whatever other headers repeat.
func repeatedKeyHeader(r *ruleset.Rule, req *Request) error {
	for _, k := range r.Key {
		if k.Header != "" && len(req.Header[k.Header]) > 1 {
			return &RepeatedHeaderError{Header: k.Header}
		}
	}
	return nil
}

// InFlight says whether the plan has in-flight rules (AcquireSlots and WaitSlots then take
// slots); a face whose request has none may skip them and hold nil Slots.
func (p *Plan) InFlight() bool { return len(p.slots) > 0 }

// Costed is the first rule of the plan whose cost comes from the response (nil: none): such a
// request is read, held for and settled (Reserve) rather than decided at one unit, and this
// rule's Cost names the API whose bodies are read and the cost header. Rules with costs of
// different APIs on the same requests are read as the first one says.
func (p *Plan) Costed() *ruleset.Rule {
	for _, c := range p.calls {
		if c.rule.Cost != nil {
			return c.rule
		}
	}
	return nil
}

// RefusesUnsized is the first Enforce rule of the plan whose cost comes from the response and
// that refuses a request it cannot size (nil: none; an unsized request then holds each rule's
// DefaultHold).
func (p *Plan) RefusesUnsized() *ruleset.Rule {
	for _, c := range p.calls {
		if r := c.rule; r.Cost != nil && r.Cost.RefuseUnsized && !r.Shadow {
			return r
		}
	}
	return nil
}

// MostHolds is how many holds Reserve can take of the plan: one per rule whose cost comes from
// the response.
func (p *Plan) MostHolds() int {
	n := 0
	for _, c := range p.calls {
		if c.rule.Cost != nil {
			n++
		}
	}
	return n
}

// Split is the plan's rules per window of a known cost (plain, candidates included) and those
// whose cost comes from the response (costed), each a plan of its own without slots: the proxy
// decides the first before it reads a body, and holds for the second once it has.
func (p *Plan) Split() (plain, costed Plan) {
	plain.hits, costed.hits = p.hits, p.hits
	for _, c := range p.calls {
		if c.rule.Cost != nil {
			costed.calls = append(costed.calls, c)
		} else {
			plain.calls = append(plain.calls, c)
		}
	}
	return plain, costed
}
