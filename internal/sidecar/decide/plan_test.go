package decide_test

import (
	"net/http"
	"testing"

	. "github.com/onsi/gomega"

	"github.com/redline-dev/redline/internal/policydoc"
	"github.com/redline-dev/redline/internal/sidecar/decide"
	"github.com/redline-dev/redline/internal/sidecar/ruleset"
)

// costDoc is a namespace with a token budget on /v1 for POST and a request-counting rule on
// everything, through Parse as the sidecar reads it.
func costDoc(t testing.TB) *policydoc.Document {
	t.Helper()
	budget := policydoc.Rule{
		Name: "tokens", Key: []policydoc.KeyPart{{Header: "x-api-key"}}, Algorithm: "SlidingWindowCounter",
		Requests: 10_000, WindowMS: 60_000, Mode: "Enforce",
		Match: &policydoc.Match{PathPrefix: "/v1", Methods: []string{"POST"}},
		Cost: &policydoc.Cost{
			From: policydoc.CostFromResponse, Usage: policydoc.UsageAuto, Header: "x-usage-tokens",
			DefaultHold: 500, MinOutput: 16, OnError: policydoc.OnErrorZero, TimeoutMS: 90_000,
		},
	}
	plain := policydoc.Rule{Name: "requests", Key: []policydoc.KeyPart{{Constant: "all"}}, Algorithm: "FixedWindow", Requests: 100, WindowMS: 1000, Mode: "Enforce"}
	_, data, err := policydoc.Build("shop", []policydoc.Policy{{
		Name: "p", Generation: 1, FailureMode: "Open", Rules: []policydoc.Rule{plain, budget},
	}}, map[string]string{})
	if err != nil {
		t.Fatal(err)
	}
	doc, err := policydoc.Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	return doc
}

// costed says whether the plan of a request to set holds (some matching rule takes its cost
// from the response).
func costed(g Gomega, set *ruleset.Set, method, path string, header http.Header) bool {
	p, err := (&decide.Engine{}).Plan(set, &decide.Request{Method: method, Path: path, Header: header}, 1)
	g.Expect(err).NotTo(HaveOccurred())
	return p.Costed() != nil
}

// Only a matching rule with a cost makes a request one to hold.
func TestPlanCosted(t *testing.T) {
	g := NewWithT(t)
	set, err := ruleset.NewBuilder("").Build(costDoc(t), nil)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(costed(g, set, "POST", "/v1/chat/completions", http.Header{})).To(BeTrue())
	g.Expect(costed(g, set, "GET", "/v1/chat/completions", http.Header{})).To(BeFalse(), "the budget matches POST only")
	g.Expect(costed(g, set, "POST", "/v2/chat/completions", http.Header{})).To(BeFalse(), "the budget matches /v1 only")

	plain := costDoc(t)
	plain.Policies[0].Rules = plain.Policies[0].Rules[:1]
	set, err = ruleset.NewBuilder("").Build(plain, nil)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(costed(g, set, "POST", "/v1/chat/completions", http.Header{})).To(BeFalse())

	other := costDoc(t)
	other.Policies[0].Selector = policydoc.Selector{MatchLabels: map[string]string{"app": "checkout"}}
	set, err = ruleset.NewBuilder("").Build(other, map[string]string{"app": "search"})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(costed(g, set, "POST", "/v1/chat/completions", http.Header{})).To(BeFalse(), "a budget of a policy that does not select the pod")

	headed := costDoc(t)
	headed.Policies[0].Rules[1].Match.Headers = []policydoc.HeaderMatch{{Name: "x-tier", Value: new("free")}}
	set, err = ruleset.NewBuilder("").Build(headed, nil)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(costed(g, set, "POST", "/v1/chat/completions", http.Header{"X-Tier": {"free"}})).To(BeTrue())
	g.Expect(costed(g, set, "POST", "/v1/chat/completions", http.Header{"X-Tier": {"paid"}})).To(BeFalse())
	g.Expect(costed(g, set, "POST", "/v1/chat/completions", http.Header{})).To(BeFalse())
}

// The plan names, per matching rule, what it needs: Split parts the rules of a known cost from
// the token budget's, in rule order; RefusesUnsized and MostHolds read the budget's.
func TestPlanSplitsWhatEachRuleNeeds(t *testing.T) {
	g := NewWithT(t)
	doc := costDoc(t)
	doc.Policies[0].Rules[1].Cost.UnsizedBody = policydoc.UnsizedRefuse
	set, err := ruleset.NewBuilder("").Build(doc, nil)
	g.Expect(err).NotTo(HaveOccurred())
	p, err := (&decide.Engine{}).Plan(set, &decide.Request{Method: "POST", Path: "/v1/chat/completions", Header: http.Header{"X-Api-Key": {"k"}}}, 1)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(p.Costed().Name).To(Equal("tokens"))
	g.Expect(p.RefusesUnsized().Name).To(Equal("tokens"))
	g.Expect(p.MostHolds()).To(Equal(1))
	plain, held := p.Split()
	g.Expect(plain.Costed()).To(BeNil())
	g.Expect(plain.MostHolds()).To(Equal(0))
	g.Expect(held.Costed().Name).To(Equal("tokens"))
	g.Expect(held.MostHolds()).To(Equal(1))

	_, err = (&decide.Engine{}).PlanHits(set, []decide.Hit{{Policy: "p", Rule: "nope"}}, 1)
	g.Expect(err).To(MatchError(decide.ErrUnknownRule))
}

// BenchmarkPlan: what matching a request once costs, for a set without token budgets (every
// request of today) and for one whose budget matches.
func BenchmarkPlan(b *testing.B) {
	h := http.Header{"X-Api-Key": {"k"}}
	none := costDoc(b)
	none.Policies[0].Rules = none.Policies[0].Rules[:1]
	e := &decide.Engine{}
	for name, doc := range map[string]*policydoc.Document{"none": none, "matching": costDoc(b)} {
		set, err := ruleset.NewBuilder("").Build(doc, nil)
		if err != nil {
			b.Fatal(err)
		}
		req := &decide.Request{Method: "POST", Path: "/v1/chat/completions", Header: h}
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				_, _ = e.Plan(set, req, 1)
			}
		})
	}
}
