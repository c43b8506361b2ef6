package proxy_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/redline-dev/redline/internal/policydoc"
	"github.com/redline-dev/redline/internal/sidecar/decide"
	"github.com/redline-dev/redline/internal/sidecar/membudget"
	"github.com/redline-dev/redline/internal/sidecar/proxy"
	"github.com/redline-dev/redline/internal/testutil/sidecartest"
)

// memoryFront is a proxy with a memory budget of room bytes in front of upstream, enforcing a
// token budget per X-Key on /v1/chat/completions and 1 call a minute per X-Caller on /plain.
func memoryFront(t *testing.T, upstream http.Handler, room int64) (string, *membudget.Budget) {
	t.Helper()
	up := httptest.NewServer(upstream)
	t.Cleanup(up.Close)
	tokens := sidecartest.BudgetRule("tokens", "x-key", "FixedWindow", 1_000_000, 100, 1, policydoc.OnErrorZero)
	tokens.Match = &policydoc.Match{PathPrefix: "/v1/chat/completions"}
	calls := policydoc.Rule{Name: "calls", Key: []policydoc.KeyPart{{Header: "x-caller"}}, Algorithm: "FixedWindow",
		Requests: 1, WindowMS: time.Minute.Milliseconds(), Mode: "Enforce"}
	doc := sidecartest.DocumentRules("ns", "p", "web", tokens, calls)
	budget := membudget.New(room)
	h, err := proxy.New(proxy.Options{Upstream: up.Listener.Addr().String(), Engine: &decide.Engine{Limiter: sidecartest.Limiter(t)},
		Store: sidecartest.StoreOf(t, doc), Memory: budget})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	ts := httptest.NewServer(h)
	t.Cleanup(ts.Close)
	return ts.URL, budget
}

func chat(content string) string {
	return `{"model":"m","max_tokens":10,"messages":[{"role":"user","content":"` + content + `"}]}`
}

func post(g Gomega, url, caller, body string) *http.Response {
	req, err := http.NewRequest(http.MethodPost, url+"/v1/chat/completions", strings.NewReader(body))
	g.Expect(err).NotTo(HaveOccurred())
	req.Header.Set("X-Key", "k")
	req.Header.Set("X-Caller", caller)
	resp, err := http.DefaultClient.Do(req)
	g.Expect(err).NotTo(HaveOccurred())
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp
}

var usage = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	w.Header().Set("Content-Type", "application/json")
	_, _ = io.WriteString(w, `{"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":5,"total_tokens":10}}`)
})

// A body the memory budget has no room for is answered 503 with Retry-After, never sized by
// default nor sent on, and counted; one that fits is served, and its draw goes back.
func TestFullMemoryBudgetAnswers503(t *testing.T) {
	g := NewWithT(t)
	url, budget := memoryFront(t, usage, 16<<10)

	resp := post(g, url, "a", chat(strings.Repeat("a", 32<<10)))
	g.Expect(resp.StatusCode).To(Equal(http.StatusServiceUnavailable))
	g.Expect(resp.Header.Get("Retry-After")).To(Equal("1"))
	g.Expect(budget.Stats().Refused).To(BeEquivalentTo(1))

	resp = post(g, url, "b", chat("hello"))
	g.Expect(resp.StatusCode).To(Equal(http.StatusOK))
	g.Expect(budget.Stats().InUse).To(BeZero(), "the draw went back with the body")
	g.Expect(budget.Stats().Refused).To(BeEquivalentTo(1))
}

// A request its plain rules refuse is refused before its body is read: 429, not the 503 of a
// budget with no room for any body; a request the budget refused counts in no rule.
func TestPlainRefusalReadsNoBody(t *testing.T) {
	g := NewWithT(t)
	url, budget := memoryFront(t, usage, 1)

	resp := post(g, url, "c", chat("hello"))
	g.Expect(resp.StatusCode).To(Equal(http.StatusServiceUnavailable), "no room for any body")
	// The request the budget refused counts in no rule: the caller's one call is still there.
	req, _ := http.NewRequest(http.MethodGet, url+"/plain", nil)
	req.Header.Set("X-Caller", "c")
	plain, err := http.DefaultClient.Do(req)
	g.Expect(err).NotTo(HaveOccurred())
	plain.Body.Close()
	g.Expect(plain.StatusCode).To(Equal(http.StatusOK), "a refused request counts in no rule")
	resp = post(g, url, "c", chat("hello"))
	g.Expect(resp.StatusCode).To(Equal(http.StatusTooManyRequests), "the plain rule refuses the caller's next call first")
	g.Expect(budget.Stats().Refused).To(BeEquivalentTo(1), "the refused request drew nothing")
}

// The body's memory goes back as soon as the application has read it, while its answer is
// still to come (a slow model), leaving only the hold's: the body as sent, and one rewritten
// with an output cap.
func TestBodyMemoryGoesBackOnceUpstream(t *testing.T) {
	for name, body := range map[string]string{
		"as sent":   chat(strings.Repeat("a", 64<<10)),
		"rewritten": `{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("a", 64<<10) + `"}]}`,
	} {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			read, answer := make(chan struct{}), make(chan struct{})
			slow := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				close(read)
				<-answer
				usage(w, r)
			})
			url, budget := memoryFront(t, slow, 1<<20)
			status := make(chan int, 1)
			go func() {
				resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(body))
				if err != nil {
					status <- 0
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				status <- resp.StatusCode
			}()
			<-read
			inUse := func() int64 { return budget.Stats().InUse }
			ok := g.Eventually(inUse).Should(BeEquivalentTo(decide.HoldBytes), "nothing but the hold kept while the model answers")
			close(answer)
			if !ok {
				return
			}
			g.Expect(<-status).To(Equal(http.StatusOK))
		})
	}
}

// A request's hold draws from the memory budget while the model answers, and goes back with
// the response; a request whose hold the budget has no room for is answered 503 with
// Retry-After before anything is held or sent upstream.
func TestHoldsDrawFromTheMemoryBudget(t *testing.T) {
	g := NewWithT(t)
	read, answer := make(chan struct{}, 1), make(chan struct{})
	slow := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		read <- struct{}{}
		<-answer
		usage(w, r)
	})
	const room = 64 << 10
	url, budget := memoryFront(t, slow, room)
	status := make(chan int, 1)
	go func() {
		resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(chat("hello")))
		if err != nil {
			status <- 0
			return
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		status <- resp.StatusCode
	}()
	<-read
	ok := g.Eventually(func() int64 { return budget.Stats().InUse }).Should(BeEquivalentTo(decide.HoldBytes),
		"the body went back once upstream; the hold stays until the response settles it")
	close(answer)
	if !ok {
		return
	}
	g.Expect(<-status).To(Equal(http.StatusOK))
	g.Eventually(func() int64 { return budget.Stats().InUse }).Should(BeZero())

	// Other requests hold all but a hold's worth less a byte: the body fits, the hold does not.
	g.Expect(budget.Draw(room-decide.HoldBytes+1, nil)).To(BeTrue())
	resp := post(g, url, "d", chat("hello"))
	g.Expect(resp.StatusCode).To(Equal(http.StatusServiceUnavailable))
	g.Expect(resp.Header.Get("Retry-After")).To(Equal("1"))
	g.Expect(budget.Stats().Refused).To(BeEquivalentTo(1))
	g.Expect(budget.Stats().InUse).To(BeEquivalentTo(room-decide.HoldBytes+1), "the refused request keeps nothing")
	budget.Return(room - decide.HoldBytes + 1)
}
