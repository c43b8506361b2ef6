package rls_test

import (
	"context"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	. "github.com/onsi/gomega"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/redline-dev/redline/internal/compiled"
	"github.com/redline-dev/redline/internal/limiter"
	"github.com/redline-dev/redline/internal/sidecar/config"
	"github.com/redline-dev/redline/internal/sidecar/decide"
	"github.com/redline-dev/redline/internal/sidecar/rls"
	"github.com/redline-dev/redline/internal/sidecar/sidecartest"
)

func desc(kv ...string) *rlv3.RateLimitDescriptor {
	d := &rlv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &rlv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

func TestHitFor(t *testing.T) {
	cases := []struct {
		name string
		d    *rlv3.RateLimitDescriptor
		want decide.Hit
		ok   bool
	}{
		{"policy and rule entries", desc("policy", "p", "api_key", "k", "rule", "r", "path", "/x"), decide.Hit{Policy: "p", Rule: "r", Key: []string{"k", "/x"}}, true},
		{"generic key", desc("generic_key", "p/r", "remote_address", "1.2.3.4"), decide.Hit{Policy: "p", Rule: "r", Key: []string{"1.2.3.4"}}, true},
		{"generic key without slash is a key part", desc("generic_key", "x", "policy", "p", "rule", "r"), decide.Hit{Policy: "p", Rule: "r", Key: []string{"x"}}, true},
		{"no rule", desc("remote_address", "1.2.3.4"), decide.Hit{}, false},
		{"policy only", desc("policy", "p"), decide.Hit{}, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			g := NewWithT(t)
			h, ok := rls.HitFor(c.d)
			g.Expect(ok).To(Equal(c.ok))
			if ok {
				g.Expect(h).To(Equal(c.want))
			}
		})
	}
}

type countingLimiter struct{ costs []int64 }

func (c *countingLimiter) Allow(_ context.Context, _ string, l limiter.Limit, cost int64) (limiter.Result, error) {
	c.costs = append(c.costs, cost)
	r := limiter.Result{Allowed: cost <= l.Requests, Remaining: max(l.Requests-cost, 0), ResetAfter: l.Window, Source: limiter.SourceRedis}
	if !r.Allowed {
		r.OverLimit, r.RetryAfter = true, 1500*time.Millisecond
	}
	return r, nil
}

func TestShouldRateLimit(t *testing.T) {
	g := NewWithT(t)
	doc, err := compiled.Parse(sidecartest.Document("ns", "p", "r", "web", 10, 2*time.Hour, "x-key", "Open"))
	g.Expect(err).NotTo(HaveOccurred())
	set, err := config.NewBuilder("").Build(doc, map[string]string{"app": "web"})
	g.Expect(err).NotTo(HaveOccurred())
	store := &config.Store{}
	srv := &rls.Server{Engine: &decide.Engine{Limiter: &countingLimiter{}}, Store: store}
	_, err = srv.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Descriptors: []*rlv3.RateLimitDescriptor{desc("generic_key", "p/r")}})
	g.Expect(err).To(MatchError(ContainSubstring("no policies loaded")))
	store.Swap(set)

	lim := &countingLimiter{}
	srv.Engine.Limiter = lim
	over := desc("generic_key", "p/r", "k", "a")
	over.HitsAddend = wrapperspb.UInt64(11)
	resp, err := srv.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{
		HitsAddend:  3,
		Descriptors: []*rlv3.RateLimitDescriptor{desc("generic_key", "p/r", "k", "a"), over, desc("other", "x")},
	})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(lim.costs).To(Equal([]int64{3, 11}), "request hits_addend, overridden per descriptor")
	g.Expect(resp.OverallCode).To(Equal(rlsv3.RateLimitResponse_OVER_LIMIT))
	g.Expect(resp.Statuses[0].Code).To(Equal(rlsv3.RateLimitResponse_OK))
	g.Expect(resp.Statuses[0].LimitRemaining).To(Equal(uint32(7)))
	g.Expect(resp.Statuses[0].CurrentLimit.Unit).To(Equal(rlsv3.RateLimitResponse_RateLimit_HOUR))
	g.Expect(resp.Statuses[0].CurrentLimit.UnitMultiplier.GetValue()).To(Equal(uint32(2)))
	g.Expect(resp.Statuses[1].Code).To(Equal(rlsv3.RateLimitResponse_OVER_LIMIT))
	g.Expect(resp.Statuses[2].Code).To(Equal(rlsv3.RateLimitResponse_OK))
	g.Expect(resp.Statuses[2].CurrentLimit).To(BeNil())
	hdr := map[string]string{}
	for _, h := range resp.ResponseHeadersToAdd {
		hdr[h.Key] = h.Value
	}
	g.Expect(hdr).To(Equal(map[string]string{
		"RateLimit-Policy": `"p/r";q=10;w=7200, "p/r";q=10;w=7200`,
		"RateLimit":        `"p/r";r=7;t=7200, "p/r";r=0;t=7200`,
		"Retry-After":      "2",
	}))
}
