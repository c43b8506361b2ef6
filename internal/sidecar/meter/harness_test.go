package meter

import (
	"bytes"
	"context"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redline-dev/redline/internal/testutil/fakemodel"
	"github.com/redline-dev/redline/internal/tokens"
)

// Test-only request headers between the harness's front handler and its proxy.
const (
	idHeader    = "X-Test-Id"
	stripHeader = "X-Test-Strip"
)

// harness is the sidecar's body path as the lead will wire it, in miniature: a front handler
// that reads the request body (ReadBody), asks an OpenAI chat stream for usage on the client's
// behalf (tokens.SetOutputCap), and forwards through an httputil.ReverseProxy whose
// ModifyResponse meters the response (Wrap). Every outcome is recorded by request id.
type harness struct {
	t        *testing.T
	upstream string
	proxy    string
	next     atomic.Int64

	mu       sync.Mutex
	outcomes map[string][]Outcome
	arrived  map[string]chan struct{}
}

// newHarness proxies to upstream (a base URL). When the test ends, it shuts the proxy down
// (waiting for every handler) and checks that every request had exactly one outcome.
func newHarness(t *testing.T, upstream string) *harness {
	t.Helper()
	h := &harness{t: t, upstream: upstream, outcomes: map[string][]Outcome{}, arrived: map[string]chan struct{}{}}
	target, err := url.Parse(upstream)
	if err != nil {
		t.Fatal(err)
	}
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			pr.Out.Host = pr.In.Host
		},
		ModifyResponse: func(res *http.Response) error {
			id := res.Request.Header.Get(idHeader)
			kind, _ := tokens.KindFromPath(res.Request.URL.Path)
			Wrap(res, Options{Kind: kind, StripUsage: res.Request.Header.Get(stripHeader) != "",
				OnEnd: func(o Outcome) { h.record(id, o) }})
			return nil
		},
		ErrorLog: log.New(io.Discard, "", 0),
	}
	front := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fullDuplex(w)
		kind, stream := tokens.KindFromPath(r.URL.Path)
		body, err := ReadBody(r, tokens.MaxRequestBytes, 5*time.Second)
		if err == nil {
			if nb, strip := sidecarBody(body, kind, stream); strip {
				r.Body, r.ContentLength = io.NopCloser(bytes.NewReader(nb)), int64(len(nb))
				r.Header.Set(stripHeader, "1")
			}
		}
		rp.ServeHTTP(w, r)
	})
	ts := httptest.NewServer(front)
	h.proxy = ts.URL
	t.Cleanup(func() {
		ts.Close()
		h.mu.Lock()
		defer h.mu.Unlock()
		for id, os := range h.outcomes {
			if len(os) != 1 {
				t.Errorf("request %s: %d outcomes, want exactly 1: %+v", id, len(os), os)
			}
		}
		if n := h.next.Load(); int64(len(h.outcomes)) != n {
			t.Errorf("%d requests had an outcome, of %d sent", len(h.outcomes), n)
		}
	})
	return h
}

// sidecarBody is the rewrite the sidecar makes of an OpenAI chat stream that did not ask for
// usage: it asks for it (the cap it sets is the client's, or one far above every test's
// length), and the chunk is removed on the way back.
func sidecarBody(body []byte, kind tokens.Kind, stream bool) ([]byte, bool) {
	req, err := tokens.ScanRequest(body, kind, stream)
	if err != nil || kind != tokens.OpenAIChat || !req.Stream || req.IncludeUsage {
		return body, false
	}
	limit := req.OutputCap
	if limit == 0 {
		limit = 1 << 20
	}
	nb, err := tokens.SetOutputCap(body, kind, limit, true)
	if err != nil {
		return body, false
	}
	return nb, true
}

func (h *harness) record(id string, o Outcome) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.outcomes[id] = append(h.outcomes[id], o)
	if ch, ok := h.arrived[id]; ok && len(h.outcomes[id]) == 1 {
		close(ch)
	}
}

// request builds a request through the proxy for c, with the fake's knobs, and its id.
func (h *harness) request(ctx context.Context, c fakemodel.Call, knobs string) (*http.Request, string) {
	h.t.Helper()
	req, err := c.NewRequest(h.proxy)
	if err != nil {
		h.t.Fatal(err)
	}
	id := strconv.FormatInt(h.next.Add(1), 10)
	req = req.WithContext(ctx)
	req.Header.Set(idHeader, id)
	if knobs != "" {
		req.Header.Set(fakemodel.KnobHeader, knobs)
	}
	h.mu.Lock()
	h.arrived[id] = make(chan struct{})
	h.mu.Unlock()
	return req, id
}

// do sends c through the proxy and reads the whole answer.
func (h *harness) do(c fakemodel.Call, knobs string) (res *http.Response, body []byte, id string, err error) {
	h.t.Helper()
	req, id := h.request(context.Background(), c, knobs)
	res, err = http.DefaultClient.Do(req)
	if err != nil {
		return nil, nil, id, err // a cut before the proxy sent its header
	}
	defer res.Body.Close()
	body, err = io.ReadAll(res.Body)
	return res, body, id, err
}

// outcome waits for the request's outcome: the proxy may still be between the last byte the
// client read and the upstream's EOF. The wait is bounded only to turn a missing outcome into
// a failure instead of a hung test.
func (h *harness) outcome(id string) Outcome {
	h.t.Helper()
	h.mu.Lock()
	ch := h.arrived[id]
	h.mu.Unlock()
	select {
	case <-ch:
	case <-time.After(20 * time.Second):
		h.t.Fatalf("request %s: no outcome", id)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.outcomes[id][0]
}

// direct sends body to the upstream itself, as the proxy forwarded it.
func direct(t *testing.T, upstream string, c fakemodel.Call, body []byte, knobs string) []byte {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, upstream+c.Path(), bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if knobs != "" {
		req.Header.Set(fakemodel.KnobHeader, knobs)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return b
}

// withoutUsageChunk drops the events of an OpenAI chat stream that have no choices and a
// usage: the chunk the client did not ask for. Independent of tokens.UsageChunkFilter, so the
// two can disagree.
func withoutUsageChunk(stream []byte) []byte {
	var out []byte
	for _, ev := range bytes.SplitAfter(stream, []byte("\n\n")) {
		if bytes.Contains(ev, []byte(`"choices":[]`)) && bytes.Contains(ev, []byte(`"usage":{`)) {
			continue
		}
		out = append(out, ev...)
	}
	return out
}

// fullDuplex keeps net/http from closing the request body when the proxy writes the response
// header: without it, the server discards and closes an unread body at that moment, and a
// transport still finishing the request's write (its read for EOF after Content-Length
// bytes) fails it with ErrBodyReadAfterClose and closes the upstream connection mid-response
// (about 3% of streamed POSTs through a plain ReverseProxy on this machine).
func fullDuplex(w http.ResponseWriter) {
	if err := http.NewResponseController(w).EnableFullDuplex(); err != nil {
		panic(err) // an HTTP/1 server always supports it
	}
}
