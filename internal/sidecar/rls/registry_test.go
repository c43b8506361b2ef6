package rls_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	. "github.com/onsi/gomega"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/redline-dev/redline/internal/policydoc"
	"github.com/redline-dev/redline/internal/sidecar/decide"
	"github.com/redline-dev/redline/internal/sidecar/rls"
	"github.com/redline-dev/redline/internal/testutil/sidecartest"
)

// stream starts (used 0) or ends (used > 0) a stream of rule for user, and returns the answer.
func stream(t *testing.T, s *rls.Server, rule, user string, used uint64) *rlsv3.RateLimitResponse {
	t.Helper()
	d := desc("policy", "llm", "rule", rule, "user", user)
	if used > 0 {
		d.HitsAddend = wrapperspb.UInt64(used)
	}
	resp, err := s.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*rlv3.RateLimitDescriptor{d}})
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// admitted starts n streams of rule for user, none done, and counts those admitted.
func admitted(t *testing.T, s *rls.Server, rule, user string, n int) int {
	t.Helper()
	ok := 0
	for range n {
		if stream(t, s, rule, user, 0).OverallCode == rlsv3.RateLimitResponse_OK {
			ok++
		}
	}
	return ok
}

func retryAfter(resp *rlsv3.RateLimitResponse) string {
	for _, h := range resp.ResponseHeadersToAdd {
		if h.Key == "Retry-After" {
			return h.Value
		}
	}
	return ""
}

// Envoy's apply_on_stream_done keeps a hold per stream until it is done. No key can fill that
// registry for others, and a stream whose hold finds no room is refused, its hold given back:
// a victim's open streams stay at its limit however full the registry is.
func TestRegistryFullNeverAdmitsWithoutAHold(t *testing.T) {
	g := NewWithT(t)
	// "tokens": 1000 an hour per user, 100 held per stream: 10 streams. "bulk": a budget so
	// large that only the registry bounds a user's streams.
	// Hour-long windows: the counts do not start again at a minute's turn during the test.
	tokens := sidecartest.BudgetRule("tokens", "x-user", "FixedWindow", 1_000, 100, 1, policydoc.OnErrorUsed)
	bulk := sidecartest.BudgetRule("bulk", "x-user", "FixedWindow", 1_000_000, 1, 1, policydoc.OnErrorUsed)
	tokens.WindowMS, bulk.WindowMS = time.Hour.Milliseconds(), time.Hour.Milliseconds()
	doc := sidecartest.DocumentRules("ns", "llm", "web", tokens, bulk)
	s := &rls.Server{Engine: &decide.Engine{Limiter: sidecartest.Limiter(t)}, Store: sidecartest.StoreOf(t, doc),
		Holds: &decide.Registry{Max: 64, Share: 16}}

	// One user alone takes half of the registry, then is refused by its share, with a
	// Retry-After and the descriptor's own OVER_LIMIT.
	g.Expect(admitted(t, s, "bulk", "busy", 32)).To(Equal(32))
	resp := stream(t, s, "bulk", "busy", 0)
	g.Expect(resp.OverallCode).To(Equal(rlsv3.RateLimitResponse_OVER_LIMIT))
	g.Expect(resp.Statuses[0].Code).To(Equal(rlsv3.RateLimitResponse_OVER_LIMIT))
	// The hold would have waited to its deadline: the rule's minute.
	g.Expect(retryAfter(resp)).To(Equal("60"))

	// The victim gets its limit, 10 of 100, not fewer and not more.
	g.Expect(admitted(t, s, "tokens", "victim", 100)).To(Equal(10))

	// Other users fill the rest: 32 + 10 + 22 = 64.
	for i := range 22 {
		g.Expect(admitted(t, s, "bulk", fmt.Sprintf("filler-%d", i), 1)).To(Equal(1))
	}
	g.Expect(s.Holds.Open()).To(Equal(64))
	// Full: a second victim is refused every stream rather than admitted without a hold.
	g.Expect(admitted(t, s, "tokens", "victim-2", 100)).To(BeZero())
	g.Expect(s.Holds.Open()).To(Equal(64))

	// Room again once streams are done: the refused streams' holds went back, so the second
	// victim has its whole limit of 10.
	for range 32 {
		g.Expect(stream(t, s, "bulk", "busy", 5).OverallCode).To(Equal(rlsv3.RateLimitResponse_OK))
	}
	g.Expect(admitted(t, s, "tokens", "victim-2", 100)).To(Equal(10))
}
