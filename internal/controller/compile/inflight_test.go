package compile

import (
	"testing"
	"time"

	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/redline-dev/redline/api/v1alpha1"
	"github.com/redline-dev/redline/internal/limiter"
	"github.com/redline-dev/redline/internal/policydoc"
)

func inFlightRule(n int64) *v1alpha1.RateLimitPolicy {
	p := testPolicy("p", 1)
	p.Spec.Rules[0].Limit = v1alpha1.Limit{InFlight: &n}
	return p
}

// An in-flight rule compiles to inFlight alone: no algorithm, limit per window, candidate or
// cost, whatever defaults the API server wrote (the algorithm's).
func TestCompileInFlight(t *testing.T) {
	g := NewWithT(t)
	p := inFlightRule(16)
	p.Spec.Rules[0].Algorithm = v1alpha1.SlidingWindowCounter
	cp, err := Policy(p)
	g.Expect(err).NotTo(HaveOccurred())
	r := cp.Rules[0]
	g.Expect(r.InFlight).To(BeEquivalentTo(16))
	g.Expect(r.Algorithm).To(BeEmpty())
	g.Expect(r.Requests).To(BeZero())
	g.Expect(r.WindowMS).To(BeZero())
	g.Expect(r.Mode).To(Equal("Enforce"))
	g.Expect(r.Key).To(HaveLen(len(p.Spec.Rules[0].Key)))
	_, data, err := policydoc.Build("shop", []policydoc.Policy{cp}, map[string]string{})
	g.Expect(err).NotTo(HaveOccurred())
	doc, err := policydoc.Parse(data)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(doc.Policies[0].Rules[0].InFlight).To(BeEquivalentTo(16))
}

// Objects stored before the schema checked an in-flight rule meet the same checks here, with
// the field named.
func TestCompileInFlightRefuses(t *testing.T) {
	requests := int64(10)
	for name, tc := range map[string]struct {
		edit func(*v1alpha1.Rule)
		want string
	}{
		"zero":                  {func(r *v1alpha1.Rule) { *r.Limit.InFlight = 0 }, "limit.inFlight 0"},
		"too many":              {func(r *v1alpha1.Rule) { *r.Limit.InFlight = v1alpha1.MaxInFlight + 1 }, "limit.inFlight 100001"},
		"with requests":         {func(r *v1alpha1.Rule) { r.Limit.Requests = 10 }, "not both"},
		"with window":           {func(r *v1alpha1.Rule) { r.Limit.Window = metav1.Duration{Duration: time.Minute} }, "not both"},
		"with burst":            {func(r *v1alpha1.Rule) { r.Limit.Burst = &requests }, "not both"},
		"with cost":             {func(r *v1alpha1.Rule) { r.Cost = &v1alpha1.Cost{From: v1alpha1.CostFromResponse} }, "cannot go with cost"},
		"with refused":          {func(r *v1alpha1.Rule) { r.Refused = v1alpha1.RefusedCounted }, "cannot go with refused"},
		"an unknown onSlotLost": {func(r *v1alpha1.Rule) { r.Limit.OnSlotLost = "Linger" }, `limit.onSlotLost "Linger" must be End or Finish`},
		"with candidate": {func(r *v1alpha1.Rule) {
			r.Candidate = &v1alpha1.CandidateLimit{Limit: v1alpha1.Limit{Requests: 10, Window: metav1.Duration{Duration: time.Minute}}}
		}, "cannot have a candidate"},
	} {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			p := inFlightRule(4)
			tc.edit(&p.Spec.Rules[0])
			_, err := Policy(p)
			g.Expect(err).To(MatchError(ContainSubstring("spec.rules[0] (r): ")))
			g.Expect(err).To(MatchError(ContainSubstring(tc.want)))
		})
	}

	g := NewWithT(t)
	n := int64(3)
	p := testPolicy("p", 10)
	p.Spec.Rules[0].Candidate = &v1alpha1.CandidateLimit{Limit: v1alpha1.Limit{InFlight: &n}}
	_, err := Policy(p)
	g.Expect(err).To(MatchError(ContainSubstring("candidate.limit.inFlight is not supported")))
}

// The API's, the document's and the limiter's bounds are the same.
func TestInFlightBoundsAgree(t *testing.T) {
	g := NewWithT(t)
	g.Expect(int64(v1alpha1.MaxInFlight)).To(BeEquivalentTo(policydoc.MaxInFlight))
	g.Expect(int64(v1alpha1.MaxInFlight)).To(BeEquivalentTo(limiter.MaxInFlight))
}

// onSlotLost compiles to the document's Finish, or to nothing for the default spelled out or
// left out, so that a document of rules that end their requests keeps its earlier bytes.
func TestCompileOnSlotLost(t *testing.T) {
	g := NewWithT(t)
	for action, want := range map[v1alpha1.SlotLostAction]string{"": "", v1alpha1.SlotLostEnd: "", v1alpha1.SlotLostFinish: policydoc.SlotLostFinish} {
		p := inFlightRule(4)
		p.Spec.Rules[0].Limit.OnSlotLost = action
		cp, err := Policy(p)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(cp.Rules[0].OnSlotLost).To(Equal(want), string(action))
		_, data, err := policydoc.Build("shop", []policydoc.Policy{cp}, map[string]string{})
		g.Expect(err).NotTo(HaveOccurred())
		doc, err := policydoc.Parse(data)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(doc.Policies[0].Rules[0].OnSlotLost).To(Equal(want), string(action))
	}
}
