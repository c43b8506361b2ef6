package sidecar_test

import (
	"fmt"
	"math"
	"strconv"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	. "github.com/onsi/gomega"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/redline-dev/redline/internal/policydoc"
	"github.com/redline-dev/redline/internal/sidecar/decide"
	"github.com/redline-dev/redline/internal/testutil/redistest"
	"github.com/redline-dev/redline/internal/testutil/sidecartest"
)

// A token budget of 2,000 a day in Berlin through Envoy's rate limit service, on the day
// Berlin's clocks go forward (Redis's clock moved there, the sidecar's years away): each
// request's start holds 100 and its stream-done call settles 150, until the day's budget is
// spent. Every start's duration_until_reset and RateLimit fields give the 23-hour day and the
// time to Berlin's midnight on Redis's clock, and the refusal's Retry-After at most that.
func TestCalendarTokenBudgetThroughEnvoy(t *testing.T) {
	g := NewWithT(t)
	redisAt, _ := time.Parse(time.RFC3339, "2028-03-26T12:00:00+02:00")
	end, _ := time.Parse(time.RFC3339, "2028-03-27T00:00:00+02:00")
	rs, err := redistest.StartAt(redisAt)
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { _ = rs.Close() })
	const budget, used = 2000, 150
	r := sidecartest.BudgetRule("tokens", "X-API-Key", "FixedWindow", budget, 100, 1, policydoc.OnErrorUsed)
	r.WindowMS, r.Calendar = 26*3600*1000, &policydoc.Calendar{Unit: "Day", Zone: "Europe/Berlin"}
	e := newEnv(t, "app")
	e.write(t, sidecartest.DocumentRules(e.namespace, "llm", "app", r))
	s := start(t, "pod-0", e, rs.URL(), "127.0.0.1:1", true)
	c := rlsClient(t, s.grpc)
	rc := rs.Client("")
	t.Cleanup(func() { _ = rc.Close() })
	redisNow := func() time.Time {
		now, err := rc.Time(t.Context()).Result()
		g.Expect(err).NotTo(HaveOccurred())
		return now
	}
	key := fmt.Sprint("rls-cal-", time.Now().UnixNano())
	call := func(addend *wrapperspb.UInt64Value) *rlsv3.RateLimitResponse {
		resp, err := c.ShouldRateLimit(ctxTimeout(t, 30*time.Second), &rlsv3.RateLimitRequest{Domain: "redline",
			Descriptors: []*rlv3.RateLimitDescriptor{{Entries: []*rlv3.RateLimitDescriptor_Entry{
				{Key: "policy", Value: "llm"}, {Key: "rule", Value: "tokens"}, {Key: "api_key", Value: key}}, HitsAddend: addend}}})
		g.Expect(err).NotTo(HaveOccurred())
		return resp
	}
	headers := func(resp *rlsv3.RateLimitResponse) map[string]string {
		h := map[string]string{}
		for _, x := range resp.ResponseHeadersToAdd {
			h[x.Key] = x.Value
		}
		return h
	}

	admitted, refused := 0, false
	for i := 0; i < 30 && !refused; i++ {
		before := redisNow()
		resp := call(nil)
		after := redisNow()
		lo, hi := int64(end.Sub(after).Seconds()), int64(math.Ceil(end.Sub(before).Seconds()))
		st := resp.Statuses[0]
		g.Expect(st.CurrentLimit.Unit).To(Equal(rlsv3.RateLimitResponse_RateLimit_DAY), "request %d", i)
		g.Expect(st.CurrentLimit.RequestsPerUnit).To(BeEquivalentTo(budget))
		g.Expect(int64(math.Ceil(st.DurationUntilReset.AsDuration().Seconds()))).To(And(BeNumerically(">=", lo), BeNumerically("<=", hi)),
			"request %d: duration_until_reset, to Berlin's midnight", i)
		h := headers(resp)
		g.Expect(h[decide.HeaderPolicy]).To(Equal(`"llm/tokens";q=2000;w=82800`), "request %d", i)
		var left, secs int64
		_, err := fmt.Sscanf(h[decide.HeaderRateLimit], `"llm/tokens";r=%d;t=%d`, &left, &secs)
		g.Expect(err).NotTo(HaveOccurred(), h[decide.HeaderRateLimit])
		g.Expect(secs).To(And(BeNumerically(">=", lo), BeNumerically("<=", hi)), "request %d: RateLimit t, to Berlin's midnight", i)
		switch resp.OverallCode {
		case rlsv3.RateLimitResponse_OK:
			admitted++
			done := call(wrapperspb.UInt64(used))
			g.Expect(done.OverallCode).To(Equal(rlsv3.RateLimitResponse_OK), "a stream done is never refused")
			g.Expect(done.Statuses[0].DurationUntilReset).To(BeNil(), "a stream-done answer claims no time to the period's end (never the rule's 26-hour bound)")
		default:
			refused = true
			ra, err := strconv.ParseInt(h[decide.HeaderRetryAfter], 10, 64)
			g.Expect(err).NotTo(HaveOccurred(), "the refusal's Retry-After")
			g.Expect(ra).To(And(BeNumerically(">=", 1), BeNumerically("<=", hi)))
			// Envoy's stream-done call of the refused request reports no usage.
			g.Expect(call(wrapperspb.UInt64(0)).OverallCode).To(Equal(rlsv3.RateLimitResponse_OK))
		}
	}
	t.Logf("Berlin's 23-hour day, a budget of %d tokens through Envoy's service: %d requests admitted using %d each, then refused", budget, admitted, used)
	g.Expect(refused).To(BeTrue(), "the day's budget ran out")
	// A start is admitted while the day has room for its whole hold (Envoy cannot cap the
	// output to less), and refused once it has not.
	const hold = 100
	g.Expect((admitted-1)*used+hold).To(BeNumerically("<=", budget), "admitted only while a hold fitted")
	g.Expect(admitted*used+hold).To(BeNumerically(">", budget), "refused only once a hold no longer fitted")
}
