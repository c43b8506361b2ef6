package decide_test

import (
	"context"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redline-dev/redline/internal/policydoc"
	"github.com/redline-dev/redline/internal/sidecar/decide"
	"github.com/redline-dev/redline/internal/sidecar/ruleset"
	"github.com/redline-dev/redline/internal/testutil/sidecartest"
)

// budgetSet is one policy with a token budget of requests per minute keyed on X-Key
// (algorithm alg), and a plain rule of plain requests per minute on the same requests.
func budgetSet(t *testing.T, alg string, requests, plain int64) *ruleset.Set {
	t.Helper()
	return buildSet(t, "tok", []policydoc.Policy{{
		Name: "llm", Generation: 1, FailureMode: "Closed",
		Rules: []policydoc.Rule{
			sidecartest.BudgetRule("tokens", "x-key", alg, requests, 100, 10, policydoc.OnErrorUsed),
			{Name: "calls", Key: []policydoc.KeyPart{{Header: "x-key"}}, Algorithm: alg, Requests: plain, WindowMS: time.Minute.Milliseconds(), Mode: "Enforce"},
		},
	}})
}

func budgetReq(key string) *decide.Request {
	return &decide.Request{Method: "POST", Path: "/v1/chat/completions", Header: http.Header{"X-Key": {key}}, RemoteAddr: "10.0.0.1:1"}
}

// Concurrent requests each hold what they may spend before they are sent; what they then use
// settles. However many run at once, what is admitted never passes the budget: every admitted
// request's usage (up to its hold) is counted before the next is decided.
func TestReserveNeverAdmitsPastTheBudget(t *testing.T) {
	for _, alg := range []string{"FixedWindow", "SlidingWindowCounter", "TokenBucket"} {
		t.Run(alg, func(t *testing.T) {
			lim := sidecartest.Limiter(t)
			set := budgetSet(t, alg, 5_000, 1_000_000)
			e := &decide.Engine{Limiter: lim}
			var spent, admitted, refused atomic.Int64
			var wg sync.WaitGroup
			start := time.Now()
			for w := range 32 {
				wg.Go(func() {
					for i := range 20 {
						d, hs, err := reserveReq(context.Background(), e, set, budgetReq("k"), decide.Need{Sized: true, Prompt: 50, Output: 200})
						if err != nil {
							t.Error(err)
							return
						}
						if !d.Allowed {
							refused.Add(1)
							if hs != nil {
								t.Error("a refused request kept holds")
							}
							continue
						}
						admitted.Add(1)
						units, capped := hs.Afford()
						if !capped || units < 60 || units > 250 {
							t.Errorf("afford %d (capped %v), want 60-250", units, capped)
						}
						// Use some of what the hold affords, as an upstream held to the cap would.
						used := 50 + int64((w*7+i*13)%200)
						used = min(used, units)
						spent.Add(used)
						if _, err := hs.Settle(context.Background(), used, true, false); err != nil {
							t.Error(err)
						}
					}
				})
			}
			wg.Wait()
			budget := int64(5_000)
			if alg == "TokenBucket" {
				// The bucket refills as the run goes: 5000 a minute.
				budget += 5_000 * int64(time.Since(start)+time.Second) / int64(time.Minute)
			}
			if spent.Load() > budget {
				t.Fatalf("%s: %d units spent by %d admitted requests: past the budget of %d", alg, spent.Load(), admitted.Load(), budget)
			}
			if refused.Load() == 0 {
				t.Fatalf("%s: 640 requests of up to 250 units each against 5000: none refused", alg)
			}
			if spent.Load() < 2_500 {
				t.Fatalf("%s: only %d of 5000 spent by a demand of about 96000", alg, spent.Load())
			}
		})
	}
}

// The unused part of a hold goes back at its settle; a request refused by another rule keeps
// no hold; a Shadow-free budget caps what a request may use at its hold.
func TestReserveSettleGivesBackAndRefusalHoldsNothing(t *testing.T) {
	lim := sidecartest.Limiter(t)
	set := budgetSet(t, "FixedWindow", 1_000, 2)
	e := &decide.Engine{Limiter: lim}
	ctx := context.Background()

	d, hs, err := reserveReq(ctx, e, set, budgetReq("a"), decide.Need{Sized: true, Prompt: 100})
	if err != nil || !d.Allowed {
		t.Fatalf("first request: allowed %v, err %v", d.Allowed, err)
	}
	if units, _ := hs.Afford(); units != 1_000 {
		t.Fatalf("a request without an output cap holds %d, want all the budget (1000)", units)
	}
	s, err := hs.Settle(ctx, 300, true, false)
	if err != nil || s.Returned != 700 || s.Debt != 0 {
		t.Fatalf("settle: %+v, %v: want 700 returned", s, err)
	}
	if s2, _ := hs.Settle(ctx, 1, true, false); s2 != s {
		t.Fatalf("a second settle did something: %+v", s2)
	}
	d, hs, _ = reserveReq(ctx, e, set, budgetReq("a"), decide.Need{Sized: true, Prompt: 100, Output: 600})
	if !d.Allowed {
		t.Fatal("700 units were left for a request holding 700")
	}
	if units, _ := hs.Afford(); units != 700 {
		t.Fatalf("afford %d, want 700", units)
	}
	// The plain rule allows 2 requests: a third is refused, and its budget hold goes back.
	if _, err := hs.Settle(ctx, 100, true, false); err != nil {
		t.Fatal(err)
	}
	d, hs, _ = reserveReq(ctx, e, set, budgetReq("a"), decide.Need{Sized: true, Prompt: 10, Output: 10})
	if d.Allowed || hs != nil || d.Refused.Rule.Name != "calls" {
		t.Fatalf("third request: allowed %v, holds %v: want refused by calls, no hold", d.Allowed, hs)
	}
	// Unsized: the default hold.
	d, hs, _ = reserveReq(ctx, e, set, budgetReq("b"), decide.Need{})
	if units, _ := hs.Afford(); !d.Allowed || units != 100 {
		t.Fatalf("an unsized request: allowed %v, afford %d, want the default hold of 100", d.Allowed, units)
	}
	// More than it held: debt, all of it, counted past the limit.
	s, _ = hs.Settle(ctx, 5_000, true, false)
	if s.Debt != 4_900 {
		t.Fatalf("settle of 5000 against a hold of 100: %+v, want a debt of 4900 (all it used past the hold)", s)
	}
	d, _, _ = reserveReq(ctx, e, set, budgetReq("b"), decide.Need{Sized: true, Prompt: 1, Output: 1})
	if d.Allowed {
		t.Fatal("a key in debt admitted a request")
	}
}
