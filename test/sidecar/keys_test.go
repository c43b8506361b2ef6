package sidecar_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/redline-dev/redline/internal/policydoc"
	"github.com/redline-dev/redline/internal/testutil/sidecartest"
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
