package ruleset_test

import (
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/redline-dev/redline/internal/policydoc"
	"github.com/redline-dev/redline/internal/sidecar/ruleset"
	"github.com/redline-dev/redline/internal/tokens"
)

// costDoc is a namespace with a token budget on /v1 for POST and a request-counting rule on
// everything, through Parse as the sidecar reads it.
func costDoc(t testing.TB, usage string) *policydoc.Document {
	t.Helper()
	budget := policydoc.Rule{
		Name: "tokens", Key: []policydoc.KeyPart{{Header: "x-api-key"}}, Algorithm: "SlidingWindowCounter",
		Requests: 10_000, WindowMS: 60_000, Mode: "Enforce",
		Match: &policydoc.Match{PathPrefix: "/v1", Methods: []string{"POST"}},
		Cost: &policydoc.Cost{
			From: policydoc.CostFromResponse, Usage: usage, Header: "x-usage-tokens",
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

func TestBuildCompilesCost(t *testing.T) {
	g := NewWithT(t)
	set, err := ruleset.NewBuilder("").Build(costDoc(t, policydoc.UsageAuto), nil)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(set.Rules).To(HaveLen(2))
	g.Expect(set.Rules[0].Cost).To(BeNil(), "a rule without a cost counts one unit a request")
	g.Expect(set.Rules[1].Cost).To(Equal(&ruleset.Cost{
		ByPath: true, Header: "X-Usage-Tokens", DefaultHold: 500, MinOutput: 16,
		ZeroOnError: true, Timeout: 90 * time.Second,
	}))

	for usage, kind := range map[string]tokens.Kind{
		policydoc.UsageOpenAIChat: tokens.OpenAIChat, policydoc.UsageOpenAIResponses: tokens.OpenAIResponses,
		policydoc.UsageAnthropic: tokens.Anthropic, policydoc.UsageGemini: tokens.Gemini, policydoc.UsageHeader: tokens.Unknown,
	} {
		set, err := ruleset.NewBuilder("").Build(costDoc(t, usage), nil)
		g.Expect(err).NotTo(HaveOccurred())
		c := set.Rules[1].Cost
		g.Expect(c.ByPath).To(BeFalse(), usage)
		g.Expect(c.Kind).To(Equal(kind), usage)
	}
}

// TestCostKindFor: usage Auto reads what the path names and nothing (the header only) on any
// other path; a named API is read whatever the path; Header reads no body.
func TestCostKindFor(t *testing.T) {
	g := NewWithT(t)
	auto := &ruleset.Cost{ByPath: true}
	for path, want := range map[string]tokens.Kind{
		"/v1/chat/completions": tokens.OpenAIChat,
		"/v1/responses":        tokens.OpenAIResponses,
		"/v1/messages":         tokens.Anthropic,
		"/v1beta/models/gemini-2.0-flash:generateContent": tokens.Gemini,
		"/v1/embeddings":       tokens.OpenAIEmbeddings,
		"/v1/completions":      tokens.OpenAICompletions,
		"/v1/Chat/Completions": tokens.OpenAIChat,
		"/api/report":          tokens.Unknown,
	} {
		k, _ := auto.KindFor(path)
		g.Expect(k).To(Equal(want), path)
	}
	k, stream := auto.KindFor("/v1beta/models/m:streamGenerateContent")
	g.Expect(k).To(Equal(tokens.Gemini))
	g.Expect(stream).To(BeTrue())

	chat := &ruleset.Cost{Kind: tokens.OpenAIChat}
	k, _ = chat.KindFor("/llm/complete")
	g.Expect(k).To(Equal(tokens.OpenAIChat), "a named API is read on any path")
	gemini := &ruleset.Cost{Kind: tokens.Gemini}
	_, stream = gemini.KindFor("/v1beta/models/m:streamGenerateContent")
	g.Expect(stream).To(BeTrue())
	_, stream = chat.KindFor("/v1beta/models/m:streamGenerateContent")
	g.Expect(stream).To(BeFalse(), "the path's stream is Gemini's only")
	k, _ = (&ruleset.Cost{}).KindFor("/v1/chat/completions")
	g.Expect(k).To(Equal(tokens.Unknown), "usage Header reads no body")
}

// TestBuildRefusesCostsParseWouldRefuse: a document handed to Build without Parse (a tool, a
// test) still cannot give a rule a cost the sidecar cannot apply.
func TestBuildRefusesCostsParseWouldRefuse(t *testing.T) {
	for name, edit := range map[string]func(*policydoc.Cost){
		"source":   func(c *policydoc.Cost) { c.From = "Request" },
		"usage":    func(c *policydoc.Cost) { c.Usage = "Cohere" },
		"header":   func(c *policydoc.Cost) { c.Header = "content-length" },
		"hold":     func(c *policydoc.Cost) { c.DefaultHold = 0 },
		"timeout":  func(c *policydoc.Cost) { c.TimeoutMS = 10 },
		"minimum":  func(c *policydoc.Cost) { c.MinOutput = -1 },
		"no token": func(c *policydoc.Cost) { c.Header = "a b" },
	} {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			doc := costDoc(t, policydoc.UsageAuto)
			edit(doc.Policies[0].Rules[1].Cost)
			_, err := ruleset.NewBuilder("").Build(doc, nil)
			g.Expect(err).To(MatchError(ContainSubstring("policy p rule tokens: ")))
		})
	}
}
