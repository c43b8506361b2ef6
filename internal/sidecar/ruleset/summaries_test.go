package ruleset_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/redline-dev/redline/internal/fleet"
	"github.com/redline-dev/redline/internal/policydoc"
	"github.com/redline-dev/redline/internal/sidecar/ruleset"
)

func topKeysSet(t *testing.T) *ruleset.Set {
	t.Helper()
	rule := func(name string, cand bool) policydoc.Rule {
		r := policydoc.Rule{Name: name, Key: []policydoc.KeyPart{{Header: "x-key"}}, Algorithm: "FixedWindow", Requests: 10, WindowMS: 60000, Mode: "Enforce"}
		if cand {
			r.Candidate = &policydoc.Candidate{Algorithm: "FixedWindow", Requests: 5, WindowMS: 60000}
		}
		return r
	}
	_, data, err := policydoc.Build("ns", []policydoc.Policy{
		{Name: "busy", Generation: 1, FailureMode: "Open", Rules: []policydoc.Rule{rule("a", true), rule("b", false)}},
		{Name: "idle", Generation: 1, FailureMode: "Open", Rules: []policydoc.Rule{rule("c", false)}},
	}, map[string]string{})
	if err != nil {
		t.Fatal(err)
	}
	doc, err := policydoc.Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	set, err := ruleset.NewBuilder("").Build(doc, nil)
	if err != nil {
		t.Fatal(err)
	}
	return set
}

func TestSummariesTakeEachPolicysInterval(t *testing.T) {
	set := topKeysSet(t)
	a := set.Find("busy", "a")
	for i := range 12 {
		a.Top.Observe(fmt.Sprintf("%032x", i%2), "", i >= 10)
		a.Candidate.Top.Observe(fmt.Sprintf("%032x", i%2), "", i >= 5)
	}
	set.Find("busy", "b").Top.Observe(fmt.Sprintf("%032x", 9), "", false)
	out := set.Summaries(5 * time.Second)
	if len(out) != 2 || out[1] != nil {
		t.Fatalf("summaries = %d, the idle policy's %q: want 2, the second nil", len(out), out[1])
	}
	s, err := fleet.DecodeSummary(out[0])
	if err != nil {
		t.Fatal(err)
	}
	if s.IntervalMS != 5000 || len(s.Rules) != 2 {
		t.Fatalf("summary %+v", s)
	}
	r := s.Rules[0]
	if r.Rule != "a" || r.Decisions != 12 || r.Refused.Total != 2 || r.Candidate == nil || r.Candidate.Total != 7 || len(r.Candidate.Top) != 2 {
		t.Fatalf("rule a: %+v (candidate %+v)", r, r.Candidate)
	}
	if b := s.Rules[1]; b.Rule != "b" || b.Decisions != 1 || b.Candidate != nil {
		t.Fatalf("rule b: %+v", b)
	}
	// Taken: the next interval starts empty.
	if out := set.Summaries(time.Second); out[0] != nil {
		t.Fatalf("a second interval with no decision published %s", out[0])
	}
}
