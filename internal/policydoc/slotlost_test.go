package policydoc

import (
	"testing"

	. "github.com/onsi/gomega"
)

// TestPreviousSidecarRefusesOnSlotLost: an in-flight rule that ends its requests when their slot
// is lost (the default) keeps the previous document shape; one that lets them finish carries
// onSlotLost, round-trips, and the previous sidecar refuses the document as a whole rather than
// end what the rule says to let finish. Any other value, or the field on a limit per window, is
// refused.
func TestPreviousSidecarRefusesOnSlotLost(t *testing.T) {
	g := NewWithT(t)
	p := samplePolicy()
	r := p.Rules[0]
	r.Algorithm, r.Requests, r.WindowMS, r.Burst = "", 0, 0, 0
	r.InFlight, r.Queue = 2, &Queue{Size: 4, TimeoutMS: 30_000}
	p.Rules = []Rule{r}
	_, data, err := Build("shop", []Policy{p}, map[string]string{})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(string(data)).NotTo(ContainSubstring("onSlotLost"))
	g.Expect(parsePrevSlotLost(data)).To(Succeed())

	p.Rules[0].OnSlotLost = SlotLostFinish
	_, data, err = Build("shop", []Policy{p}, map[string]string{})
	g.Expect(err).NotTo(HaveOccurred())
	doc, err := Parse(data)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(doc.Policies[0].Rules[0].OnSlotLost).To(Equal(SlotLostFinish))
	g.Expect(parsePrevSlotLost(data)).To(MatchError(ContainSubstring(`unknown field "onSlotLost"`)))

	for name, mutate := range map[string]func(r *Rule){
		"an unknown action":        func(r *Rule) { r.OnSlotLost = "Linger" },
		"the default spelled out":  func(r *Rule) { r.OnSlotLost = "End" },
		"another case":             func(r *Rule) { r.OnSlotLost = "finish" },
		"on a limit per window":    func(r *Rule) { *r = samplePolicy().Rules[0]; r.OnSlotLost = SlotLostFinish },
		"without a limit in force": func(r *Rule) { r.InFlight, r.Queue = 0, nil },
	} {
		bad := p
		bad.Rules = []Rule{p.Rules[0]}
		mutate(&bad.Rules[0])
		_, data, err := Build("shop", []Policy{bad}, map[string]string{})
		g.Expect(err).NotTo(HaveOccurred())
		_, err = Parse(data)
		g.Expect(err).To(MatchError(ContainSubstring("onSlotLost")), name)
	}
}

// The release before onSlotLost: its Rule had every field but onSlotLost.
type (
	prevSlotLostRule struct {
		Name         string      `json:"name"`
		Match        *Match      `json:"match,omitempty"`
		Key          []KeyPart   `json:"key"`
		Algorithm    string      `json:"algorithm"`
		Requests     int64       `json:"requests"`
		WindowMS     int64       `json:"windowMs"`
		Burst        int64       `json:"burst,omitempty"`
		Mode         string      `json:"mode"`
		Candidate    *Candidate  `json:"candidate,omitempty"`
		ReportValues bool        `json:"reportValues,omitempty"`
		Cost         *Cost       `json:"cost,omitempty"`
		CountRefused bool        `json:"countRefused,omitempty"`
		InFlight     int64       `json:"inFlight,omitempty"`
		Queue        *Queue      `json:"queue,omitempty"`
		Calendar     *Calendar   `json:"calendar,omitempty"`
		Durability   *Durability `json:"durability,omitempty"`
	}
	prevSlotLostPolicy struct {
		Policy
		Rules []prevSlotLostRule `json:"rules"`
	}
	prevSlotLostDocument struct {
		Document
		Policies []prevSlotLostPolicy `json:"policies"`
	}
)

func parsePrevSlotLost(data []byte) error { return decodeAs[prevSlotLostDocument](data) }
