package proxy_test

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/redline-dev/redline/internal/limiter"
	"github.com/redline-dev/redline/internal/policydoc"
	"github.com/redline-dev/redline/internal/sidecar/decide"
	"github.com/redline-dev/redline/internal/sidecar/proxy"
	"github.com/redline-dev/redline/internal/sidecar/ruleset"
	"github.com/redline-dev/redline/internal/testutil/fakemodel"
	"github.com/redline-dev/redline/internal/testutil/sidecartest"
	"github.com/redline-dev/redline/internal/tokens"
)

const budget = 1_000

// budgetFront is a sidecar proxy in front of a fake model API, enforcing a token budget of
// 1000 a minute per X-Key (FixedWindow, defaultHold 100, minOutput 10, onError as given) with
// a real limiter on a real Redis.
func budgetFront(t *testing.T, cfg fakemodel.Config, onError string) (*fakemodel.Server, *front) {
	t.Helper()
	model := fakemodel.New(cfg)
	up := httptest.NewServer(model)
	t.Cleanup(up.Close)
	return model, budgetProxy(t, up.Listener.Addr().String(), onError)
}

// front is a proxy under test and the settles it made.
type front struct {
	URL     string
	settles chan limiter.Settled
}

// settled waits for the next settle, which runs beside the response's end.
func (f *front) settled(t *testing.T) limiter.Settled {
	t.Helper()
	select {
	case s := <-f.settles:
		return s
	case <-time.After(10 * time.Second):
		t.Fatal("no settle within 10s of the response")
		return limiter.Settled{}
	}
}

// budgetProxy is the proxy of budgetFront in front of any upstream.
func budgetProxy(t *testing.T, upstream, onError string) *front {
	t.Helper()
	lim := sidecartest.Limiter(t)
	doc := sidecartest.DocumentRules("ns", "p", "web", sidecartest.BudgetRule("tokens", "x-key", "FixedWindow", budget, 100, 10, onError))
	f := &front{settles: make(chan limiter.Settled, 64)}
	e := &decide.Engine{Limiter: lim, ObserveSettle: func(_ *ruleset.Rule, s limiter.Settled, err error) {
		if err != nil {
			t.Errorf("settle: %v", err)
		}
		f.settles <- s
	}}
	h, err := proxy.New(proxy.Options{Upstream: upstream, Engine: e, Store: sidecartest.StoreOf(t, doc)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	ts := httptest.NewServer(h)
	t.Cleanup(ts.Close)
	f.URL = ts.URL
	return f
}

// send sends c through the proxy under key and returns the status, the body and the headers.
func send(t *testing.T, base, key string, c fakemodel.Call, knobs string) (int, string, http.Header) {
	t.Helper()
	req, err := c.NewRequest(base)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-Key", key)
	if knobs != "" {
		req.Header.Set(fakemodel.KnobHeader, knobs)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), resp.Header
}

// Every API shape, streamed and not, asking for five times the budget: the sidecar lowers the
// cap to what the budget holds, so the upstream serves exactly the budget and not a token more,
// the settle counts it, and the next request is refused with a Retry-After. The client never
// sees the usage chunk the sidecar asked for on its behalf.
func TestBudgetCapsEveryShapeAtTheBudget(t *testing.T) {
	model, f := budgetFront(t, fakemodel.Config{Length: 100_000}, policydoc.OnErrorUsed)
	for _, c := range fakemodel.Calls(5 * budget) {
		t.Run(c.Name(), func(t *testing.T) {
			key := "k-" + c.Name()
			before := model.Served()
			status, body, _ := send(t, f.URL, key, c, "")
			if status != http.StatusOK {
				t.Fatalf("status %d: %s", status, body)
			}
			served := model.Served().Total() - before.Total()
			if served != budget {
				t.Fatalf("the upstream served %d tokens for a budget of %d", served, budget)
			}
			if c.Kind == tokens.OpenAIChat && c.Stream && !c.IncludeUsage && strings.Contains(body, `"prompt_tokens"`) {
				t.Fatalf("the client saw the usage chunk it did not ask for:\n%s", body)
			}
			f.settled(t)
			status, _, hdr := send(t, f.URL, key, c, "")
			if status != http.StatusTooManyRequests || hdr.Get("Retry-After") == "" {
				t.Fatalf("after the budget was spent: status %d, Retry-After %q; want 429 with one", status, hdr.Get("Retry-After"))
			}
		})
	}
}

// The unused part of a hold goes back: small requests use the budget to its end.
func TestBudgetGivesBackTheUnused(t *testing.T) {
	model, f := budgetFront(t, fakemodel.Config{Length: 40}, policydoc.OnErrorUsed)
	c := fakemodel.Call{Kind: tokens.OpenAIChat, Stream: true, Cap: 500}
	var served, n int64
	for range 100 {
		before := model.Served().Total()
		status, _, _ := send(t, f.URL, "small", c, "")
		if status != http.StatusOK {
			break
		}
		f.settled(t)
		served += model.Served().Total() - before
		n++
	}
	if served > budget {
		t.Fatalf("%d requests served %d tokens: past the budget of %d", n, served, budget)
	}
	if served < budget-500 {
		// Each holds up to its prompt and 500; the last refused needed at least its prompt and
		// 10, so less than a hold's worth can be left.
		t.Fatalf("%d requests served only %d of %d: unused holds did not go back", n, served, budget)
	}
}

// Responses that break their cap, report in a header, fail, or cannot be sized.
func TestBudgetSettles(t *testing.T) {
	c := fakemodel.Call{Kind: tokens.OpenAIChat, Cap: 50}
	t.Run("a cap the upstream ignores becomes debt", func(t *testing.T) {
		_, f := budgetFront(t, fakemodel.Config{Length: 3_000, IgnoreCap: true}, policydoc.OnErrorUsed)
		if status, _, _ := send(t, f.URL, "liar", c, ""); status != http.StatusOK {
			t.Fatalf("status %d", status)
		}
		f.settled(t)
		if status, _, _ := send(t, f.URL, "liar", fakemodel.Call{Kind: tokens.OpenAIChat, Cap: 1}, ""); status != http.StatusTooManyRequests {
			t.Fatalf("a key 2000 tokens in debt: status %d, want 429", status)
		}
	})
	t.Run("the cost header settles and is removed", func(t *testing.T) {
		_, f := budgetFront(t, fakemodel.Config{Length: 20, Cost: fakemodel.CostInHeader}, policydoc.OnErrorUsed)
		status, _, hdr := send(t, f.URL, "hdr", fakemodel.Call{Kind: tokens.OpenAIChat, Cap: 900}, "")
		if status != http.StatusOK || hdr.Get("Redline-Cost") != "" {
			t.Fatalf("status %d, Redline-Cost %q: want 200 without the header", status, hdr.Get("Redline-Cost"))
		}
		f.settled(t)
		// 20 and the prompt were used: the rest of the 1000 went back, so 900 fit again.
		if status, _, _ := send(t, f.URL, "hdr", fakemodel.Call{Kind: tokens.OpenAIChat, Cap: 900}, ""); status != http.StatusOK {
			t.Fatalf("second request: status %d; the header's cost did not settle the hold", status)
		}
	})
	for _, tc := range []struct {
		onError string
		refused bool
	}{{policydoc.OnErrorUsed, true}, {policydoc.OnErrorZero, false}} {
		t.Run("a stream cut before its usage, onError "+tc.onError, func(t *testing.T) {
			_, f := budgetFront(t, fakemodel.Config{Length: 1_000}, tc.onError)
			// No cap: the request holds all the budget; the cut leaves its usage unknown.
			cut := fakemodel.Call{Kind: tokens.OpenAIChat, Stream: true}
			_, _, _ = send(t, f.URL, "cut", cut, "fail=cut:5")
			f.settled(t)
			status, _, _ := send(t, f.URL, "cut", fakemodel.Call{Kind: tokens.OpenAIChat, Cap: 10}, "")
			if got := status == http.StatusTooManyRequests; got != tc.refused {
				t.Fatalf("after a cut stream: status %d; want refused %v (Used charges the whole hold, Zero nothing)", status, tc.refused)
			}
		})
	}
	t.Run("a body that cannot be sized holds the default and goes as sent", func(t *testing.T) {
		var got []byte
		up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			got, _ = io.ReadAll(r.Body)
			w.Header().Set("Redline-Cost", "30")
		}))
		t.Cleanup(up.Close)
		f := budgetProxy(t, up.Listener.Addr().String(), policydoc.OnErrorUsed)
		raw := []byte(`{"model": "m", "messages": [`)
		req, _ := http.NewRequest(http.MethodPost, f.URL+"/v1/chat/completions", bytes.NewReader(raw))
		req.Header.Set("X-Key", "raw")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !bytes.Equal(got, raw) {
			t.Fatalf("status %d, upstream got %q: want 200 and the body as sent", resp.StatusCode, got)
		}
		// It held the default 100 and used the 30 its header said.
		if s := f.settled(t); s.Returned != 70 {
			t.Fatalf("settle %+v: want 70 of the default hold of 100 returned", s)
		}
	})
}
