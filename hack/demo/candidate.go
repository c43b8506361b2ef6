package main

import (
	"context"
	"fmt"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/redline-dev/redline/api/v1alpha1"
)

// candidateSaid reports what the candidate limit would have refused of the sent requests just
// measured: from the sidecars' metric (would_refuse since wouldBefore) and from the policy's
// status, where the manager merges the three replicas' summaries within a heartbeat or two.
func (d *demo) candidateSaid(ctx context.Context, sent int, wouldBefore float64) error {
	rule := d.policy.Spec.Rules[0]
	after, err := sumMetric(ctx, d.sidecars, "redline_sidecar_candidate_decisions_total", map[string]string{"result": "would_refuse"})
	if err != nil {
		return err
	}
	would := after - wouldBefore
	// The requests spanned one or two heartbeat intervals: the status's totals have them all
	// once the manager merged every replica's summary of each (within two intervals or so).
	var st *v1alpha1.CandidateStatus
	deadline := time.Now().Add(20 * time.Second)
	for st == nil || float64(st.WouldRefuseTotal) < would {
		if time.Now().After(deadline) {
			if st != nil && st.WouldRefuseTotal > 0 {
				break // an interval merged late is missing from the totals: say what is there
			}
			return fmt.Errorf("the policy's status.rules shows no candidate's refusals 20s after the requests (status %+v)", st)
		}
		time.Sleep(250 * time.Millisecond)
		var p v1alpha1.RateLimitPolicy
		if err := d.st.Client.Get(ctx, client.ObjectKeyFromObject(d.policy), &p); err != nil {
			return err
		}
		if len(p.Status.Rules) > 0 {
			st = p.Status.Rules[0].Candidate
		}
	}
	top := "none"
	if len(st.TopRefused) > 0 {
		top = fmt.Sprintf("%.12s... (%d)", st.TopRefused[0].Key, st.TopRefused[0].Count)
	}
	d.say("  the candidate (%d per %s) would have refused %.0f of the %d, and refused none: the limit admitted %d",
		rule.Candidate.Limit.Requests, shortDuration(rule.Candidate.Limit.Window.Duration), would, sent, rule.Limit.Requests)
	d.say("  kubectl get rlp %s -o yaml shows it: status.rules[0].candidate.wouldRefuseTotal %d of decisionsTotal %d, top key %s",
		d.policy.Name, st.WouldRefuseTotal, st.DecisionsTotal, top)
	// A candidate admits no more than its limit, as an enforced rule would (leases can only
	// under-admit).
	if int(would) < sent-int(rule.Candidate.Limit.Requests) || int(would) > sent {
		return fmt.Errorf("the candidate would have refused %.0f of %d, want at least %d: a limit of %d on the same requests",
			would, sent, sent-int(rule.Candidate.Limit.Requests), rule.Candidate.Limit.Requests)
	}
	d.candidate = fmt.Sprintf("A candidate limit of %d per %s was counted beside the rule on the same %d requests of the shared-counter row: it would have refused **%.0f** "+
		"(redline_sidecar_candidate_decisions_total{result=\"would_refuse\"}, all replicas) and refused none; the policy's status said wouldRefuseTotal %d of decisionsTotal %d "+
		"(the replicas' summaries merged since the candidate was first counted). Step 5 promotes it: the row after the update is that limit enforced.",
		rule.Candidate.Limit.Requests, shortDuration(rule.Candidate.Limit.Window.Duration), sent, would, st.WouldRefuseTotal, st.DecisionsTotal)
	return nil
}
