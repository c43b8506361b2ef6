package policydoc

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	. "github.com/onsi/gomega"
)

func samplePolicy() Policy {
	return Policy{
		Name: "a", Generation: 1, FailureMode: "Open",
		Selector: Selector{
			MatchLabels:      map[string]string{"app": "checkout"},
			MatchExpressions: []Requirement{{Key: "tier", Operator: OpIn, Values: []string{"b", "a"}}},
		},
		Rules: []Rule{{
			Name: "r", Key: []KeyPart{{Header: "x-api-key"}}, Algorithm: "FixedWindow",
			Requests: 10, WindowMS: 60000, Mode: "Enforce",
		}},
	}
}

func TestSelectorMatches(t *testing.T) {
	for name, tc := range map[string]struct {
		sel    Selector
		labels map[string]string
		want   bool
	}{
		"empty matches all":       {Selector{}, map[string]string{"x": "y"}, true},
		"label equal":             {Selector{MatchLabels: map[string]string{"app": "a"}}, map[string]string{"app": "a"}, true},
		"label differs":           {Selector{MatchLabels: map[string]string{"app": "a"}}, map[string]string{"app": "b"}, false},
		"label missing":           {Selector{MatchLabels: map[string]string{"app": "a"}}, nil, false},
		"in":                      {Selector{MatchExpressions: []Requirement{{Key: "t", Operator: OpIn, Values: []string{"1", "2"}}}}, map[string]string{"t": "2"}, true},
		"in missing":              {Selector{MatchExpressions: []Requirement{{Key: "t", Operator: OpIn, Values: []string{"1"}}}}, nil, false},
		"notin absent":            {Selector{MatchExpressions: []Requirement{{Key: "t", Operator: OpNotIn, Values: []string{"1"}}}}, nil, true},
		"notin hit":               {Selector{MatchExpressions: []Requirement{{Key: "t", Operator: OpNotIn, Values: []string{"1"}}}}, map[string]string{"t": "1"}, false},
		"exists":                  {Selector{MatchExpressions: []Requirement{{Key: "t", Operator: OpExists}}}, map[string]string{"t": ""}, true},
		"doesnotexist":            {Selector{MatchExpressions: []Requirement{{Key: "t", Operator: OpDoesNotExist}}}, map[string]string{"t": ""}, false},
		"invalid matches nothing": {Selector{MatchExpressions: []Requirement{{Key: "t", Operator: "Near"}}}, map[string]string{"t": ""}, false},
	} {
		t.Run(name, func(t *testing.T) {
			NewWithT(t).Expect(tc.sel.Matches(tc.labels)).To(Equal(tc.want))
		})
	}
}

func TestParseRefusesCorruptDocuments(t *testing.T) {
	g := NewWithT(t)
	_, data, err := Build("shop", []Policy{samplePolicy()}, map[string]string{"FixedWindow": "aa"})
	g.Expect(err).NotTo(HaveOccurred())
	doc, err := Parse(data)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(doc.Policies[0].Selects(map[string]string{"app": "checkout", "tier": "a"})).To(BeTrue())
	g.Expect(doc.Policies[0].Selects(map[string]string{"app": "checkout", "tier": "c"})).To(BeFalse())

	edited := strings.Replace(string(data), `"requests": 10`, `"requests": 1000`, 1)
	g.Expect(edited).NotTo(Equal(string(data)))
	_, err = Parse([]byte(edited))
	g.Expect(err).To(MatchError(ContainSubstring("does not match its content")))

	_, err = Parse(data[:len(data)/2])
	g.Expect(err).To(MatchError(ContainSubstring("parsing policies document")))

	var m map[string]any
	g.Expect(json.Unmarshal(data, &m)).To(Succeed())
	m["version"] = 2
	v2, _ := json.Marshal(m)
	_, err = Parse(v2)
	g.Expect(err).To(MatchError(ContainSubstring("version 2")))

	m["version"] = 1
	m["surprise"] = true
	unknown, _ := json.Marshal(m)
	_, err = Parse(unknown)
	g.Expect(err).To(MatchError(ContainSubstring("unknown field")))
}

func TestVouchedAcceptsOnlyTheBytesBuildWrote(t *testing.T) {
	p := Policy{Name: "p", Generation: 1, FailureMode: "Open", Rules: []Rule{{
		Name: "r", Key: []KeyPart{{Header: "x-key"}}, Algorithm: "FixedWindow", Requests: 10, WindowMS: 60000, Mode: "Enforce",
	}}}
	doc, data, err := Build("shop", []Policy{p}, map[string]string{"FixedWindow": "abc"})
	if err != nil {
		t.Fatal(err)
	}
	if !Vouched(data, doc.Hash) {
		t.Fatalf("Build's own bytes are not vouched for by their hash %s", doc.Hash)
	}
	tampered := bytes.Replace(data, []byte(`"requests": 10`), []byte(`"requests": 99`), 1)
	if bytes.Equal(tampered, data) {
		t.Fatal("the test's replacement did not apply")
	}
	if Vouched(tampered, doc.Hash) {
		t.Error("an edited document is vouched for by the original's hash")
	}
	if Vouched(data, strings.Repeat("0", 64)) || Vouched(data, "") {
		t.Error("a document is vouched for by a hash that is not its own")
	}
}

// The previous release's document types: the same but for Match, which had no exactPath, and
// Rule, which had no candidate, reportValues or cost. encoding/json lets a shallower field
// hide the embedded one of the same name.
type (
	prevMatch struct {
		PathPrefix string        `json:"pathPrefix,omitempty"`
		Methods    []string      `json:"methods,omitempty"`
		Headers    []HeaderMatch `json:"headers,omitempty"`
	}
	prevRule struct {
		Name      string     `json:"name"`
		Match     *prevMatch `json:"match,omitempty"`
		Key       []KeyPart  `json:"key"`
		Algorithm string     `json:"algorithm"`
		Requests  int64      `json:"requests"`
		WindowMS  int64      `json:"windowMs"`
		Burst     int64      `json:"burst,omitempty"`
		Mode      string     `json:"mode"`
	}
	prevPolicy struct {
		Policy
		Rules []prevRule `json:"rules"`
	}
	prevDocument struct {
		Document
		Policies []prevPolicy `json:"policies"`
	}
)

// parsePrev decodes as the previous release's sidecar does: strictly.
func parsePrev(data []byte) error { return decodeAs[prevDocument](data) }

// TestPreviousSidecarReadsPrefixRulesAndRefusesExactOnes: a document whose paths are all
// prefixes keeps the previous release's shape, so a sidecar not yet upgraded loads it; one
// with an exact path is refused as a whole by that sidecar (which keeps its last good one)
// rather than enforced as something else.
func TestPreviousSidecarReadsPrefixRulesAndRefusesExactOnes(t *testing.T) {
	g := NewWithT(t)
	p := samplePolicy()
	p.Rules[0].Match = &Match{PathPrefix: "/api", Methods: []string{"GET"}}
	_, data, err := Build("shop", []Policy{p}, map[string]string{})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(parsePrev(data)).To(Succeed())
	g.Expect(string(data)).NotTo(ContainSubstring("exactPath"))

	p.Rules[0].Match = &Match{ExactPath: "/api"}
	_, data, err = Build("shop", []Policy{p}, map[string]string{})
	g.Expect(err).NotTo(HaveOccurred())
	_, err = Parse(data)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(parsePrev(data)).To(MatchError(ContainSubstring(`unknown field "exactPath"`)))
}

// A match that ignores case or a trailing slash round-trips, and the previous release's
// sidecar refuses the document rather than count fewer requests than the rule means.
func TestPreviousSidecarRefusesCaseAndTrailingSlashOptions(t *testing.T) {
	for _, m := range []*Match{
		{PathPrefix: "/api", IgnoreCase: true},
		{ExactPath: "/login", IgnoreTrailingSlash: true},
		{ExactPath: "/login", IgnoreCase: true, IgnoreTrailingSlash: true},
	} {
		g := NewWithT(t)
		p := samplePolicy()
		p.Rules[0].Match = m
		_, data, err := Build("shop", []Policy{p}, map[string]string{})
		g.Expect(err).NotTo(HaveOccurred())
		doc, err := Parse(data)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(doc.Policies[0].Rules[0].Match).To(Equal(m))
		g.Expect(parsePrev(data)).To(MatchError(Or(ContainSubstring(`unknown field "ignoreCase"`), ContainSubstring(`unknown field "ignoreTrailingSlash"`), ContainSubstring(`unknown field "exactPath"`))))
	}
}

func TestParseRefusesInvalidPathMatches(t *testing.T) {
	for name, m := range map[string]*Match{
		"ignoreCase without a path":        {IgnoreCase: true, Methods: []string{"GET"}},
		"ignoreTrailingSlash on a prefix":  {PathPrefix: "/a", IgnoreTrailingSlash: true},
		"ignoreTrailingSlash without path": {IgnoreTrailingSlash: true},
		"both":                             {PathPrefix: "/a", ExactPath: "/a"},
		"relative prefix":                  {PathPrefix: "a"},
		"relative exact":                   {ExactPath: "a/b"},
	} {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			p := samplePolicy()
			p.Rules[0].Match = m
			_, data, err := Build("shop", []Policy{p}, map[string]string{})
			g.Expect(err).NotTo(HaveOccurred())
			_, err = Parse(data)
			g.Expect(err).To(MatchError(ContainSubstring("policy a rule r: match")))
		})
	}
}

// A document with an in-flight rule reads back, and the previous release's sidecar refuses it
// as a whole rather than take the rule for a limit per window; one that mixes an in-flight rule
// with parts of a limit per window is refused.
func TestInFlightRulesAndThePreviousSidecar(t *testing.T) {
	g := NewWithT(t)
	p := samplePolicy()
	r := p.Rules[0]
	r.Algorithm, r.Requests, r.WindowMS, r.Burst, r.Candidate, r.Cost, r.CountRefused = "", 0, 0, 0, nil, nil, false
	r.InFlight = 8
	p.Rules = []Rule{r}
	_, data, err := Build("shop", []Policy{p}, map[string]string{})
	g.Expect(err).NotTo(HaveOccurred())
	doc, err := Parse(data)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(doc.Policies[0].Rules[0].InFlight).To(BeEquivalentTo(8))
	g.Expect(parsePrevInFlight(data)).To(MatchError(ContainSubstring(`unknown field "inFlight"`)))
	_, data, err = Build("shop", []Policy{samplePolicy()}, map[string]string{})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(parsePrevInFlight(data)).To(Succeed(), "a document without in-flight rules is the previous release's")

	for name, edit := range map[string]func(*Rule){
		"with requests":  func(r *Rule) { r.Requests = 5 },
		"with algorithm": func(r *Rule) { r.Algorithm = "FixedWindow" },
		"with a cost":    func(r *Rule) { r.Cost = &Cost{From: "Response"} },
		"too many":       func(r *Rule) { r.InFlight = MaxInFlight + 1 },
		"negative":       func(r *Rule) { r.InFlight = -1 },
		"without a key":  func(r *Rule) { r.Key = nil },
	} {
		bad := r
		edit(&bad)
		p.Rules = []Rule{bad}
		_, data, err := Build("shop", []Policy{p}, map[string]string{})
		g.Expect(err).NotTo(HaveOccurred())
		_, err = Parse(data)
		g.Expect(err).To(HaveOccurred(), name)
	}
}

// The release before inFlight: its Rule had every field but it.
type (
	prevInFlightRule struct {
		prevRefusedRule
		CountRefused bool `json:"countRefused,omitempty"`
	}
	prevInFlightPolicy struct {
		Policy
		Rules []prevInFlightRule `json:"rules"`
	}
	prevInFlightDocument struct {
		Document
		Policies []prevInFlightPolicy `json:"policies"`
	}
)

func parsePrevInFlight(data []byte) error { return decodeAs[prevInFlightDocument](data) }

// decodeAs decodes data as a document of the shape T, refusing fields T does not know: as a
// sidecar of the release whose document T is would read it.
func decodeAs[T any](data []byte) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var doc T
	return dec.Decode(&doc)
}
