package compile

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/redline-dev/redline/api/v1alpha1"
	"github.com/redline-dev/redline/internal/policydoc"
)

func costRule(alg v1alpha1.Algorithm, requests int64, c *v1alpha1.Cost) *v1alpha1.RateLimitPolicy {
	p := testPolicy("p", requests)
	p.Spec.Rules[0].Algorithm, p.Spec.Rules[0].Cost = alg, c
	return p
}

// TestCompileCostResolvesDefaults: what the sidecar gets is resolved, so that sidecars of one
// release cannot disagree about a default; a hold defaults to 1000 or the capacity.
func TestCompileCostResolvesDefaults(t *testing.T) {
	g := NewWithT(t)
	cp, err := Policy(costRule("", 10_000, &v1alpha1.Cost{From: v1alpha1.CostFromResponse}))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(cp.Rules[0].Cost).To(Equal(&policydoc.Cost{
		From: "Response", Usage: "Auto", Header: "redline-cost", DefaultHold: 1000, MinOutput: 1, OnError: "Used", TimeoutMS: 60_000,
		UnsizedBody: "Refuse",
	}))

	cp, err = Policy(costRule("", 300, &v1alpha1.Cost{From: v1alpha1.CostFromResponse}))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(cp.Rules[0].Cost.DefaultHold).To(BeEquivalentTo(300), "a budget under 1000 holds at most itself")

	burst := int64(50)
	p := costRule(v1alpha1.TokenBucket, 300, &v1alpha1.Cost{From: v1alpha1.CostFromResponse})
	p.Spec.Rules[0].Limit.Burst = &burst
	cp, err = Policy(p)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(cp.Rules[0].Cost.DefaultHold).To(BeEquivalentTo(50), "a bucket holds at most its burst")

	hold, minOut := int64(200), int64(0)
	cp, err = Policy(costRule(v1alpha1.FixedWindow, 300, &v1alpha1.Cost{
		From: v1alpha1.CostFromResponse, Usage: v1alpha1.UsageHeader, Header: "X-Usage", DefaultHold: &hold, MinOutput: &minOut,
		OnError: v1alpha1.OnErrorZero, Timeout: &metav1.Duration{Duration: 90 * time.Second},
	}))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(cp.Rules[0].Cost).To(Equal(&policydoc.Cost{
		From: "Response", Usage: "Header", Header: "x-usage", DefaultHold: 200, MinOutput: 0, OnError: "Zero", TimeoutMS: 90_000,
	}))

	cp, err = Policy(costRule("", 300, &v1alpha1.Cost{From: v1alpha1.CostFromResponse, UnsizedBody: v1alpha1.UnsizedHold}))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(cp.Rules[0].Cost.UnsizedBody).To(BeEmpty(), "Hold is the previous release's behaviour, written as it was")
	_, err = Policy(costRule("", 300, &v1alpha1.Cost{From: v1alpha1.CostFromResponse, Usage: v1alpha1.UsageHeader, UnsizedBody: v1alpha1.UnsizedRefuse}))
	g.Expect(err).To(MatchError(ContainSubstring("usage: Header")))
	_, err = Policy(costRule("", 300, &v1alpha1.Cost{From: v1alpha1.CostFromResponse, UnsizedBody: "Maybe"}))
	g.Expect(err).To(MatchError(ContainSubstring(`cost.unsizedBody "Maybe"`)))

	cp, err = Policy(costRule(v1alpha1.SlidingWindowLog, 100, &v1alpha1.Cost{From: v1alpha1.CostFromResponse}))
	g.Expect(err).NotTo(HaveOccurred(), "a SlidingWindowLog holds beside its log")
	g.Expect(cp.Rules[0].Cost.DefaultHold).To(BeEquivalentTo(100))

	for _, c := range []*v1alpha1.Cost{nil, {}, {From: v1alpha1.CostFromRequest, Usage: v1alpha1.UsageGemini}} {
		cp, err = Policy(costRule(v1alpha1.SlidingWindowLog, 100, c))
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(cp.Rules[0].Cost).To(BeNil(), "a cost from the request compiles to what a previous sidecar reads")
	}
}

// TestCompileCostRefuses: objects stored before the schema checked a cost meet the same
// checks in the controller, with the field named.
func TestCompileCostRefuses(t *testing.T) {
	big, zero, neg := int64(10_001), int64(0), int64(-1)
	resp := func(edit func(*v1alpha1.Cost)) *v1alpha1.Cost {
		c := &v1alpha1.Cost{From: v1alpha1.CostFromResponse}
		edit(c)
		return c
	}
	for name, tc := range map[string]struct {
		p    *v1alpha1.RateLimitPolicy
		want string
	}{
		"unknown source":     {costRule("", 100, &v1alpha1.Cost{From: "Body"}), `cost.from "Body"`},
		"unknown usage":      {costRule("", 100, resp(func(c *v1alpha1.Cost) { c.Usage = "Cohere" })), `cost.usage "Cohere"`},
		"unknown onError":    {costRule("", 100, resp(func(c *v1alpha1.Cost) { c.OnError = "Half" })), `cost.onError "Half"`},
		"hold over capacity": {costRule("", 10_000, resp(func(c *v1alpha1.Cost) { c.DefaultHold = &big })), "cost.defaultHold 10001"},
		"zero hold":          {costRule("", 10_000, resp(func(c *v1alpha1.Cost) { c.DefaultHold = &zero })), "cost.defaultHold 0"},
		"min over capacity":  {costRule("", 10_000, resp(func(c *v1alpha1.Cost) { c.MinOutput = &big })), "cost.minOutput 10001"},
		"negative min":       {costRule("", 10_000, resp(func(c *v1alpha1.Cost) { c.MinOutput = &neg })), "cost.minOutput -1"},
		"timeout":            {costRule("", 100, resp(func(c *v1alpha1.Cost) { c.Timeout = &metav1.Duration{Duration: 2 * time.Hour} })), "cost.timeout 2h0m0s"},
		"reserved header":    {costRule("", 100, resp(func(c *v1alpha1.Cost) { c.Header = "Retry-After" })), "cost.header \"Retry-After\""},
		"header not a token": {costRule("", 100, resp(func(c *v1alpha1.Cost) { c.Header = "X Cost" })), "not an HTTP field name"},
	} {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			_, err := Policy(tc.p)
			g.Expect(err).To(MatchError(ContainSubstring("spec.rules[0] (r): ")))
			g.Expect(err).To(MatchError(ContainSubstring(tc.want)))
		})
	}

	g := NewWithT(t)
	p := costRule("", 100, resp(func(*v1alpha1.Cost) {}))
	p.Spec.Rules[0].Candidate = &v1alpha1.CandidateLimit{Limit: v1alpha1.Limit{Requests: 10, Window: metav1.Duration{Duration: time.Minute}}}
	_, err := Policy(p)
	g.Expect(err).To(MatchError(ContainSubstring("cannot have a candidate")))
}

// TestCostBoundsAgree: the API's bounds and reserved header names, the document's and the
// schema's are the same, so that nothing the API server admits is refused by a sidecar and
// nothing a sidecar refuses is admitted.
func TestCostBoundsAgree(t *testing.T) {
	g := NewWithT(t)
	g.Expect(int64(v1alpha1.MaxCostUnits)).To(BeEquivalentTo(policydoc.MaxCostUnits))
	g.Expect(v1alpha1.MaxCostHeaderLength).To(Equal(policydoc.MaxCostHeaderLength))
	g.Expect(v1alpha1.MinCostTimeout.Milliseconds()).To(BeEquivalentTo(policydoc.MinCostTimeoutMS))
	g.Expect(v1alpha1.MaxCostTimeout.Milliseconds()).To(BeEquivalentTo(policydoc.MaxCostTimeoutMS))

	crd, err := os.ReadFile("../../../config/crd/bases/redline.dev_ratelimitpolicies.yaml")
	g.Expect(err).NotTo(HaveOccurred())
	m := regexp.MustCompile(`self\.lowerAscii\(\) in \[([^\]]*)\]`).FindSubmatch(crd)
	g.Expect(m).NotTo(BeNil(), "the CRD has no rule on cost.header's reserved names")
	var schema []string
	for name := range strings.SplitSeq(string(m[1]), ",") {
		schema = append(schema, strings.Trim(strings.TrimSpace(name), "'"))
	}
	slices.Sort(schema)
	ours := slices.Sorted(slices.Values(policydoc.ReservedCostHeaders))
	g.Expect(schema).To(Equal(ours))
}
