package compile

import (
	"testing"
	"time"

	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/redline-dev/redline/api/v1alpha1"
	"github.com/redline-dev/redline/internal/policydoc"
)

func TestCompileDurability(t *testing.T) {
	g := NewWithT(t)
	r := v1alpha1.Rule{Limit: v1alpha1.Limit{Requests: 1, Window: metav1.Duration{Duration: time.Minute}}}
	d, err := compileDurability(r)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(d).To(BeNil())
	r.Durability = &v1alpha1.Durability{Mode: v1alpha1.DurabilityReplica}
	d, err = compileDurability(r)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(d.Mode).To(Equal("Replica"))
	g.Expect(d.TimeoutMS).To(BeEquivalentTo(100), "the default timeout")
	r.Durability.Timeout = &metav1.Duration{Duration: 6 * time.Second}
	_, err = compileDurability(r)
	g.Expect(err).To(MatchError(ContainSubstring("between 1ms and 5s")))
	inFlight := int64(3)
	r.Durability.Timeout, r.Limit = nil, v1alpha1.Limit{InFlight: &inFlight}
	_, err = compileDurability(r)
	g.Expect(err).To(MatchError(ContainSubstring("limit.inFlight cannot go with durability")))
}

// TestCompileCalendarBudgetsAndCandidates: a token budget compiles on a calendar window, and a
// candidate's calendar compiles to a FixedWindow over its longest period, or is refused with
// the field named.
func TestCompileCalendarBudgetsAndCandidates(t *testing.T) {
	g := NewWithT(t)
	berlin := func(u v1alpha1.CalendarUnit) *v1alpha1.CalendarWindow {
		return &v1alpha1.CalendarWindow{Unit: u, TimeZone: "Europe/Berlin"}
	}
	r := v1alpha1.Rule{Name: "tokens", Key: []v1alpha1.KeyPart{{Header: "X-Key"}}, Algorithm: v1alpha1.FixedWindow,
		Limit: v1alpha1.Limit{Requests: 1000, Calendar: berlin(v1alpha1.CalendarDay)},
		Cost:  &v1alpha1.Cost{From: v1alpha1.CostFromResponse}}
	out, err := compileWindowLimit(r)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(out.Calendar).NotTo(BeNil())
	g.Expect(out.Cost).NotTo(BeNil())

	r.Cost = nil
	r.Candidate = &v1alpha1.CandidateLimit{Limit: v1alpha1.Limit{Requests: 20000, Calendar: berlin(v1alpha1.CalendarMonth)}}
	out, err = compileWindowLimit(r)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(out.Candidate.Calendar).To(Equal(&policydoc.Calendar{Unit: "Month", Zone: "Europe/Berlin"}))
	g.Expect(out.Candidate.Algorithm).To(Equal("FixedWindow"))
	g.Expect(out.Candidate.WindowMS).To(BeEquivalentTo((31*24 + 2) * time.Hour.Milliseconds()))

	r.Candidate.Algorithm = v1alpha1.SlidingWindowCounter
	_, err = compileWindowLimit(r)
	g.Expect(err).To(MatchError(ContainSubstring("candidate.limit.calendar needs algorithm FixedWindow")))
	r.Candidate = &v1alpha1.CandidateLimit{Algorithm: v1alpha1.SlidingWindowCounter, Limit: v1alpha1.Limit{Requests: 5, Window: metav1.Duration{Duration: 168 * time.Hour}}}
	out, err = compileWindowLimit(r)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(out.Candidate.WindowMS).To(BeEquivalentTo(168 * time.Hour.Milliseconds()))
}
