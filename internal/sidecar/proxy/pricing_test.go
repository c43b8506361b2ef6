package proxy_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/redline-dev/redline/internal/policydoc"
	"github.com/redline-dev/redline/internal/sidecar/decide"
	"github.com/redline-dev/redline/internal/sidecar/proxy"
	"github.com/redline-dev/redline/internal/testutil/fakemodel"
	"github.com/redline-dev/redline/internal/testutil/sidecartest"
)

const pricedBudget = 10_000

// pricedProxy is a sidecar proxy enforcing 10,000 tokens a minute per X-Key (FixedWindow,
// defaultHold 1000) with the given unsizedBody, on a real Redis, in front of upstream.
func pricedProxy(t *testing.T, upstream, unsized string) string {
	t.Helper()
	rule := sidecartest.BudgetRule("tokens", "x-key", "FixedWindow", pricedBudget, 1000, 10, policydoc.OnErrorUsed)
	rule.Cost.UnsizedBody = unsized
	doc := sidecartest.DocumentRules("ns", "p", "web", rule)
	h, err := proxy.New(proxy.Options{Upstream: upstream, Engine: &decide.Engine{Limiter: sidecartest.Limiter(t)}, Store: sidecartest.StoreOf(t, doc)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	ts := httptest.NewServer(h)
	t.Cleanup(ts.Close)
	return ts.URL
}

// postJSON sends a chat or responses body under key and returns the status and the body.
func postJSON(t *testing.T, url, key, body string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Key", key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// imagesBody is a chat body of n image parts asking for one output token.
func imagesBody(n int) string {
	part := `{"type":"image_url","image_url":{"url":"https://x.invalid/a.png"}}`
	return `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":[` +
		strings.TrimSuffix(strings.Repeat(part+",", n), ",") + `]}]}`
}

// Images are held at what their API bills at most for one: 500 image parts with max_tokens 1
// are more than the whole budget and never reach the upstream, while two fit and go.
func TestBudgetPricesImages(t *testing.T) {
	model := fakemodel.New(fakemodel.Config{})
	up := httptest.NewServer(model)
	t.Cleanup(up.Close)
	url := pricedProxy(t, up.Listener.Addr().String(), policydoc.UnsizedRefuse) + "/v1/chat/completions"

	status, body := postJSON(t, url, "images", imagesBody(500))
	if status != http.StatusTooManyRequests {
		t.Fatalf("500 images against a budget of %d: status %d (%s), want 429", pricedBudget, status, body)
	}
	if got := model.Served().Requests; got != 0 {
		t.Fatalf("the upstream served %d requests of 500 images", got)
	}
	status, body = postJSON(t, url, "images", imagesBody(2))
	if status != http.StatusOK {
		t.Fatalf("2 images: status %d (%s), want 200", status, body)
	}
	if got := model.Served().Requests; got != 1 {
		t.Fatalf("the upstream served %d requests, want the one of 2 images", got)
	}
}

// An input whose cost the request does not show is refused as unsized under Refuse (400,
// input_not_priced, nothing upstream) and goes as sent under Hold.
func TestBudgetRefusesInputsItCannotPrice(t *testing.T) {
	var served atomic.Int64
	var got atomic.Value
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got.Store(b)
		served.Add(1)
		w.Header().Set("Redline-Cost", "30")
	}))
	t.Cleanup(up.Close)
	bodies := map[string]string{
		"/v1/responses":                    `{"model":"m","max_output_tokens":16,"input":[{"role":"user","content":[{"type":"input_file","file_id":"file-1"}]}]}`,
		"/v1/messages":                     `{"model":"m","max_tokens":16,"messages":[{"role":"user","content":[{"type":"document","source":{"type":"url","url":"https://x.invalid/a.pdf"}}]}]}`,
		"/v1beta/models/m:generateContent": `{"contents":[{"parts":[{"text":"hi"}]}],"cachedContent":"cachedContents/c1"}`,
	}
	refuse := pricedProxy(t, up.Listener.Addr().String(), policydoc.UnsizedRefuse)
	hold := pricedProxy(t, up.Listener.Addr().String(), "")
	for path, body := range bodies {
		t.Run(path, func(t *testing.T) {
			before := served.Load()
			status, resp := postJSON(t, refuse+path, "files", body)
			var ref proxy.UnsizedRefusal
			_ = json.Unmarshal(resp, &ref)
			if status != http.StatusBadRequest || ref.Reason != proxy.UnsizedNotPriced {
				t.Fatalf("under Refuse: status %d, reason %q (%s); want 400 %s", status, ref.Reason, resp, proxy.UnsizedNotPriced)
			}
			if served.Load() != before {
				t.Fatal("a refused request reached the upstream")
			}
			if status, resp := postJSON(t, hold+path, "files", body); status != http.StatusOK {
				t.Fatalf("under Hold: status %d (%s), want 200", status, resp)
			}
			if served.Load() != before+1 || !bytes.Equal(got.Load().([]byte), []byte(body)) {
				t.Fatalf("under Hold the upstream got %q, want the body as sent", got.Load())
			}
		})
	}
}
