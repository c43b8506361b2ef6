package ruleset

import (
	"time"

	"github.com/redline-dev/redline/internal/fleet"
)

// Summaries takes what every tracked rule (and candidate) of set counted since the last call,
// and encodes one summary per policy, in the order of set.Policies, for the heartbeat to
// publish (fleet.BeatWithSummaries): nil for a policy that has nothing to say. interval is the
// time since the last call. Taking empties the trackers: a summary says what one interval
// counted, and one lost with its heartbeat is not sent again. What an in-flight rule holds
// now and a long window's heaviest users are states, not counts: they are said again in every
// summary while they last.
func (set *Set) Summaries(interval time.Duration) [][]byte {
	out := make([][]byte, len(set.Policies))
	now := time.Now()
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
			if r.LongWindow {
				// A calendar period's users stay until it ends; a rolling window's count says
				// nothing once a window passed without a decision of the key.
				var since int64
				if r.Limit.Calendar == nil {
					since = now.Add(-r.Limit.Window).UnixMilli()
				}
				rs.Quota = fleet.QuotaFrom(r.Top.Quota.Take(fleet.SummaryEntries, since, now.UnixMilli()))
			}
			ps.Rules = append(ps.Rules, rs)
		}
		for _, r := range p.InFlight {
			if r.Top == nil {
				continue
			}
			iv := r.Top.Take()
			ps.Rules = append(ps.Rules, fleet.RuleSummary{
				Rule: r.Name, Decisions: iv.Decisions, Refused: fleet.ListFromSnapshot(iv.Refused),
				InFlight: fleet.InFlightFrom(r.Top.Slots.Take(fleet.SummaryEntries)),
			})
		}
		out[i] = fleet.EncodeSummary(ps)
	}
	return out
}
