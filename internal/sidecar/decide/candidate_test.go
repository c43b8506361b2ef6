package decide_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"testing"
	"time"

	"github.com/redline-dev/redline/internal/limiter"
	"github.com/redline-dev/redline/internal/policydoc"
	"github.com/redline-dev/redline/internal/redisconn"
	"github.com/redline-dev/redline/internal/sidecar/decide"
	"github.com/redline-dev/redline/internal/sidecar/ruleset"
	"github.com/redline-dev/redline/internal/testutil/redistest"
)

// candidateSet builds a set of three policies over the same requests (keyed on X-Key):
//   - "live": the limit in force, 60 per minute, with a candidate of 30 per minute;
//   - "same": the same limit without a candidate, in its own state, to show the candidate
//     changes nothing of the live rule's decisions;
//   - "half": 30 per minute enforced, in its own state: what enforcing the candidate would do.
//
// All three run algorithm alg. Each is a set of its own: were they one, every request would
// match the three, and a request "half" refuses would count in none of them (see
// Decision.GiveBack), where the three are to decide the same traffic independently.
func candidateSet(t *testing.T, alg, policy string) *ruleset.Set {
	t.Helper()
	rule := func(name string, requests int64, cand *policydoc.Candidate) policydoc.Rule {
		return policydoc.Rule{Name: name, Key: []policydoc.KeyPart{{Header: "x-key"}}, Algorithm: alg,
			Requests: requests, WindowMS: time.Minute.Milliseconds(), Mode: "Enforce", Candidate: cand, ReportValues: true}
	}
	pol := func(name string, r policydoc.Rule) policydoc.Policy {
		return policydoc.Policy{Name: name, Generation: 1, FailureMode: "Closed", Rules: []policydoc.Rule{r}}
	}
	pols := map[string]policydoc.Policy{
		"live": pol("live", rule("r", 60, &policydoc.Candidate{Algorithm: alg, Requests: 30, WindowMS: time.Minute.Milliseconds()})),
		"same": pol("same", rule("r", 60, nil)),
		"half": pol("half", rule("r", 30, nil)),
	}
	return buildSet(t, "cand", []policydoc.Policy{pols[policy]})
}

// TestCandidateCountsWhatEnforcingItWouldRefuse: on the same live traffic, a candidate at half
// the limit would refuse exactly what an enforced rule at that limit refuses, the rule it is
// counted beside decides exactly as it would without it, and the candidate costs no round trip:
// the rule and its candidate together make one per request.
func TestCandidateCountsWhatEnforcingItWouldRefuse(t *testing.T) {
	srv, err := redistest.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	c, err := redisconn.NewClient(srv.URL(), redisconn.Options{ReadTimeout: 5 * time.Second, WriteTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	for _, alg := range []string{"SlidingWindowCounter", "FixedWindow", "TokenBucket", "SlidingWindowLog"} {
		t.Run(alg, func(t *testing.T) {
			_ = c.FlushAll(context.Background()).Err()
			lim, err := limiter.New(c, limiter.Options{LeaseHorizon: -1})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(lim.Close)
			sets := map[string]*ruleset.Set{}
			for _, p := range []string{"live", "same", "half"} {
				sets[p] = candidateSet(t, alg, p)
			}
			set := sets["live"]
			e := &decide.Engine{Limiter: lim}
			r := rand.New(rand.NewPCG(1, 2))
			var wouldRefuse, halfRefused, liveRefused, sameRefused, decisions int
			var mismatched int
			var trips uint64
			const requests = 600
			for i := range requests {
				// 20 keys, a few heavy: keys 0-2 get most of the traffic.
				key := fmt.Sprint(r.IntN(20))
				if r.IntN(3) > 0 {
					key = fmt.Sprint(r.IntN(3))
				}
				rq := &decide.Request{Method: "GET", Path: "/", Header: http.Header{"X-Key": {key}}, RemoteAddr: "10.0.0.1:1"}
				before := lim.Stats().Pipelines
				d := decideReq(context.Background(), e, set, rq)
				if len(d.Outcomes) != 1 || len(d.WaitCandidates()) != 1 {
					t.Fatalf("request %d: %d outcomes and %d candidates, want 1 and 1", i, len(d.Outcomes), len(d.Candidates))
				}
				trips += lim.Stats().Pipelines - before
				decisions++
				by := map[string]decide.Outcome{"live": d.Outcomes[0]}
				for _, p := range []string{"same", "half"} {
					by[p] = decideReq(context.Background(), e, sets[p], rq).Outcomes[0]
				}
				cand := d.Candidates[0]
				if cand.Rule.CandidateOf != by["live"].Rule || !cand.Result.Allowed {
					t.Fatalf("request %d: the candidate %+v is not live/r's, or refused", i, cand)
				}
				if cand.Result.OverLimit {
					wouldRefuse++
				}
				if by["half"].Result.OverLimit {
					halfRefused++
				}
				if by["live"].Result.OverLimit {
					liveRefused++
				}
				if by["same"].Result.OverLimit {
					sameRefused++
				}
				if cand.Result.OverLimit != by["half"].Result.OverLimit || by["live"].Result.OverLimit != by["same"].Result.OverLimit {
					mismatched++
				}
			}
			t.Logf("%s, %d requests: candidate (30/min) would refuse %d, the same limit enforced refuses %d; live rule (60/min) refuses %d, without a candidate %d; %d Redis round trips (%.2f per request, the pre-check answers the rest)",
				alg, requests, wouldRefuse, halfRefused, liveRefused, sameRefused, trips, float64(trips)/requests)
			if wouldRefuse != halfRefused || liveRefused != sameRefused || mismatched != 0 {
				t.Errorf("%d requests decided differently (candidate %d vs enforced %d; live %d vs same %d)", mismatched, wouldRefuse, halfRefused, liveRefused, sameRefused)
			}
			if wouldRefuse == 0 || liveRefused == 0 {
				t.Errorf("the traffic must take both limits over: would-refuse %d, refused %d", wouldRefuse, liveRefused)
			}
			if trips > requests {
				t.Errorf("%d round trips for %d requests: a request must make at most one", trips, requests)
			}
			// The candidate's tracker names its heaviest would-refused keys, by value where the
			// rule opts in.
			top := set.Find("live", "r").Candidate.Top.Peek()
			if top.Refused.Total != uint64(wouldRefuse) || len(top.Refused.Entries) == 0 {
				t.Fatalf("candidate tracker: %+v, want %d would-refused", top.Refused, wouldRefuse)
			}
			if l := top.Refused.Entries[0].Label; l != "0" && l != "1" && l != "2" {
				t.Errorf("the candidate's top would-refused key is %q, want one of the heavy keys 0, 1, 2", l)
			}
		})
	}
}
