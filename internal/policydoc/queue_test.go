package policydoc

import (
	"testing"

	. "github.com/onsi/gomega"
)

// TestPreviousSidecarRefusesQueues: an in-flight rule without a queue keeps the previous
// document shape; one with a queue carries it, round-trips, and the previous sidecar refuses the
// document as a whole rather than refuse at once what the rule says should wait. A queue out of
// its bounds, or on a limit per window, is refused.
func TestPreviousSidecarRefusesQueues(t *testing.T) {
	g := NewWithT(t)
	p := samplePolicy()
	r := p.Rules[0]
	r.Algorithm, r.Requests, r.WindowMS, r.Burst, r.Candidate, r.Cost, r.CountRefused = "", 0, 0, 0, nil, nil, false
	r.InFlight = 2
	p.Rules = []Rule{r}
	_, data, err := Build("shop", []Policy{p}, map[string]string{})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(string(data)).NotTo(ContainSubstring("queue"))
	g.Expect(parsePrevQueue(data)).To(Succeed())

	p.Rules[0].Queue = &Queue{Size: 4, TimeoutMS: 30_000}
	_, data, err = Build("shop", []Policy{p}, map[string]string{})
	g.Expect(err).NotTo(HaveOccurred())
	doc, err := Parse(data)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(doc.Policies[0].Rules[0].Queue).To(Equal(&Queue{Size: 4, TimeoutMS: 30_000}))
	g.Expect(parsePrevQueue(data)).To(MatchError(ContainSubstring(`unknown field "queue"`)))

	for name, mutate := range map[string]func(r *Rule){
		"an empty queue":        func(r *Rule) { r.Queue.Size = 0 },
		"too large a queue":     func(r *Rule) { r.Queue.Size = MaxQueueSize + 1 },
		"no timeout":            func(r *Rule) { r.Queue.TimeoutMS = 0 },
		"a negative timeout":    func(r *Rule) { r.Queue.TimeoutMS = -5 },
		"too long a timeout":    func(r *Rule) { r.Queue.TimeoutMS = MaxQueueTimeoutMS + 1 },
		"a queue on a window":   func(r *Rule) { *r = samplePolicy().Rules[0]; r.Queue = &Queue{Size: 1, TimeoutMS: 1} },
		"a queue on a big key":  func(r *Rule) { r.Queue.Size = 1 << 40 },
		"a queue without limit": func(r *Rule) { r.InFlight = 0 },
	} {
		bad := p
		bad.Rules = []Rule{r}
		bad.Rules[0].Queue = &Queue{Size: 4, TimeoutMS: 30_000}
		mutate(&bad.Rules[0])
		_, data, err := Build("shop", []Policy{bad}, map[string]string{})
		g.Expect(err).NotTo(HaveOccurred())
		_, err = Parse(data)
		g.Expect(err).To(MatchError(ContainSubstring("queue")), name)
	}
}

// The release before queues: its Rule had every field but queue.
type (
	prevQueueRule struct {
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
		Calendar     *Calendar   `json:"calendar,omitempty"`
		Durability   *Durability `json:"durability,omitempty"`
	}
	prevQueuePolicy struct {
		Policy
		Rules []prevQueueRule `json:"rules"`
	}
	prevQueueDocument struct {
		Document
		Policies []prevQueuePolicy `json:"policies"`
	}
)

func parsePrevQueue(data []byte) error { return decodeAs[prevQueueDocument](data) }
