package main_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	. "github.com/onsi/gomega"

	"github.com/redline-dev/redline/internal/policydoc"
	"github.com/redline-dev/redline/internal/sidecar/sidecartest"
)

// Through the built sidecar, a request that sends its key header twice is refused with 400
// naming the header, on the proxy and on /v1/check, and counts nothing: the Go application
// behind it, which would serve it as its first field's key, serves none of them. Before, a
// second X-API-Key field gave a fresh key per request: 20 of 20 admitted against 3 a minute.
func TestRepeatedKeyHeaderThroughTheSidecar(t *testing.T) {
	g := NewWithT(t)
	var mu sync.Mutex
	served := map[string]int{}
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		served[r.Header.Get("X-API-Key")]++
		mu.Unlock()
		_, _ = io.WriteString(w, "served\n")
	})
	up := &upstream{Server: httptest.NewServer(mux)}
	t.Cleanup(up.Close)
	e := newEnv(t, "web")
	e.write(t, sidecartest.DocumentRules(e.namespace, "p", "web", policydoc.Rule{Name: "per-key", Key: []policydoc.KeyPart{{Header: "x-api-key"}},
		Algorithm: "FixedWindow", Requests: 3, WindowMS: time.Hour.Milliseconds(), Mode: "Enforce"}))
	s := start(t, "keys", e, shared.URL(), up.addr(), true)

	send := func(fields ...string) (int, string) {
		req, err := http.NewRequest(http.MethodGet, s.proxy+"/orders", nil)
		g.Expect(err).NotTo(HaveOccurred())
		for i := 0; i+1 < len(fields); i += 2 {
			req.Header.Add(fields[i], fields[i+1])
		}
		resp, err := http.DefaultClient.Do(req)
		g.Expect(err).NotTo(HaveOccurred())
		defer func() { _ = resp.Body.Close() }()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	for i := range 20 {
		status, body := send("X-API-Key", "mine", "X-API-Key", fmt.Sprintf("pad-%d", i))
		g.Expect(status).To(Equal(http.StatusBadRequest), body)
		g.Expect(body).To(Equal(`{"error":"repeated_key_header","header":"X-Api-Key"}` + "\n"))
	}
	resp, err := http.Post(s.check+"/v1/check", "application/json",
		strings.NewReader(`{"method":"GET","path":"/orders","headers":{"X-API-Key":"mine","x-api-key":"pad"}}`))
	g.Expect(err).NotTo(HaveOccurred())
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	g.Expect(resp.StatusCode).To(Equal(http.StatusBadRequest), string(body))
	g.Expect(string(body)).To(ContainSubstring(`"header":"X-Api-Key"`))

	admitted := 0
	for range 5 {
		if status, _ := send("X-API-Key", "mine"); status == http.StatusOK {
			admitted++
		}
	}
	g.Expect(admitted).To(Equal(3), "the repeated requests were counted")
	mu.Lock()
	defer mu.Unlock()
	g.Expect(served).To(Equal(map[string]int{"mine": 3}))
}

// Through the built sidecar's rate limit service, with its default registry of 16,384 open
// holds filled by 1,700 keys of 10 streams each, a victim key's streams never exceed its
// limit of 10 (before, a hold that did not fit was given back and the stream admitted: 100
// of 100). With 8 keys of a larger budget starting 16,384 streams, the victim gets exactly its
// 10: no key, nor a few, fills the registry for others (here the bound of open holds per key
// stops them first; the registry's own share per key is held by the decide and checkapi tests).
func TestRLSVictimStaysAtItsLimitUnderAFullRegistry(t *testing.T) {
	g := NewWithT(t)
	up := newUpstream(t)
	e := newEnv(t, "web")
	budget := func(name string, requests, hold int64) policydoc.Rule {
		r := sidecartest.BudgetRule(name, "x-user", "FixedWindow", requests, hold, 1, policydoc.OnErrorUsed)
		r.WindowMS = time.Hour.Milliseconds()
		return r
	}
	e.write(t, sidecartest.DocumentRules(e.namespace, "llm", "web", budget("tokens", 10_000, 1_000), budget("bulk", 100_000_000, 1)))
	s := start(t, "registry", e, shared.URL(), up.addr(), true)
	rl := rlsClient(t, s.grpc)
	startStream := func(rule, user string) rlsv3.RateLimitResponse_Code {
		req := rlsDescriptor(user, nil)
		req.Descriptors[0].Entries[0].Value, req.Descriptors[0].Entries[1].Value = "llm", rule
		resp, err := rl.ShouldRateLimit(context.Background(), req)
		g.Expect(err).NotTo(HaveOccurred())
		return resp.OverallCode
	}
	victim := func(user string) int {
		ok := 0
		for range 100 {
			if startStream("tokens", user) == rlsv3.RateLimitResponse_OK {
				ok++
			}
		}
		return ok
	}

	// A few keys: 8 keys of the large budget start 16,384 streams between them. Each key holds
	// at most 64 at once (the limiter's bound of open holds per key, counted in Redis), which
	// stops them before the registry's share of a key (256) or half the registry is reached.
	var busy atomic.Int64
	parallel(16_384, 16, func(i int) {
		if startStream("bulk", fmt.Sprintf("busy-%d", i%8)) == rlsv3.RateLimitResponse_OK {
			busy.Add(1)
		}
	})
	g.Expect(busy.Load()).To(Equal(int64(8*64)), "each busy key holds its 64 open holds, no more")
	g.Expect(victim("victim-1")).To(Equal(10))

	// Many keys: 1,700 keys start 10 streams each, 17,000 in all, past the registry's 16,384.
	parallel(17_000, 16, func(i int) { startStream("tokens", fmt.Sprintf("filler-%d", i%1_700)) })
	g.Expect(victim("victim-2")).To(BeNumerically("<=", 10))
	g.Expect(s.metric(t, `redline_sidecar_hold_registry_refusals_total{face="rls",reason="full"}`)).To(BeNumerically(">", 0))
}
