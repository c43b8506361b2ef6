package rls_test

import (
	"context"
	"testing"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/redline-dev/redline/internal/policydoc"
	"github.com/redline-dev/redline/internal/sidecar/decide"
	"github.com/redline-dev/redline/internal/sidecar/rls"
	"github.com/redline-dev/redline/internal/sidecar/ruleset"
	"github.com/redline-dev/redline/internal/testutil/sidecartest"
)

// budgetServer is the service with a real limiter on a real Redis, for a policy "llm" with a
// token budget "tokens" of 1000 a minute (defaultHold 100) keyed on the descriptor's values.
func budgetServer(t *testing.T) *rls.Server {
	t.Helper()
	doc := sidecartest.DocumentRules("ns", "llm", "web", sidecartest.BudgetRule("tokens", "x-user", "FixedWindow", 1_000, 100, 1, policydoc.OnErrorUsed))
	return &rls.Server{Engine: &decide.Engine{Limiter: sidecartest.Limiter(t)}, Store: sidecartest.StoreOf(t, doc), Holds: &decide.Registry{}}
}

// call sends one descriptor of user's budget: at the request's start (used 0: no hits_addend)
// or when its stream is done (hits_addend = used).
func call(t *testing.T, s *rls.Server, user string, used uint64) rlsv3.RateLimitResponse_Code {
	t.Helper()
	d := desc("policy", "llm", "rule", "tokens", "user", user)
	if used > 0 {
		d.HitsAddend = wrapperspb.UInt64(used)
	}
	resp, err := s.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*rlv3.RateLimitDescriptor{d}})
	if err != nil {
		t.Fatal(err)
	}
	return resp.OverallCode
}

// Envoy's apply_on_stream_done: a request's descriptor holds the default, its stream's usage
// settles the oldest hold of the key, and a usage without a hold here is charged as it is.
func TestStreamDoneSettlesTheOldestHold(t *testing.T) {
	s := budgetServer(t)
	ok, over := rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT
	for i := range 10 {
		if got := call(t, s, "a", 0); got != ok {
			t.Fatalf("request %d of 10 holding 100 of 1000: %v", i, got)
		}
	}
	if got := call(t, s, "a", 0); got != over {
		t.Fatalf("an eleventh request while ten hold the whole budget: %v, want OVER_LIMIT", got)
	}
	for i := range 10 {
		if got := call(t, s, "a", 10); got != ok {
			t.Fatalf("stream %d done: %v; a stream that is done is never refused", i, got)
		}
	}
	if n := s.Holds.Len(); n != 0 {
		t.Fatalf("%d holds open after every stream was done", n)
	}
	// 100 were used: nine more holds of 100 fit, a tenth does not.
	for i := range 9 {
		if got := call(t, s, "a", 0); got != ok {
			t.Fatalf("request %d after the settles: %v; the unused holds did not go back", i, got)
		}
	}
	if got := call(t, s, "a", 0); got != over {
		t.Fatalf("request past 100 used and 900 held: %v, want OVER_LIMIT", got)
	}

	// A usage reported where nothing was held (its request went to another replica) counts.
	if got := call(t, s, "b", 950); got != ok {
		t.Fatalf("a usage without a hold: %v", got)
	}
	if got := call(t, s, "b", 0); got != over {
		t.Fatalf("a request after 950 of 1000 were charged, holding 100: %v, want OVER_LIMIT", got)
	}
}

// TestDescriptorUnderRefuseIsOverLimit: Envoy's filter never sends a request's size, so a
// budget that refuses what it cannot size answers its descriptor OVER_LIMIT, holding nothing
// and counting the refusal; a stream's done descriptor still settles (charges) as before.
func TestDescriptorUnderRefuseIsOverLimit(t *testing.T) {
	rule := sidecartest.BudgetRule("tokens", "x-user", "FixedWindow", 1_000, 100, 1, policydoc.OnErrorUsed)
	rule.Cost.UnsizedBody = policydoc.UnsizedRefuse
	doc := sidecartest.DocumentRules("ns", "llm", "web", rule)
	var reasons []string
	s := &rls.Server{Engine: &decide.Engine{Limiter: sidecartest.Limiter(t)}, Store: sidecartest.StoreOf(t, doc), Holds: &decide.Registry{},
		OnUnsized: func(r *ruleset.Rule, reason string) { reasons = append(reasons, r.Name+" "+reason) }}
	if got := call(t, s, "a", 0); got != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("a descriptor without a size under Refuse: %v, want OVER_LIMIT", got)
	}
	if n := s.Holds.Len(); n != 0 {
		t.Fatalf("%d holds open after a refusal", n)
	}
	if len(reasons) != 1 || reasons[0] != "tokens "+rls.ReasonDescriptorWithoutSize {
		t.Fatalf("refusals counted: %v", reasons)
	}
	if got := call(t, s, "a", 10); got != rlsv3.RateLimitResponse_OK {
		t.Fatalf("a stream done: %v; it is never refused", got)
	}
}

// done sends the stream-done descriptor of user's budget as Envoy does for a rate_limits
// entry with apply_on_stream_done and a hits_addend: set, even when the usage is 0.
func done(t *testing.T, s *rls.Server, user string, used uint64) rlsv3.RateLimitResponse_Code {
	t.Helper()
	d := desc("policy", "llm", "rule", "tokens", "user", user)
	d.HitsAddend = wrapperspb.UInt64(used)
	resp, err := s.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*rlv3.RateLimitDescriptor{d}})
	if err != nil {
		t.Fatal(err)
	}
	return resp.OverallCode
}

// A stream-done call reporting no usage settles its request's hold with 0 (it is not a new
// request's start), and a refused request's stream-done call, which reports none, ends no
// running request's hold: the refusal owes it.
func TestZeroUsageStreamDone(t *testing.T) {
	s := budgetServer(t)
	ok, over := rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT
	if got := call(t, s, "a", 0); got != ok {
		t.Fatalf("a first request: %v", got)
	}
	if got := done(t, s, "a", 0); got != ok {
		t.Fatalf("its stream done with no usage: %v", got)
	}
	if n := s.Holds.Len(); n != 0 {
		t.Fatalf("%d holds open after the only request's stream was done with no usage, want 0", n)
	}

	for i := range 10 {
		if got := call(t, s, "a", 0); got != ok {
			t.Fatalf("request %d of 10 holding 100 of 1000 (nothing used before): %v", i, got)
		}
	}
	for i := range 3 {
		if got := call(t, s, "a", 0); got != over {
			t.Fatalf("refusal %d while ten hold the whole budget: %v, want OVER_LIMIT", i, got)
		}
	}
	if n := s.Holds.Owed(); n != 3 {
		t.Fatalf("%d refusals owed, want 3", n)
	}
	for i := range 3 {
		if got := done(t, s, "a", 0); got != ok {
			t.Fatalf("refusal %d's stream done: %v", i, got)
		}
	}
	if n, o := s.Holds.Len(), s.Holds.Owed(); n != 10 || o != 0 {
		t.Fatalf("after the refusals' stream-done calls: %d holds open, %d owed; want the ten running requests' holds and nothing owed", n, o)
	}
	if got := call(t, s, "a", 0); got != over {
		t.Fatalf("a request while the ten running requests still hold the budget: %v, want OVER_LIMIT", got)
	}
	for i := range 10 { // the refusal just made is paid back first: it reports no usage
		if got := done(t, s, "a", 10); got != ok {
			t.Fatalf("stream %d done: %v", i, got)
		}
	}
	if n := s.Holds.Len(); n != 0 {
		t.Fatalf("%d holds open after every running stream was done with its usage", n)
	}
	if n := s.Holds.Owed(); n != 1 {
		t.Fatalf("%d refusals owed: a usage above 0 is never a refusal's, want the last refusal's still owed", n)
	}
}
