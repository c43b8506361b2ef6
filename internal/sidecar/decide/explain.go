package decide

import (
	"slices"

	"github.com/redline-dev/redline/internal/keyscheme"
	"github.com/redline-dev/redline/internal/sidecar/ruleset"
)

// Explanation is what one rule of a set makes of a request, without deciding it: whether the
// rule matches and, if so, the key it counts the request under.
type Explanation struct {
	Rule *ruleset.Rule
	// Matches says whether the rule's match admits the request.
	Matches bool
	// Key is the Redis key prefix the rule counts the request under (keyscheme.Key), and Hash
	// its hash part, which names the key in a policy's top keys. Empty when not Matches.
	Key, Hash string
	// CandidateHash is the hash of the candidate limit's key, when the rule has one.
	CandidateHash string
}

// Explain tells, for every rule of set in order (the rules per window, then the in-flight
// rules), whether it matches req and the key it counts
// req under, exactly as Decide would, spending nothing. It is what a "why was this request
// refused" tool needs: which rules a request meets and the hash each shows its key under.
func (e *Engine) Explain(set *ruleset.Set, req *Request) []Explanation {
	if set == nil {
		return nil
	}
	a := attrs{req: req, hops: e.TrustedHops}
	out := make([]Explanation, 0, len(set.Rules)+len(set.InFlight))
	for _, r := range slices.Concat(set.Rules, set.InFlight) {
		x := Explanation{Rule: r, Matches: matches(r.Match, req)}
		if x.Matches {
			parts := a.parts(r.Key)
			x.Key = keyscheme.Key(set.Namespace, r.Policy.Name, r.StateName, parts...)
			x.Hash = keyscheme.Hash(x.Key)
			if c := r.Candidate; c != nil {
				x.CandidateHash = keyscheme.Hash(keyscheme.Key(set.Namespace, c.Policy.Name, c.StateName, parts...))
			}
		}
		out = append(out, x)
	}
	return out
}
