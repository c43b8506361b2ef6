package proxy_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/redline-dev/redline/internal/policydoc"
	"github.com/redline-dev/redline/internal/sidecar/decide"
	"github.com/redline-dev/redline/internal/sidecar/proxy"
	"github.com/redline-dev/redline/internal/testutil/fakemodel"
	"github.com/redline-dev/redline/internal/testutil/sidecartest"
)

// servedApp is a Go application behind the proxy that counts the requests it serves per
// X-API-Key as it reads it (Header.Get: the first field).
type servedApp struct {
	mu     sync.Mutex
	served map[string]int
}

func (a *servedApp) count(key string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.served[key]
}

func (a *servedApp) total() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	n := 0
	for _, c := range a.served {
		n += c
	}
	return n
}

// A key header sent twice is refused with 400 naming it, before anything is counted, so that
// a second field can pick no fresh key: the application, which serves such a request as its
// first field's key, sees none of them, and the key's own limit is whole afterwards.
func TestRepeatedKeyHeaderRefused(t *testing.T) {
	g := NewWithT(t)
	app := &servedApp{served: map[string]int{}}
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		app.mu.Lock()
		app.served[r.Header.Get("X-API-Key")]++
		app.mu.Unlock()
		_, _ = w.Write([]byte("served"))
	})
	up := httptest.NewServer(mux)
	t.Cleanup(up.Close)
	doc := sidecartest.DocumentAlgorithm("ns", "p", "r", "web", 3, time.Minute, "x-api-key", "Open", "FixedWindow")
	h, err := proxy.New(proxy.Options{Upstream: up.Listener.Addr().String(), Engine: &decide.Engine{Limiter: sidecartest.Limiter(t)},
		Store: sidecartest.StoreOf(t, doc)})
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(h.Close)
	front := httptest.NewServer(h)
	t.Cleanup(front.Close)

	send := func(fields ...string) (int, map[string]string) {
		req, err := http.NewRequest(http.MethodGet, front.URL+"/orders", nil)
		g.Expect(err).NotTo(HaveOccurred())
		for i := 0; i+1 < len(fields); i += 2 {
			req.Header.Add(fields[i], fields[i+1])
		}
		resp, err := http.DefaultClient.Do(req)
		g.Expect(err).NotTo(HaveOccurred())
		defer func() { _ = resp.Body.Close() }()
		var body map[string]string
		if resp.StatusCode == http.StatusBadRequest {
			g.Expect(resp.Header.Get("Content-Type")).To(Equal("application/json"))
			g.Expect(json.NewDecoder(resp.Body).Decode(&body)).To(Succeed())
		}
		return resp.StatusCode, body
	}

	for i := range 20 {
		status, body := send("X-API-Key", "mine", "X-API-Key", fmt.Sprintf("pad-%d", i))
		g.Expect(status).To(Equal(http.StatusBadRequest), "request %d", i)
		g.Expect(body).To(Equal(map[string]string{"error": "repeated_key_header", "header": "X-Api-Key"}))
	}
	g.Expect(app.total()).To(Equal(0), "the application served a request with two keys")

	// Nothing was counted: the key still has its whole limit of 3, and no more.
	admitted := 0
	for range 5 {
		if status, _ := send("X-API-Key", "mine"); status == http.StatusOK {
			admitted++
		}
	}
	g.Expect(admitted).To(Equal(3))
	g.Expect(app.count("mine")).To(Equal(3))

	// A header no rule keys on may repeat.
	status, _ := send("X-API-Key", "other", "Accept", "text/plain", "Accept", "application/json")
	g.Expect(status).To(Equal(http.StatusOK))
	g.Expect(app.count("other")).To(Equal(1))
}

// A token budget's request with its key header twice is refused the same way, before its body
// is read or anything held: the model serves none of them, and the key's budget is whole.
func TestRepeatedKeyHeaderRefusedOnATokenBudget(t *testing.T) {
	g := NewWithT(t)
	model, f := budgetFront(t, fakemodel.Config{Length: 100}, policydoc.OnErrorUsed)
	c := fakemodel.Calls(50)[0]
	for i := range 5 {
		req, err := c.NewRequest(f.URL)
		g.Expect(err).NotTo(HaveOccurred())
		req.Header.Add("X-Key", "mine")
		req.Header.Add("X-Key", fmt.Sprintf("pad-%d", i))
		resp, err := http.DefaultClient.Do(req)
		g.Expect(err).NotTo(HaveOccurred())
		body, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		g.Expect(resp.StatusCode).To(Equal(http.StatusBadRequest))
		g.Expect(string(body)).To(ContainSubstring(`"header":"X-Key"`))
	}
	g.Expect(model.Served().Requests).To(BeZero())
	status, body, _ := send(t, f.URL, "mine", c, "")
	g.Expect(status).To(Equal(http.StatusOK), body)
	g.Expect(model.Served().Requests).To(Equal(int64(1)))
}
