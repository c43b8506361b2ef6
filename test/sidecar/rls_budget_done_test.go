package sidecar_test

import (
	"fmt"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	. "github.com/onsi/gomega"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/redline-dev/redline/internal/policydoc"
	"github.com/redline-dev/redline/internal/testutil/sidecartest"
)

// Envoy's apply_on_stream_done through the built sidecar, for a token budget of 1,000 a day
// holding 100 a request: a stream-done call reporting 0 gives its request's hold back (it
// starts nothing), and a refused request's stream-done call, which reports 0 too, ends no
// running request's hold: while ten requests hold the whole budget, a new one stays refused.
func TestEnvoyTokenBudgetStreamDoneOfZero(t *testing.T) {
	awayFromDayEnd(t)
	g := NewWithT(t)
	r := sidecartest.BudgetRule("tokens", "X-API-Key", "FixedWindow", 1000, 100, 1, policydoc.OnErrorUsed)
	r.WindowMS = unsizedWindow.Milliseconds()
	e := newEnv(t, "app")
	e.write(t, sidecartest.DocumentRules(e.namespace, "llm", "app", r))
	s := start(t, "pod-0", e, shared.URL(), "127.0.0.1:1", true)
	c := rlsClient(t, s.grpc)
	key := fmt.Sprint("rls-done-", time.Now().UnixNano())
	call := func(addend *wrapperspb.UInt64Value) rlsv3.RateLimitResponse_Code {
		resp, err := c.ShouldRateLimit(ctxTimeout(t, 30*time.Second), &rlsv3.RateLimitRequest{Domain: "redline",
			Descriptors: []*rlv3.RateLimitDescriptor{{Entries: []*rlv3.RateLimitDescriptor_Entry{
				{Key: "policy", Value: "llm"}, {Key: "rule", Value: "tokens"}, {Key: "api_key", Value: key}}, HitsAddend: addend}}})
		g.Expect(err).NotTo(HaveOccurred())
		return resp.OverallCode
	}
	ok, over := rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT

	g.Expect(call(nil)).To(Equal(ok), "a first request")
	g.Expect(call(wrapperspb.UInt64(0))).To(Equal(ok), "its stream done with no usage")
	for i := range 10 {
		g.Expect(call(nil)).To(Equal(ok), "request %d of ten holding the whole budget: the first gave its hold back", i)
	}
	g.Expect(call(nil)).To(Equal(over), "an eleventh while ten hold the budget")
	g.Expect(call(wrapperspb.UInt64(0))).To(Equal(ok), "the refused request's stream-done call")
	g.Expect(call(nil)).To(Equal(over), "a request while the ten still hold the budget: the refusal's call ended none of their holds")
	g.Expect(call(wrapperspb.UInt64(0))).To(Equal(ok), "that refusal's stream-done call")
	for i := range 10 {
		g.Expect(call(wrapperspb.UInt64(10))).To(Equal(ok), "stream %d done", i)
	}
	for i := range 9 {
		g.Expect(call(nil)).To(Equal(ok), "request %d after the ten used 100", i)
	}
	g.Expect(call(nil)).To(Equal(over), "past 100 used and 900 held")
}
