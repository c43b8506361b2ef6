package decide_test

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/redline-dev/redline/internal/keyscheme"
	"github.com/redline-dev/redline/internal/limiter"
	"github.com/redline-dev/redline/internal/policydoc"
	"github.com/redline-dev/redline/internal/sidecar/decide"
	"github.com/redline-dev/redline/internal/sidecar/ruleset"
	"github.com/redline-dev/redline/internal/testutil/sidecartest"
)

// fakeLimiter counts per key in memory and admits Requests per key.
type fakeLimiter struct {
	mu    sync.Mutex
	count map[string]int64
	keys  []string
	err   error
}

func (f *fakeLimiter) Allow(_ context.Context, key string, l limiter.Limit, cost int64) (limiter.Result, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return limiter.Result{}, f.err
	}
	if f.count == nil {
		f.count = map[string]int64{}
	}
	f.keys = append(f.keys, key)
	r := limiter.Result{Source: limiter.SourceRedis, ResetAfter: l.Window}
	if f.count[key]+cost <= l.Requests {
		f.count[key] += cost
		r.Allowed, r.Remaining = true, l.Requests-f.count[key]
	} else {
		r.OverLimit, r.RetryAfter = true, l.Window/2+time.Millisecond
	}
	if l.Shadow {
		r.Allowed = true
	}
	return r, nil
}

//go:fix inline

func testSet(t *testing.T, override limiter.FailureMode) *ruleset.Set {
	t.Helper()
	pols := []policydoc.Policy{
		{
			Name: "api", FailureMode: "LocalFallback",
			Rules: []policydoc.Rule{
				{Name: "per-key", Match: &policydoc.Match{PathPrefix: "/api/", Methods: []string{"POST"}},
					Key: []policydoc.KeyPart{{Header: "x-api-key"}}, Algorithm: "FixedWindow", Requests: 2, WindowMS: 60000, Mode: "Enforce"},
				{Name: "per-ip", Key: []policydoc.KeyPart{{Attribute: "ForwardedFor"}}, Algorithm: "SlidingWindowCounter",
					Requests: 3, WindowMS: 1500, Mode: "Enforce"},
				{Name: "trial", Match: &policydoc.Match{Headers: []policydoc.HeaderMatch{{Name: "x-tier", Value: new("free")}}},
					Key: []policydoc.KeyPart{{Constant: "all"}}, Algorithm: "TokenBucket", Requests: 1, WindowMS: 1000, Burst: 1, Mode: "Shadow"},
			},
		},
		{Name: "other-app", Selector: metaSelector("app", "other"), FailureMode: "Open",
			Rules: []policydoc.Rule{{Name: "r", Key: []policydoc.KeyPart{{Constant: "x"}}, Algorithm: "FixedWindow", Requests: 1, WindowMS: 1000, Mode: "Enforce"}}},
	}
	doc, _, err := policydoc.Build("shop", pols, nil)
	if err != nil {
		t.Fatal(err)
	}
	set, err := ruleset.NewBuilder(override).Build(doc, map[string]string{"app": "checkout"})
	if err != nil {
		t.Fatal(err)
	}
	return set
}

func req(method, path, remote string, h ...string) *decide.Request {
	r := &decide.Request{Method: method, Path: path, RemoteAddr: remote, Header: http.Header{}}
	for i := 0; i+1 < len(h); i += 2 {
		r.Header.Add(h[i], h[i+1])
	}
	return r
}

func TestDecideMatchesKeysAndRefuses(t *testing.T) {
	g := NewWithT(t)
	set := testSet(t, "")
	g.Expect(set.PolicyNames()).To(Equal([]string{"api"}), "only policies selecting the pod's labels")
	fl := &fakeLimiter{}
	e := &decide.Engine{Limiter: sidecartest.FakeLimiter{Decide: fl.Allow}, TrustedHops: 1}
	ctx := context.Background()

	// POST /api/ with a key: per-key and per-ip match; shadow rule only with x-tier: free.
	d := decideReq(ctx, e, set, req("POST", "/api/orders", "10.0.0.1:5555", "X-Api-Key", "k1", "X-Forwarded-For", "1.1.1.1, 2.2.2.2"))
	g.Expect(d.Allowed).To(BeTrue())
	g.Expect(d.Outcomes).To(HaveLen(2))
	// Rules are asked concurrently, so the order of the calls is not fixed.
	g.Expect(fl.keys).To(ConsistOf(keyscheme.Key("shop", "api", "per-key", "k1"),
		keyscheme.Key("shop", "api", "per-ip", "2.2.2.2")), "one trusted hop: the rightmost entry")
	f := d.Fields()
	g.Expect(f.Policy).To(Equal(`"api/per-key";q=2;w=60, "api/per-ip";q=3;w=2`))
	g.Expect(f.RateLimit).To(Equal(`"api/per-key";r=1;t=60, "api/per-ip";r=2;t=2`))
	g.Expect(f.RetryAfter).To(BeEmpty())

	// GET does not match per-key.
	d = decideReq(ctx, e, set, req("GET", "/api/orders", "10.0.0.9:1", "X-Api-Key", "k1"))
	g.Expect(d.Outcomes).To(HaveLen(1))
	g.Expect(d.Outcomes[0].Rule.Name).To(Equal("per-ip"))

	// Second POST with k1 admitted, third refused by per-key with Retry-After rounded up.
	d = decideReq(ctx, e, set, req("POST", "/api/x", "10.0.0.2:1", "X-Api-Key", "k1"))
	g.Expect(d.Allowed).To(BeTrue())
	d = decideReq(ctx, e, set, req("POST", "/api/x", "10.0.0.3:1", "X-Api-Key", "k1"))
	g.Expect(d.Allowed).To(BeFalse())
	g.Expect(d.Refused.Rule.ID).To(Equal("api/per-key"))
	g.Expect(d.RetryAfterSeconds()).To(Equal(int64(31)))
	g.Expect(d.Fields().RetryAfter).To(Equal("31"))

	// Shadow rule: refuses in the count but the request passes, and it stays out of the headers.
	for i := range 3 {
		d = decideReq(ctx, e, set, req("GET", "/", "10.1.0.1:1", "X-Tier", "free"))
		g.Expect(d.Allowed).To(BeTrue(), "request %d", i)
	}
	g.Expect(d.Outcomes).To(HaveLen(2))
	g.Expect(d.Outcomes[1].Result.OverLimit).To(BeTrue())
	g.Expect(d.Fields().Policy).NotTo(ContainSubstring("trial"))
	// A header match with the wrong value does not match.
	d = decideReq(ctx, e, set, req("GET", "/", "10.1.0.2:1", "X-Tier", "gold"))
	g.Expect(d.Outcomes).To(HaveLen(1))
}

func TestDecideHits(t *testing.T) {
	g := NewWithT(t)
	set := testSet(t, "")
	fl := &fakeLimiter{}
	e := &decide.Engine{Limiter: sidecartest.FakeLimiter{Decide: fl.Allow}}
	d, err := decideHits(context.Background(), e, set, []decide.Hit{{Policy: "api", Rule: "per-key", Key: []string{"k9"}}}, 2)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(d.Allowed).To(BeTrue())
	g.Expect(fl.keys).To(Equal([]string{keyscheme.Key("shop", "api", "per-key", "k9")}), "same key as the proxy computes for that header")
	d, err = decideHits(context.Background(), e, set, []decide.Hit{{Policy: "api", Rule: "per-key", Key: []string{"k9"}}}, 1)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(d.Allowed).To(BeFalse())
	_, err = decideHits(context.Background(), e, set, []decide.Hit{{Policy: "other-app", Rule: "r"}}, 1)
	g.Expect(err).To(MatchError(decide.ErrUnknownRule))
}

func TestFailureModeOverrideAndLimiterErrors(t *testing.T) {
	g := NewWithT(t)
	set := testSet(t, limiter.FailureModeClosed)
	for _, r := range set.Rules {
		g.Expect(r.Limit.FailureMode).To(Equal(limiter.FailureModeClosed))
	}
	e := &decide.Engine{Limiter: sidecartest.FakeLimiter{Decide: (&fakeLimiter{err: limiter.ErrClosed}).Allow}}
	d := decideReq(context.Background(), e, set, req("GET", "/", "1.2.3.4:1"))
	g.Expect(d.Allowed).To(BeFalse(), "Closed refuses when the limiter cannot answer")
	g.Expect(d.Fields().RetryAfter).To(Equal("1"))

	e = &decide.Engine{Limiter: sidecartest.FakeLimiter{Decide: (&fakeLimiter{err: limiter.ErrClosed}).Allow}}
	d = decideReq(context.Background(), e, testSet(t, limiter.FailureModeOpen), req("GET", "/", "1.2.3.4:1"))
	g.Expect(d.Allowed).To(BeTrue())
}

func TestNoPoliciesAdmits(t *testing.T) {
	g := NewWithT(t)
	e := &decide.Engine{Limiter: sidecartest.FakeLimiter{Decide: (&fakeLimiter{}).Allow}}
	d := decideReq(context.Background(), e, nil, req("GET", "/", "1.2.3.4:1"))
	g.Expect(d.Allowed).To(BeTrue())
	g.Expect(d.Fields()).To(Equal(decide.Fields{}))
}

func TestClientIP(t *testing.T) {
	cases := []struct {
		name string
		xff  []string
		hops int
		want string
	}{
		{"no hops ignores the header", []string{"1.1.1.1"}, 0, "9.9.9.9"},
		{"no header", nil, 2, "9.9.9.9"},
		{"one hop", []string{"6.6.6.6, 1.1.1.1"}, 1, "1.1.1.1"},
		{"two hops", []string{"6.6.6.6, 1.1.1.1, 2.2.2.2"}, 2, "1.1.1.1"},
		{"across fields", []string{"6.6.6.6, 1.1.1.1", "2.2.2.2"}, 2, "1.1.1.1"},
		{"shorter than hops", []string{"1.1.1.1"}, 3, "1.1.1.1"},
		{"empty entries skipped", []string{" , 1.1.1.1 ,"}, 1, "1.1.1.1"},
		{"only empties", []string{" , "}, 1, "9.9.9.9"},
		// A client writes what it likes on the left: the entry trusted proxies wrote wins.
		{"spoofed left-most entry ignored", []string{"6.6.6.6, 7.7.7.7, 1.1.1.1, 10.0.0.5"}, 2, "1.1.1.1"},
		{"spoofed second field ignored", []string{"6.6.6.6", "1.1.1.1, 10.0.0.5"}, 2, "1.1.1.1"},
		// Hops beyond the real chain (one proxy, two hops): the client's own entry is read.
		{"hops beyond the chain trust the client", []string{"6.6.6.6, 1.1.1.1"}, 2, "6.6.6.6"},
		// What varies per connection or spelling does not give a new key.
		{"port dropped", []string{"1.1.1.1:4711, 10.0.0.5"}, 2, "1.1.1.1"},
		{"bracketed IPv6 with a port", []string{"[2001:DB8:0::1]:443"}, 1, "2001:db8::1"},
		{"bracketed IPv6", []string{"[2001:db8::1]"}, 1, "2001:db8::1"},
		{"IPv6 canonical", []string{"2001:DB8:0:0::1"}, 1, "2001:db8::1"},
		{"IPv4-mapped as IPv4", []string{"::ffff:1.1.1.1"}, 1, "1.1.1.1"},
		{"not an IP kept as written", []string{"unknown"}, 1, "unknown"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			NewWithT(t).Expect(decide.ClientIP(c.xff, "9.9.9.9", c.hops)).To(Equal(c.want))
		})
	}
}

func TestCeilSecondsAndQuoting(t *testing.T) {
	g := NewWithT(t)
	g.Expect(decide.CeilSeconds(0)).To(Equal(int64(0)))
	g.Expect(decide.CeilSeconds(time.Millisecond)).To(Equal(int64(1)))
	g.Expect(decide.CeilSeconds(time.Second)).To(Equal(int64(1)))
	g.Expect(decide.CeilSeconds(1001 * time.Millisecond)).To(Equal(int64(2)))
	g.Expect(decide.CeilSeconds(-1)).To(Equal(int64(0)))
}

func metaSelector(k, v string) policydoc.Selector {
	return policydoc.Selector{MatchLabels: map[string]string{k: v}}
}

// A policy with rateLimitHeaders: OnRefusal keeps its limits off admitted responses and
// publishes them on the 429.
func TestHeadersOnRefusalOnly(t *testing.T) {
	g := NewWithT(t)
	doc, _, err := policydoc.Build("shop", []policydoc.Policy{{
		Name: "quiet", FailureMode: "Open", HeadersOnRefusal: true,
		Rules: []policydoc.Rule{{Name: "r", Key: []policydoc.KeyPart{{Constant: "all"}}, Algorithm: "FixedWindow",
			Requests: 1, WindowMS: 60000, Mode: "Enforce"}},
	}}, nil)
	g.Expect(err).NotTo(HaveOccurred())
	set, err := ruleset.NewBuilder("").Build(doc, nil)
	g.Expect(err).NotTo(HaveOccurred())
	e := &decide.Engine{Limiter: sidecartest.FakeLimiter{Decide: (&fakeLimiter{}).Allow}}

	d := decideReq(context.Background(), e, set, req("GET", "/", "10.0.0.1:1"))
	g.Expect(d.Allowed).To(BeTrue())
	g.Expect(d.Fields()).To(Equal(decide.Fields{}))

	d = decideReq(context.Background(), e, set, req("GET", "/", "10.0.0.1:1"))
	g.Expect(d.Allowed).To(BeFalse())
	g.Expect(d.Fields().Policy).To(Equal(`"quiet/r";q=1;w=60`))
	g.Expect(d.Fields().RetryAfter).To(Equal("31"))
}

// A request with two fields of a header that a rule it matches keys on has no one key: it is
// refused by name, whichever field an application would read; other repeated headers, and a
// key header of a rule the request does not match, are no reason to refuse.
func TestPlanRefusesRepeatedKeyHeaders(t *testing.T) {
	set := testSet(t, "")
	cases := []struct {
		name string
		req  *decide.Request
		want string // the header refused, "" for none
	}{
		{"one field", req("POST", "/api/x", "10.0.0.1:1", "X-Api-Key", "mine"), ""},
		{"two fields of the key header", req("POST", "/api/x", "10.0.0.1:1", "X-Api-Key", "mine", "X-Api-Key", "pad-1"), "X-Api-Key"},
		{"two equal fields", req("POST", "/api/x", "10.0.0.1:1", "X-Api-Key", "mine", "X-Api-Key", "mine"), "X-Api-Key"},
		{"an empty second field", req("POST", "/api/x", "10.0.0.1:1", "X-Api-Key", "mine", "X-Api-Key", ""), "X-Api-Key"},
		{"a repeated unrelated header", req("POST", "/api/x", "10.0.0.1:1", "X-Api-Key", "mine", "Accept", "a", "Accept", "b"), ""},
		{"no rule keyed on it matches", req("GET", "/api/x", "10.0.0.1:1", "X-Api-Key", "mine", "X-Api-Key", "pad-1"), ""},
		{"no header at all", req("POST", "/api/x", "10.0.0.1:1"), ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			g := NewWithT(t)
			_, err := (&decide.Engine{}).Plan(set, c.req, 1)
			if c.want == "" {
				g.Expect(err).NotTo(HaveOccurred())
				return
			}
			rh, ok := errors.AsType[*decide.RepeatedHeaderError](err)
			g.Expect(ok).To(BeTrue(), "error %v", err)
			g.Expect(rh.Header).To(Equal(c.want))
			g.Expect(err.Error()).To(ContainSubstring(c.want))
		})
	}
	_, err := (&decide.Engine{}).Plan(nil, req("POST", "/api/x", "", "X-Api-Key", "a", "X-Api-Key", "b"), 1)
	NewWithT(t).Expect(err).To(Succeed(), "no policies")
}
