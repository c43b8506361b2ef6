package topkeysstatus

import (
	"cmp"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/redline-dev/redline/api/v1alpha1"
	"github.com/redline-dev/redline/internal/fleet"
	"github.com/redline-dev/redline/internal/topkeys"
)

// topKeysStatus is what one pass merges of a policy's summaries into its status.
type topKeysStatus struct {
	Rules   []v1alpha1.RuleStatus
	Refused string
	// InFlight and Quota are the policy's busiest in-flight key and heaviest quota user
	// (status.inFlight, status.quota).
	InFlight, Quota string
	// Newest is the newest stamp of the summaries merged (ms, Redis's clock): a summary as new
	// or older was added to the candidates' totals already.
	Newest int64
}

// mergeTopKeys merges the replicas' summaries of policy p (g, read by one pass) into the rules'
// status: per rule of the spec, in its order, the interval's decisions and refusals summed,
// the heaviest keys merged (topkeys.Merge) and cut to v1alpha1.MaxTopKeys, the candidate's
// the same, with its totals grown by the summaries newer than merged (a summary stamped after
// it: the same summary read twice is counted once). prev is the status in force: a candidate
// whose limit it lists unchanged keeps its since and totals. Summaries of rules the spec does
// not have, or the rule's candidate when it has none, are ignored; key values are kept only
// where the rule's topKeys is Values, whatever a summary holds. now stamps observedAt.
func mergeTopKeys(p *v1alpha1.RateLimitPolicy, g fleet.GroupSummaries, merged int64, now time.Time) topKeysStatus {
	out := topKeysStatus{Newest: merged}
	prev := make(map[string]*v1alpha1.RuleStatus, len(p.Status.Rules))
	for i := range p.Status.Rules {
		prev[p.Status.Rules[i].Name] = &p.Status.Rules[i]
	}
	for _, s := range g.Summaries {
		out.Newest = max(out.Newest, s.Stamp)
	}
	var decisions, refused uint64
	var busiest, heaviest share
	for _, rule := range p.Spec.Rules {
		st := v1alpha1.RuleStatus{Name: rule.Name, ObservedAt: metav1.NewTime(now)}
		values := rule.TopKeys == v1alpha1.TopKeysValues
		var parts, cparts []topkeys.Snapshot
		var ruleDecisions, ruleRefused, would, newDecisions, newWould uint64
		var interval int64
		var flights []*fleet.InFlightSummary
		var quotas []*fleet.QuotaSummary
		for _, s := range g.Summaries {
			for _, rs := range s.Rules {
				if rs.Rule != rule.Name {
					continue
				}
				st.Replicas++
				interval = max(interval, s.IntervalMS)
				ruleDecisions = addSat(ruleDecisions, rs.Decisions)
				ruleRefused = addSat(ruleRefused, rs.Refused.Total)
				parts = append(parts, rs.Refused.Snapshot())
				if rs.InFlight != nil {
					flights = append(flights, rs.InFlight)
				}
				if rs.Quota != nil {
					quotas = append(quotas, rs.Quota)
				}
				if rs.Candidate != nil {
					would = addSat(would, rs.Candidate.Total)
					cparts = append(cparts, rs.Candidate.Snapshot())
					if s.Stamp > merged {
						newDecisions = addSat(newDecisions, rs.Decisions)
						newWould = addSat(newWould, rs.Candidate.Total)
					}
				}
				break // a rule once per summary: a forged second entry is not counted
			}
		}
		st.Interval = metav1.Duration{Duration: time.Duration(interval) * time.Millisecond}
		st.Decisions, st.Refused = toInt64(ruleDecisions), toInt64(ruleRefused)
		st.TopRefused = topKeys(topkeys.Merge(v1alpha1.MaxTopKeys, parts...), values)
		decisions, refused = addSat(decisions, ruleDecisions), addSat(refused, ruleRefused)
		if c := rule.Candidate; c != nil {
			cs := &v1alpha1.CandidateStatus{Limit: candidateLimit(rule), Since: metav1.NewTime(now)}
			if old := prev[rule.Name]; old != nil && old.Candidate != nil && old.Candidate.Limit == cs.Limit {
				cs.Since = old.Candidate.Since
				cs.WouldRefuseTotal, cs.DecisionsTotal = old.Candidate.WouldRefuseTotal, old.Candidate.DecisionsTotal
			}
			cs.WouldRefuse = toInt64(would)
			cs.WouldRefuseRatio = ratio(would, ruleDecisions)
			cs.WouldRefuseTotal = toInt64(addSat(uint64(max(cs.WouldRefuseTotal, 0)), newWould))
			cs.DecisionsTotal = toInt64(addSat(uint64(max(cs.DecisionsTotal, 0)), newDecisions))
			cs.TopRefused = topKeys(topkeys.Merge(v1alpha1.MaxTopKeys, cparts...), values)
			st.Candidate = cs
		}
		if n := rule.Limit.InFlight; n != nil && len(flights) > 0 {
			st.InFlight = mergeInFlight(*n, flights, values)
			busiest = busiest.most(st.InFlight.TopHolders, *n)
		}
		if longWindow(rule.Limit) && len(quotas) > 0 {
			st.Quota = mergeQuota(rule.Limit, quotas, values, now)
			if st.Quota != nil && len(st.Quota.TopUsers) > 0 {
				heaviest = heaviest.max(share{uint64(st.Quota.TopUsers[0].Used), uint64(rule.Limit.Requests)})
			}
		}
		out.Rules = append(out.Rules, st)
	}
	if len(g.Summaries) > 0 {
		out.Refused = ratio(refused, decisions)
		out.InFlight, out.Quota = busiest.String(), heaviest.String()
	}
	return out
}

// sameTopKeys says whether a merge says what the status says, observedAt aside: a status is
// not written again for the clock alone.
func sameTopKeys(st v1alpha1.RateLimitPolicyStatus, t topKeysStatus) bool {
	strip := func(rs []v1alpha1.RuleStatus) []v1alpha1.RuleStatus {
		out := make([]v1alpha1.RuleStatus, len(rs))
		for i := range rs {
			rs[i].DeepCopyInto(&out[i])
			out[i].ObservedAt = metav1.Time{}
		}
		return out
	}
	return st.Refused == t.Refused && st.InFlight == t.InFlight && st.Quota == t.Quota &&
		equality.Semantic.DeepEqual(strip(st.Rules), strip(t.Rules))
}

// idle says whether a status shows no decision: a policy without summaries stays as it is.
func idle(st v1alpha1.RateLimitPolicyStatus) bool {
	for _, r := range st.Rules {
		if r.Decisions != 0 || r.Refused != 0 || len(r.TopRefused) > 0 || r.InFlight != nil || r.Quota != nil {
			return false
		}
	}
	return st.Refused == "" && st.InFlight == "" && st.Quota == ""
}

func topKeys(s topkeys.Snapshot, values bool) []v1alpha1.TopKey {
	var out []v1alpha1.TopKey
	for _, e := range s.Entries {
		k := v1alpha1.TopKey{Key: e.Key, Count: toInt64(e.Count), Error: toInt64(e.Err)}
		if values {
			k.Value = topkeys.Label(e.Label)
		}
		out = append(out, k)
	}
	return out
}

// candidateLimit names a rule's candidate: "30/1m0s SlidingWindowCounter".
func candidateLimit(r v1alpha1.Rule) string {
	c := r.Candidate
	alg := cmp.Or(c.Algorithm, cmp.Or(r.Algorithm, v1alpha1.SlidingWindowCounter))
	s := fmt.Sprintf("%d/%s %s", c.Limit.Requests, c.Limit.Window.Duration, alg)
	if c.Limit.Burst != nil {
		s += fmt.Sprintf(" burst %d", *c.Limit.Burst)
	}
	return s
}

// ratio is n/of as a percentage with one decimal, "" when of is 0.
func ratio(n, of uint64) string {
	if of == 0 {
		return ""
	}
	return fmt.Sprintf("%.1f%%", 100*float64(min(n, of))/float64(of))
}

func addSat(a, b uint64) uint64 {
	if s := a + b; s >= a {
		return s
	}
	return ^uint64(0)
}

// toInt64 is n for the API's int64, saturated: counts come from what a tenant can write.
func toInt64(n uint64) int64 {
	if n > 1<<63-1 {
		return 1<<63 - 1
	}
	return int64(n)
}
