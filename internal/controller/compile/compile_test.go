package compile

import (
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/redline-dev/redline/api/v1alpha1"
	"github.com/redline-dev/redline/internal/policydoc"
)

func testPolicy(name string, requests int64) *v1alpha1.RateLimitPolicy {
	return &v1alpha1.RateLimitPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "shop", Generation: 3},
		Spec: v1alpha1.RateLimitPolicySpec{
			TargetSelector: metav1.LabelSelector{
				MatchLabels: map[string]string{"app": "checkout"},
				MatchExpressions: []metav1.LabelSelectorRequirement{
					{Key: "tier", Operator: metav1.LabelSelectorOpIn, Values: []string{"b", "a"}},
					{Key: "env", Operator: metav1.LabelSelectorOpNotIn, Values: []string{"dev"}},
				},
			},
			Rules: []v1alpha1.Rule{{
				Name: "r",
				Match: &v1alpha1.RuleMatch{
					PathPrefix: "/api/", Methods: []v1alpha1.HTTPMethod{"POST", "GET"},
					Headers: []v1alpha1.HeaderMatch{{Name: "X-B"}, {Name: "X-A"}},
				},
				Key:   []v1alpha1.KeyPart{{Header: "X-API-Key"}, {Attribute: v1alpha1.Method}},
				Limit: v1alpha1.Limit{Requests: requests, Window: metav1.Duration{Duration: time.Minute}},
			}},
		},
	}
}

func compileAll(t *testing.T, ps ...*v1alpha1.RateLimitPolicy) []policydoc.Policy {
	t.Helper()
	var out []policydoc.Policy
	for _, p := range ps {
		c, err := Policy(p)
		if err != nil {
			t.Fatalf("compiling %s: %v", p.Name, err)
		}
		out = append(out, c)
	}
	return out
}

func TestBuildIsDeterministic(t *testing.T) {
	g := NewWithT(t)
	scripts := map[string]string{"FixedWindow": "aa", "TokenBucket": "bb"}
	a, b := testPolicy("a", 10), testPolicy("b", 20)
	_, data1, err := policydoc.Build("shop", compileAll(t, a, b), scripts)
	g.Expect(err).NotTo(HaveOccurred())

	// Same meaning, other order of policies, selector values and expressions.
	b2 := testPolicy("b", 20)
	b2.Spec.TargetSelector.MatchExpressions[0].Values = []string{"a", "b"}
	ex := b2.Spec.TargetSelector.MatchExpressions
	ex[0], ex[1] = ex[1], ex[0]
	b2.Spec.Rules[0].Match.Methods = []v1alpha1.HTTPMethod{"GET", "POST"}
	_, data2, err := policydoc.Build("shop", compileAll(t, b2, a), scripts)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(string(data2)).To(Equal(string(data1)))

	_, data3, err := policydoc.Build("shop", compileAll(t, a, testPolicy("b", 21)), scripts)
	g.Expect(err).NotTo(HaveOccurred())
	d1, _ := policydoc.Parse(data1)
	d3, _ := policydoc.Parse(data3)
	g.Expect(d3.Hash).NotTo(Equal(d1.Hash), "a changed limit changes the hash")
}

func TestCompileDefaultsAndNormalises(t *testing.T) {
	g := NewWithT(t)
	p := testPolicy("a", 10)
	c, err := Policy(p)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(c.FailureMode).To(Equal("LocalFallback"))
	r := c.Rules[0]
	g.Expect(r.Algorithm).To(Equal("SlidingWindowCounter"))
	g.Expect(r.Mode).To(Equal("Enforce"))
	g.Expect(r.WindowMS).To(BeEquivalentTo(60000))
	g.Expect(r.Key).To(Equal([]policydoc.KeyPart{{Header: "x-api-key"}, {Attribute: "Method"}}))
	g.Expect(r.Match.Methods).To(Equal([]string{"GET", "POST"}))
	g.Expect(r.Match.Headers[0].Name).To(Equal("x-a"))
	g.Expect(r.Burst).To(BeZero())
	g.Expect(c.HeadersOnRefusal).To(BeFalse(), "RateLimit fields on every response by default")

	p.Spec.RateLimitHeaders = v1alpha1.HeadersOnRefusal
	c, err = Policy(p)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(c.HeadersOnRefusal).To(BeTrue())

	p.Spec.Rules[0].Algorithm = v1alpha1.TokenBucket
	c, err = Policy(p)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(c.Rules[0].Burst).To(BeEquivalentTo(10), "burst defaults to requests")
}

func TestCompileRefuses(t *testing.T) {
	for name, tc := range map[string]struct {
		mutate func(*v1alpha1.RateLimitPolicy)
		want   string
	}{
		"selector operator without values": {func(p *v1alpha1.RateLimitPolicy) {
			p.Spec.TargetSelector.MatchExpressions[0].Values = nil
		}, "spec.targetSelector"},
		"unknown selector operator": {func(p *v1alpha1.RateLimitPolicy) {
			p.Spec.TargetSelector.MatchExpressions[0].Operator = "Near"
		}, "spec.targetSelector"},
		"duplicate rule": {func(p *v1alpha1.RateLimitPolicy) {
			p.Spec.Rules = append(p.Spec.Rules, p.Spec.Rules[0])
		}, "used by an earlier rule"},
		"burst without token bucket": {func(p *v1alpha1.RateLimitPolicy) {
			b := int64(3)
			p.Spec.Rules[0].Limit.Burst = &b
		}, "burst is only valid"},
		"short window": {func(p *v1alpha1.RateLimitPolicy) {
			p.Spec.Rules[0].Limit.Window.Duration = 10 * time.Millisecond
		}, "between 1s and 24h"},
		"key part with two sources": {func(p *v1alpha1.RateLimitPolicy) {
			p.Spec.Rules[0].Key[0].Constant = "x"
		}, "exactly one of"},
		"no rules": {func(p *v1alpha1.RateLimitPolicy) { p.Spec.Rules = nil }, "at least one rule"},
		"unknown refused": {func(p *v1alpha1.RateLimitPolicy) {
			p.Spec.Rules[0].Refused = "Sometimes"
		}, `refused "Sometimes" must be Uncounted or Counted`},
		"refused counted with a token budget": {func(p *v1alpha1.RateLimitPolicy) {
			p.Spec.Rules[0].Refused = v1alpha1.RefusedCounted
			p.Spec.Rules[0].Cost = &v1alpha1.Cost{From: v1alpha1.CostFromResponse}
		}, "refused: Counted cannot go with cost.from: Response"},
	} {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			p := testPolicy("a", 10)
			tc.mutate(p)
			_, err := Policy(p)
			g.Expect(err).To(MatchError(ContainSubstring(tc.want)))
		})
	}
}

// TestCompilePaths: both forms of a prefix give the same document (the pathPrefix field every
// sidecar release reads), Exact gives exactPath, values are decoded as the sidecar compares
// them, and what the schema refuses is refused again for objects stored before it did.
func TestCompilePaths(t *testing.T) {
	compile := func(m *v1alpha1.RuleMatch) (*policydoc.Match, error) {
		p := testPolicy("a", 10)
		p.Spec.Rules[0].Match = m
		c, err := Policy(p)
		if err != nil {
			return nil, err
		}
		return c.Rules[0].Match, nil
	}
	path := func(typ v1alpha1.PathMatchType, v string) *v1alpha1.RuleMatch {
		return &v1alpha1.RuleMatch{Path: &v1alpha1.PathMatch{Type: typ, Value: v}}
	}
	for name, tc := range map[string]struct {
		m    *v1alpha1.RuleMatch
		want policydoc.Match
	}{
		"deprecated pathPrefix":    {&v1alpha1.RuleMatch{PathPrefix: "/api/"}, policydoc.Match{PathPrefix: "/api/"}},
		"path, type defaulted":     {path("", "/api/"), policydoc.Match{PathPrefix: "/api/"}},
		"path PathPrefix":          {path(v1alpha1.PathMatchPathPrefix, "/api/"), policydoc.Match{PathPrefix: "/api/"}},
		"path Exact":               {path(v1alpha1.PathMatchExact, "/login"), policydoc.Match{ExactPath: "/login"}},
		"escapes decoded":          {path(v1alpha1.PathMatchExact, "/a%20b/caf%C3%A9"), policydoc.Match{ExactPath: "/a b/caf\u00e9"}},
		"an encoded '#' is a char": {path("", "/a%23b"), policydoc.Match{PathPrefix: "/a#b"}},
		"prefix ignoring case": {&v1alpha1.RuleMatch{Path: &v1alpha1.PathMatch{Value: "/api", IgnoreCase: true}},
			policydoc.Match{PathPrefix: "/api", IgnoreCase: true}},
		"exact ignoring case and a trailing slash": {&v1alpha1.RuleMatch{Path: &v1alpha1.PathMatch{Type: v1alpha1.PathMatchExact, Value: "/login",
			IgnoreCase: true, TrailingSlash: v1alpha1.TrailingSlashIgnore}}, policydoc.Match{ExactPath: "/login", IgnoreCase: true, IgnoreTrailingSlash: true}},
		"exact, trailing slash strict": {&v1alpha1.RuleMatch{Path: &v1alpha1.PathMatch{Type: v1alpha1.PathMatchExact, Value: "/login",
			TrailingSlash: v1alpha1.TrailingSlashStrict}}, policydoc.Match{ExactPath: "/login"}},
	} {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			got, err := compile(tc.m)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(*got).To(Equal(tc.want))
		})
	}
	for name, tc := range map[string]struct {
		m    *v1alpha1.RuleMatch
		want string
	}{
		"both":                {&v1alpha1.RuleMatch{PathPrefix: "/a", Path: &v1alpha1.PathMatch{Value: "/a"}}, "mutually exclusive"},
		"relative pathPrefix": {&v1alpha1.RuleMatch{PathPrefix: "api"}, "match.pathPrefix must start with '/'"},
		"relative":            {path("", "api"), "match.path.value must start with '/'"},
		"too long":            {path("", "/"+strings.Repeat("a", v1alpha1.MaxPathLength)), "at most 1024 characters"},
		"bad escape":          {path("", "/a%zz"), "two hex digits"},
		"encoded slash":       {path("", "/a%2fb"), "encoded slash"},
		"encoded backslash":   {path("", "/a%5Cb"), "backslash"},
		"encoded dot segment": {path("", "/a/%2e%2E/b"), "'..' segment"},
		"encoded dot":         {path(v1alpha1.PathMatchExact, "/a/%2E"), "'.' or '..' segment"},
		"double slash":        {path("", "/a//b"), "'//'"},
		"unknown type":        {path("RegularExpression", "/a"), "PathPrefix or Exact"},
		"trailing slash on a prefix": {&v1alpha1.RuleMatch{Path: &v1alpha1.PathMatch{Value: "/a", TrailingSlash: v1alpha1.TrailingSlashIgnore}},
			"trailingSlash: Ignore needs type: Exact"},
		"unknown trailing slash": {&v1alpha1.RuleMatch{Path: &v1alpha1.PathMatch{Type: v1alpha1.PathMatchExact, Value: "/a", TrailingSlash: "Sometimes"}},
			"Strict or Ignore"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := compile(tc.m)
			NewWithT(t).Expect(err).To(MatchError(And(ContainSubstring("spec.rules[0] (r): "), ContainSubstring(tc.want))))
		})
	}
}

// TestCompileRefused: refused: Counted compiles to countRefused; Uncounted, or nothing, to the
// document a previous sidecar reads.
func TestCompileRefused(t *testing.T) {
	g := NewWithT(t)
	for refused, want := range map[v1alpha1.RefusedRequests]bool{"": false, v1alpha1.RefusedUncounted: false, v1alpha1.RefusedCounted: true} {
		p := testPolicy("a", 10)
		p.Spec.Rules[0].Refused = refused
		cp, err := Policy(p)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(cp.Rules[0].CountRefused).To(Equal(want), "refused %q", refused)
	}
}
