package proxy_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/redline-dev/redline/internal/keyscheme"
	"github.com/redline-dev/redline/internal/limiter"
	"github.com/redline-dev/redline/internal/sidecar/decide"
	"github.com/redline-dev/redline/internal/sidecar/proxy"
	"github.com/redline-dev/redline/internal/testutil/sidecartest"
)

// byKey admits every key but "blocked".
type byKey struct{}

func (byKey) Allow(_ context.Context, key string, l limiter.Limit, _ int64) (limiter.Result, error) {
	if key == keyscheme.Key("ns", "p", "r", "blocked") {
		return limiter.Result{OverLimit: true, RetryAfter: 2500 * time.Millisecond, ResetAfter: l.Window, Source: limiter.SourceRedis}, nil
	}
	return limiter.Result{Allowed: true, Remaining: 7, ResetAfter: 30 * time.Second, Source: limiter.SourceRedis}, nil
}

func newProxy(t testing.TB, upstream string, headers bool) http.Handler {
	h, err := proxy.New(proxy.Options{Upstream: upstream, Engine: &decide.Engine{Limiter: sidecartest.FakeLimiter{Decide: byKey{}.Allow}}, Store: sidecartest.Store(t, 10, time.Minute), Headers: headers})
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func TestProxy(t *testing.T) {
	g := NewWithT(t)
	var seen *http.Request
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen = r
		_, _ = io.WriteString(w, "from upstream")
	}))
	defer up.Close()
	front := httptest.NewServer(newProxy(t, up.Listener.Addr().String(), true))
	defer front.Close()

	req, _ := http.NewRequest(http.MethodGet, front.URL+"/a?b=c", nil)
	req.Host = "shop.example"
	req.Header.Set("X-Key", "k")
	req.Header.Set("X-Forwarded-For", "9.9.9.9")
	req.Header.Set("X-Forwarded-Proto", "https")
	resp, err := http.DefaultClient.Do(req)
	g.Expect(err).NotTo(HaveOccurred())
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	g.Expect(resp.StatusCode).To(Equal(http.StatusOK))
	g.Expect(string(body)).To(Equal("from upstream"))
	g.Expect(resp.Header.Get("RateLimit")).To(Equal(`"p/r";r=7;t=30`))
	g.Expect(seen.Host).To(Equal("shop.example"), "the application sees the original Host")
	g.Expect(seen.URL.RequestURI()).To(Equal("/a?b=c"))
	g.Expect(seen.Header.Get("X-Forwarded-For")).To(Equal("9.9.9.9, 127.0.0.1"))
	g.Expect(seen.Header.Get("X-Forwarded-Proto")).To(Equal("https"), "what a proxy in front said is kept")

	req.Header.Set("X-Key", "blocked")
	resp, err = http.DefaultClient.Do(req)
	g.Expect(err).NotTo(HaveOccurred())
	var refusal proxy.Refusal
	g.Expect(json.NewDecoder(resp.Body).Decode(&refusal)).To(Succeed())
	resp.Body.Close()
	g.Expect(resp.StatusCode).To(Equal(http.StatusTooManyRequests))
	g.Expect(resp.Header.Get("Retry-After")).To(Equal("3"))
	g.Expect(refusal).To(Equal(proxy.Refusal{Error: "rate_limited", Policy: "p", Rule: "r", RetryAfterSeconds: 3}))

	// Headers turned off: admitted responses carry none, refusals still do.
	quiet := httptest.NewServer(newProxy(t, up.Listener.Addr().String(), false))
	defer quiet.Close()
	resp, err = http.Get(quiet.URL)
	g.Expect(err).NotTo(HaveOccurred())
	resp.Body.Close()
	g.Expect(resp.Header.Get("RateLimit")).To(BeEmpty())
}

func TestUpstreamDown(t *testing.T) {
	g := NewWithT(t)
	up := httptest.NewServer(http.NotFoundHandler())
	addr := up.Listener.Addr().String()
	up.Close()
	front := httptest.NewServer(newProxy(t, addr, true))
	defer front.Close()
	resp, err := http.Get(front.URL)
	g.Expect(err).NotTo(HaveOccurred())
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	g.Expect(resp.StatusCode).To(Equal(http.StatusBadGateway))
	g.Expect(string(body)).To(ContainSubstring("upstream_unavailable"))
}

// BenchmarkProxy is the proxy's cost per request over loopback with a limiter that answers at
// once, i.e. without Redis.
func BenchmarkProxy(b *testing.B) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") }))
	defer up.Close()
	front := httptest.NewServer(newProxy(b, up.Listener.Addr().String(), true))
	defer front.Close()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16}}
	b.ReportAllocs()
	for b.Loop() {
		req, _ := http.NewRequest(http.MethodGet, front.URL+"/x", nil)
		req.Header.Set("X-Key", "k")
		resp, err := client.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
}
