package policydoc

import (
	"strings"
	"testing"

	. "github.com/onsi/gomega"
)

func costPolicy() Policy {
	p := samplePolicy()
	p.Rules[0].Algorithm, p.Rules[0].Requests, p.Rules[0].Burst = "TokenBucket", 10_000, 20_000
	p.Rules[0].Cost = &Cost{
		From: CostFromResponse, Usage: UsageAuto, Header: "redline-cost",
		DefaultHold: 1000, MinOutput: 1, OnError: OnErrorUsed, TimeoutMS: 60_000,
	}
	return p
}

// TestCostRoundTrips: a rule's resolved cost reaches the sidecar as it was built, every field,
// and the same policies give the same bytes.
func TestCostRoundTrips(t *testing.T) {
	g := NewWithT(t)
	p := costPolicy()
	_, data, err := Build("shop", []Policy{p}, map[string]string{})
	g.Expect(err).NotTo(HaveOccurred())
	doc, err := Parse(data)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(doc.Policies[0].Rules[0].Cost).To(Equal(p.Rules[0].Cost))
	g.Expect(string(data)).To(ContainSubstring(`"timeoutMs": 60000`))

	_, again, err := Build("shop", []Policy{costPolicy()}, map[string]string{})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(again).To(Equal(data))
}

// TestParseRefusesInvalidCosts: Parse checks a cost as strictly as the controller resolves
// it, so a document edited by hand or by a tenant cannot hand the sidecar a hold it could
// never grant, an unknown usage, or a header it must not remove.
func TestParseRefusesInvalidCosts(t *testing.T) {
	for name, tc := range map[string]struct {
		edit func(*Rule)
		want string
	}{
		"another source":       {func(r *Rule) { r.Cost.From = "Request" }, `from "Request"`},
		"a candidate":          {func(r *Rule) { r.Candidate = &Candidate{Algorithm: "FixedWindow", Requests: 1, WindowMS: 1000} }, "no candidate"},
		"unknown usage":        {func(r *Rule) { r.Cost.Usage = "Cohere" }, `unknown usage "Cohere"`},
		"unknown onError":      {func(r *Rule) { r.Cost.OnError = "Half" }, `unknown onError "Half"`},
		"zero hold":            {func(r *Rule) { r.Cost.DefaultHold = 0 }, "defaultHold 0"},
		"hold over the burst":  {func(r *Rule) { r.Cost.DefaultHold = 20_001 }, "capacity 20000"},
		"hold over requests":   {func(r *Rule) { r.Algorithm, r.Burst, r.Cost.DefaultHold = "FixedWindow", 0, 10_001 }, "capacity 10000"},
		"negative min output":  {func(r *Rule) { r.Cost.MinOutput = -1 }, "minOutput -1"},
		"min output over cap":  {func(r *Rule) { r.Cost.MinOutput = 20_001 }, "minOutput 20001"},
		"short timeout":        {func(r *Rule) { r.Cost.TimeoutMS = 999 }, "timeoutMs 999"},
		"long timeout":         {func(r *Rule) { r.Cost.TimeoutMS = 3_600_001 }, "timeoutMs 3600001"},
		"empty header":         {func(r *Rule) { r.Cost.Header = "" }, "header is empty"},
		"header not lowercase": {func(r *Rule) { r.Cost.Header = "Redline-Cost" }, "not lowercased"},
		"header not a token":   {func(r *Rule) { r.Cost.Header = "redline cost" }, "not an HTTP field name"},
		"header too long":      {func(r *Rule) { r.Cost.Header = strings.Repeat("x", 65) }, "longer than 64"},
		"hop-by-hop header":    {func(r *Rule) { r.Cost.Header = "transfer-encoding" }, "hop-by-hop"},
		"unknown unsized":      {func(r *Rule) { r.Cost.UnsizedBody = "Hold" }, `unknown unsizedBody "Hold"`},
		"refuse with header":   {func(r *Rule) { r.Cost.Usage, r.Cost.UnsizedBody = UsageHeader, UnsizedRefuse }, "refuse every request"},
		"sidecar's header":     {func(r *Rule) { r.Cost.Header = "retry-after" }, "hop-by-hop or framing field, or one the sidecar writes"},
	} {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			p := costPolicy()
			tc.edit(&p.Rules[0])
			_, data, err := Build("shop", []Policy{p}, map[string]string{})
			g.Expect(err).NotTo(HaveOccurred())
			_, err = Parse(data)
			g.Expect(err).To(MatchError(ContainSubstring("policy a rule r: cost: ")))
			g.Expect(err).To(MatchError(ContainSubstring(tc.want)))
		})
	}
}

// TestSlidingWindowLogCostParses: every algorithm takes a cost from the response, the
// sliding window log too (its holds are kept beside the log: see docs/design/holds.md).
func TestSlidingWindowLogCostParses(t *testing.T) {
	g := NewWithT(t)
	p := costPolicy()
	p.Rules[0].Algorithm, p.Rules[0].Burst = "SlidingWindowLog", 0
	_, data, err := Build("shop", []Policy{p}, map[string]string{})
	g.Expect(err).NotTo(HaveOccurred())
	doc, err := Parse(data)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(doc.Policies[0].Rules[0].Cost).To(Equal(p.Rules[0].Cost))
}

// TestParseRefusesUnknownCostFields: the cost object is decoded as strictly as the rest, so a
// field of a later release is refused rather than ignored.
func TestParseRefusesUnknownCostFields(t *testing.T) {
	g := NewWithT(t)
	_, data, err := Build("shop", []Policy{costPolicy()}, map[string]string{})
	g.Expect(err).NotTo(HaveOccurred())
	edited := strings.Replace(string(data), `"timeoutMs": 60000`, `"timeoutMs": 60000, "debt": "forgive"`, 1)
	g.Expect(edited).NotTo(Equal(string(data)))
	_, err = Parse([]byte(edited))
	g.Expect(err).To(MatchError(ContainSubstring(`unknown field "debt"`)))
}

// TestPreviousSidecarRefusesTokenBudgets: a rule without a cost keeps the previous release's
// document shape (no "cost" key at all), so a sidecar not yet upgraded loads it; a rule whose
// cost comes from the response is refused as a whole by that sidecar (which keeps its last
// good document) rather than counted one unit a request.
func TestPreviousSidecarRefusesTokenBudgets(t *testing.T) {
	g := NewWithT(t)
	_, data, err := Build("shop", []Policy{samplePolicy()}, map[string]string{})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(string(data)).NotTo(ContainSubstring(`"cost"`))
	g.Expect(parsePrev(data)).To(Succeed())

	_, data, err = Build("shop", []Policy{costPolicy()}, map[string]string{})
	g.Expect(err).NotTo(HaveOccurred())
	_, err = Parse(data)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(parsePrev(data)).To(MatchError(ContainSubstring(`unknown field "cost"`)))
}

// TestPreviousSidecarRefusesUnsizedRefuse: a budget that holds an unsized body (the previous
// release's behaviour) keeps the previous document shape; one that refuses it carries
// unsizedBody, which round-trips and which the previous sidecar refuses as a whole rather than
// holding what it cannot size.
func TestPreviousSidecarRefusesUnsizedRefuse(t *testing.T) {
	g := NewWithT(t)
	_, data, err := Build("shop", []Policy{costPolicy()}, map[string]string{})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(string(data)).NotTo(ContainSubstring("unsizedBody"))
	g.Expect(parsePrevCost(data)).To(Succeed())

	p := costPolicy()
	p.Rules[0].Cost.UnsizedBody = UnsizedRefuse
	_, data, err = Build("shop", []Policy{p}, map[string]string{})
	g.Expect(err).NotTo(HaveOccurred())
	doc, err := Parse(data)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(doc.Policies[0].Rules[0].Cost).To(Equal(p.Rules[0].Cost))
	g.Expect(parsePrevCost(data)).To(MatchError(ContainSubstring(`unknown field "unsizedBody"`)))
}

// The release before unsizedBody: its Cost had every field but it.
type (
	prevCost struct {
		From        string `json:"from"`
		Usage       string `json:"usage"`
		Header      string `json:"header"`
		DefaultHold int64  `json:"defaultHold"`
		MinOutput   int64  `json:"minOutput"`
		OnError     string `json:"onError"`
		TimeoutMS   int64  `json:"timeoutMs"`
	}
	prevCostRule struct {
		Rule
		Cost *prevCost `json:"cost,omitempty"`
	}
	prevCostPolicy struct {
		Policy
		Rules []prevCostRule `json:"rules"`
	}
	prevCostDocument struct {
		Document
		Policies []prevCostPolicy `json:"policies"`
	}
)

func parsePrevCost(data []byte) error { return decodeAs[prevCostDocument](data) }

func TestCheckCostHeader(t *testing.T) {
	g := NewWithT(t)
	for _, ok := range []string{"Redline-Cost", "x-usage-tokens", "X_Cost.1", "a"} {
		g.Expect(CheckCostHeader(ok)).To(Succeed(), ok)
	}
	for _, bad := range []string{"", "Redline Cost", "Redline-Cost:", "Rédline", "a\nb", strings.Repeat("a", 65)} {
		g.Expect(CheckCostHeader(bad)).NotTo(Succeed(), "%q", bad)
	}
	for _, name := range ReservedCostHeaders {
		g.Expect(CheckCostHeader(strings.ToUpper(name))).To(MatchError(ContainSubstring("hop-by-hop")), name)
	}
}

// TestPreviousSidecarRefusesCountRefused: a rule that gives refusals back (the default) keeps
// the previous document shape; one that keeps counting them carries countRefused, which
// round-trips and which the previous sidecar refuses as a whole rather than give back what
// the rule says to keep.
func TestPreviousSidecarRefusesCountRefused(t *testing.T) {
	g := NewWithT(t)
	_, data, err := Build("shop", []Policy{samplePolicy()}, map[string]string{})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(string(data)).NotTo(ContainSubstring("countRefused"))
	g.Expect(parsePrevRefused(data)).To(Succeed())

	p := samplePolicy()
	p.Rules[0].CountRefused = true
	_, data, err = Build("shop", []Policy{p}, map[string]string{})
	g.Expect(err).NotTo(HaveOccurred())
	doc, err := Parse(data)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(doc.Policies[0].Rules[0].CountRefused).To(BeTrue())
	g.Expect(parsePrevRefused(data)).To(MatchError(ContainSubstring(`unknown field "countRefused"`)))

	c := costPolicy()
	c.Rules[0].CountRefused = true
	_, data, err = Build("shop", []Policy{c}, map[string]string{})
	g.Expect(err).NotTo(HaveOccurred())
	_, err = Parse(data)
	g.Expect(err).To(MatchError(ContainSubstring("does not count refused requests")))
}

// The release before countRefused: its Rule had every field but it.
type (
	prevRefusedRule struct {
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
	}
	prevRefusedPolicy struct {
		Policy
		Rules []prevRefusedRule `json:"rules"`
	}
	prevRefusedDocument struct {
		Document
		Policies []prevRefusedPolicy `json:"policies"`
	}
)

func parsePrevRefused(data []byte) error { return decodeAs[prevRefusedDocument](data) }
