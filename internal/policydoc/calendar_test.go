package policydoc

import (
	"testing"

	. "github.com/onsi/gomega"
)

// TestPreviousSidecarRefusesCalendars: a rule without a calendar keeps the previous document
// shape; one with a calendar carries it, round-trips, and the previous sidecar refuses the
// document as a whole rather than count a day of a time zone as a window of 26 hours aligned on
// the epoch. A zone this build does not know is refused too.
func TestPreviousSidecarRefusesCalendars(t *testing.T) {
	g := NewWithT(t)
	_, data, err := Build("shop", []Policy{samplePolicy()}, map[string]string{})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(string(data)).NotTo(ContainSubstring("calendar"))
	g.Expect(parsePrevCalendar(data)).To(Succeed())

	p := samplePolicy()
	p.Rules[0].Calendar = &Calendar{Unit: "Month", Zone: "Europe/Berlin", BillingDay: 31}
	p.Rules[0].WindowMS = (31*24 + 2) * 3600 * 1000
	_, data, err = Build("shop", []Policy{p}, map[string]string{})
	g.Expect(err).NotTo(HaveOccurred())
	doc, err := Parse(data)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(doc.Policies[0].Rules[0].Calendar).To(Equal(p.Rules[0].Calendar))
	g.Expect(parsePrevCalendar(data)).To(MatchError(ContainSubstring(`unknown field "calendar"`)))

	for name, mutate := range map[string]func(r *Rule){
		"an unknown zone":      func(r *Rule) { r.Calendar.Zone = "Mars/Olympus_Mons" },
		"the machine's zone":   func(r *Rule) { r.Calendar.Zone = "Local" },
		"a sliding window":     func(r *Rule) { r.Algorithm = "SlidingWindowCounter" },
		"a window not its own": func(r *Rule) { r.WindowMS = 30 * 24 * 3600 * 1000 },
		"a year":               func(r *Rule) { r.Calendar.Unit = "Year" },
	} {
		bad := samplePolicy()
		bad.Rules[0].Calendar = &Calendar{Unit: "Month", Zone: "Europe/Berlin"}
		bad.Rules[0].WindowMS = (31*24 + 2) * 3600 * 1000
		mutate(&bad.Rules[0])
		_, data, err := Build("shop", []Policy{bad}, map[string]string{})
		g.Expect(err).NotTo(HaveOccurred())
		_, err = Parse(data)
		g.Expect(err).To(MatchError(ContainSubstring("calendar")), name)
	}
}

// The release before calendar windows: its Rule had every field but calendar.
type (
	prevCalendarRule struct {
		Name         string     `json:"name"`
		Match        *Match     `json:"match,omitempty"`
		Key          []KeyPart  `json:"key"`
		Algorithm    string     `json:"algorithm"`
		Requests     int64      `json:"requests"`
		WindowMS     int64      `json:"windowMs"`
		Burst        int64      `json:"burst,omitempty"`
		Mode         string     `json:"mode"`
		Candidate    *Candidate `json:"candidate,omitempty"`
		ReportValues bool       `json:"reportValues,omitempty"`
		Cost         *Cost      `json:"cost,omitempty"`
		CountRefused bool       `json:"countRefused,omitempty"`
		InFlight     int64      `json:"inFlight,omitempty"`
	}
	prevCalendarPolicy struct {
		Policy
		Rules []prevCalendarRule `json:"rules"`
	}
	prevCalendarDocument struct {
		Document
		Policies []prevCalendarPolicy `json:"policies"`
	}
)

func parsePrevCalendar(data []byte) error { return decodeAs[prevCalendarDocument](data) }

// TestCalendarTokenBudgetsAndCandidates: a token budget on a calendar window is a valid rule,
// and a candidate counts a calendar of its own (a FixedWindow over its longest period), which a
// sidecar of the release before refuses as an unknown field.
func TestCalendarTokenBudgetsAndCandidates(t *testing.T) {
	g := NewWithT(t)
	month := (31*24 + 2) * 3600 * 1000
	p := samplePolicy()
	p.Rules[0].Calendar = &Calendar{Unit: "Month", Zone: "Europe/Berlin"}
	p.Rules[0].WindowMS = int64(month)
	p.Rules[0].Cost = &Cost{From: CostFromResponse, Usage: UsageAuto, Header: "redline-cost", DefaultHold: 5, MinOutput: 1, OnError: OnErrorUsed, TimeoutMS: 60000}
	_, data, err := Build("shop", []Policy{p}, map[string]string{})
	g.Expect(err).NotTo(HaveOccurred())
	_, err = Parse(data)
	g.Expect(err).NotTo(HaveOccurred())

	p = samplePolicy()
	p.Rules[0].Candidate = &Candidate{Algorithm: "FixedWindow", Requests: 5, WindowMS: int64(month), Calendar: &Calendar{Unit: "Month", Zone: "Europe/Berlin"}}
	_, data, err = Build("shop", []Policy{p}, map[string]string{})
	g.Expect(err).NotTo(HaveOccurred())
	doc, err := Parse(data)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(doc.Policies[0].Rules[0].Candidate).To(Equal(p.Rules[0].Candidate))
	g.Expect(decodeAs[prevCandidateDocument](data)).To(MatchError(ContainSubstring(`unknown field "calendar"`)))

	for name, mutate := range map[string]func(c *Candidate){
		"a sliding window":     func(c *Candidate) { c.Algorithm = "SlidingWindowCounter" },
		"a window not its own": func(c *Candidate) { c.WindowMS = 30 * 24 * 3600 * 1000 },
		"an unknown zone":      func(c *Candidate) { c.Calendar.Zone = "Mars/Olympus_Mons" },
	} {
		bad := samplePolicy()
		bad.Rules[0].Candidate = &Candidate{Algorithm: "FixedWindow", Requests: 5, WindowMS: int64(month), Calendar: &Calendar{Unit: "Month", Zone: "Europe/Berlin"}}
		mutate(bad.Rules[0].Candidate)
		_, data, err := Build("shop", []Policy{bad}, map[string]string{})
		g.Expect(err).NotTo(HaveOccurred())
		_, err = Parse(data)
		g.Expect(err).To(MatchError(ContainSubstring("candidate calendar")), "%s", name)
	}
}

// The release before calendar candidates: its Candidate had every field but calendar.
type (
	prevCandidate struct {
		Algorithm string `json:"algorithm"`
		Requests  int64  `json:"requests"`
		WindowMS  int64  `json:"windowMs"`
		Burst     int64  `json:"burst,omitempty"`
	}
	prevCandidateRule struct {
		Rule
		Candidate *prevCandidate `json:"candidate,omitempty"`
	}
	prevCandidatePolicy struct {
		Policy
		Rules []prevCandidateRule `json:"rules"`
	}
	prevCandidateDocument struct {
		Document
		Policies []prevCandidatePolicy `json:"policies"`
	}
)
