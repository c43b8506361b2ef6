package sidecar_test

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	. "github.com/onsi/gomega"

	"github.com/redline-dev/redline/internal/policydoc"
	"github.com/redline-dev/redline/internal/sidecar/decide"
	"github.com/redline-dev/redline/internal/testutil/sidecartest"
)

// registryFlags are more sidecar flags for TestVictimKeepsItsHoldsUnderManyKeys:
// -registry-flags=--memory-budget=-1 is the sidecar whose registries are bounded by a count of
// 16,384 open holds instead of the memory budget (the test then fails on the victim's count).
var registryFlags = flag.String("registry-flags", "", "more sidecar flags for the registry test, space-separated")

// registryBudget is the memory budget of the registry test: room for 21,845 holds.
const registryBudget = 32 << 20

// The built sidecar's hold registries draw from its one memory budget, with a share per key
// under pressure. Through Envoy's rate limit service: 8 keys starting 16,384 streams, then
// 1,700 keys of 10 streams each (17,000 open holds, past the 16,384 that once bounded the
// registry and left the victim none of its 10), leave a victim key its 10 of 100; through
// /v1/check, a reserve of another victim still finds room. Once more keys fill the budget,
// both faces refuse every key rather than admit without a hold: OVER_LIMIT with Retry-After on
// the rate limit service, 503 with Retry-After on /v1/check, each counted.
func TestVictimKeepsItsHoldsUnderManyKeys(t *testing.T) {
	g := NewWithT(t)
	up := newUpstream(t)
	e := newEnv(t, "web")
	budget := func(name string, requests, hold int64) policydoc.Rule {
		r := sidecartest.BudgetRule(name, "x-user", "FixedWindow", requests, hold, 1, policydoc.OnErrorUsed)
		r.WindowMS = time.Hour.Milliseconds() // no window turns during the test
		return r
	}
	e.write(t, sidecartest.DocumentRules(e.namespace, "llm", "web", budget("tokens", 10_000, 1_000), budget("bulk", 100_000_000, 1)))
	extra := []string{fmt.Sprintf("--memory-budget=%d", registryBudget)}
	if *registryFlags != "" {
		extra = strings.Fields(*registryFlags)
	}
	s := start(t, "registry", e, shared.URL(), up.addr(), true, extra...)
	rl := rlsClient(t, s.grpc)
	var retryAfter atomic.Value
	startStream := func(rule, user string) rlsv3.RateLimitResponse_Code {
		req := rlsDescriptor(user, nil)
		req.Descriptors[0].Entries[0].Value, req.Descriptors[0].Entries[1].Value = "llm", rule
		resp, err := rl.ShouldRateLimit(context.Background(), req)
		g.Expect(err).NotTo(HaveOccurred())
		for _, h := range resp.ResponseHeadersToAdd {
			if h.Key == "Retry-After" {
				retryAfter.Store(h.Value)
			}
		}
		return resp.OverallCode
	}
	streams := func(user string) int {
		ok := 0
		for range 100 {
			if startStream("tokens", user) == rlsv3.RateLimitResponse_OK {
				ok++
			}
		}
		return ok
	}
	reserve := func(user string) (int, string, string) {
		resp, err := http.Post(s.check+"/v1/check", "application/json",
			strings.NewReader(`{"policy":"llm","rule":"tokens","key":["`+user+`"],"reserve":{}}`))
		g.Expect(err).NotTo(HaveOccurred())
		body, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		return resp.StatusCode, resp.Header.Get("Retry-After"), string(body)
	}
	memoryRefusals := func(face string) float64 {
		return s.metric(t, `redline_sidecar_hold_registry_refusals_total{face="`+face+`",reason="memory"}`)
	}

	// A few keys: 8 keys of the large budget start 16,384 streams between them; each holds at
	// most 64 at once (the limiter's bound of open holds per key, counted in Redis).
	var busy atomic.Int64
	parallel(16_384, 16, func(i int) {
		if startStream("bulk", fmt.Sprintf("busy-%d", i%8)) == rlsv3.RateLimitResponse_OK {
			busy.Add(1)
		}
	})
	g.Expect(busy.Load()).To(Equal(int64(8*64)), "each busy key holds its 64 open holds, no more")
	g.Expect(streams("victim-1")).To(Equal(10))

	// Many keys: 1,700 keys start 10 streams each, all of them admitted and held.
	var filled atomic.Int64
	parallel(17_000, 16, func(i int) {
		if startStream("tokens", fmt.Sprintf("filler-%d", i%1_700)) == rlsv3.RateLimitResponse_OK {
			filled.Add(1)
		}
	})
	g.Expect(filled.Load()).To(Equal(int64(17_000)))
	g.Expect(streams("victim-2")).To(Equal(10), "the victim gets its limit, not fewer and not more")
	for i := range 10 {
		code, _, body := reserve("victim-3")
		g.Expect(code).To(Equal(http.StatusOK), "reserve %d on /v1/check: %s", i, body)
	}
	g.Expect(memoryRefusals("rls")).To(BeZero())
	open := 8*64 + 17_000 + 3*10 // and the three victims
	// Every refused start owes its stream-done call, which this Envoy never makes: the busy
	// keys' refusals and the two victims' on the rate limit service are remembered, each
	// drawing DebtBytes.
	owed := 16_384 - 8*64 + 2*90
	g.Expect(s.metric(t, "redline_sidecar_memory_budget_in_use_bytes")).To(BeNumerically("==", open*decide.HoldBytes+owed*decide.DebtBytes))

	// More keys than the budget has room for: 5,000 more streams, past its 21,845 holds.
	parallel(5_000, 16, func(i int) { startStream("tokens", fmt.Sprintf("more-%d", i%500)) })
	g.Expect(memoryRefusals("rls")).To(BeNumerically(">", 0))
	retryAfter.Store("")
	g.Expect(streams("victim-4")).To(BeZero(), "no stream admitted without a hold")
	g.Expect(strconv.Atoi(retryAfter.Load().(string))).To(BeNumerically(">", 0), "OVER_LIMIT says when to retry")
	code, retry, body := reserve("victim-5")
	g.Expect(code).To(Equal(http.StatusServiceUnavailable), body)
	g.Expect(body).To(ContainSubstring("memory budget"))
	g.Expect(strconv.Atoi(retry)).To(BeNumerically(">", 0))
	g.Expect(memoryRefusals("check")).To(BeNumerically("==", 1))
	g.Expect(s.metric(t, "redline_sidecar_memory_budget_refusals_total")).To(BeNumerically("==", memoryRefusals("rls")+1),
		"every refusal for memory counted once")
	g.Expect(s.metric(t, "redline_sidecar_memory_budget_in_use_bytes")).To(BeNumerically("<=", registryBudget))
}
