package app

import (
	"time"

	"github.com/redline-dev/redline/internal/fleet"
	"github.com/redline-dev/redline/internal/sidecar/ruleset"
)

// summaries takes what every tracked rule (and candidate) of set counted since the last call,
// and encodes one summary per policy, in the order of set.Policies, for the heartbeat to
// publish (fleet.BeatWithSummaries): nil for a policy that decided nothing. interval is the
// time since the last call. Taking empties the trackers: a summary says what one interval
// counted, and one lost with its heartbeat is not sent again.
func summaries(set *ruleset.Set, interval time.Duration) [][]byte {
	out := make([][]byte, len(set.Policies))
	for i, p := range set.Policies {
		ps := fleet.PolicySummary{IntervalMS: interval.Milliseconds()}
		for _, r := range p.Rules {
			if r.Top == nil {
				continue
			}
			iv := r.Top.Take()
			rs := fleet.RuleSummary{Rule: r.Name, Decisions: iv.Decisions, Refused: fleet.ListFromSnapshot(iv.Refused)}
			if c := r.Candidate; c != nil && c.Top != nil {
				l := fleet.ListFromSnapshot(c.Top.Take().Refused)
				rs.Candidate = &l
			}
			ps.Rules = append(ps.Rules, rs)
		}
		out[i] = fleet.EncodeSummary(ps)
	}
	return out
}
