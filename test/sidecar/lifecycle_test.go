package sidecar_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/redline-dev/redline/internal/sidecar/checkapi"
	"github.com/redline-dev/redline/internal/testutil/sidecartest"
)

// limitInForce asks /v1/check which limit the sidecar applies to rule r of policy p.
func limitInForce(s *sidecar, p, r string) int64 {
	body := fmt.Sprintf(`{"policy":%q,"rule":%q,"key":["probe-%d"]}`, p, r, time.Now().UnixNano())
	resp, err := httpClient.Post(s.check+checkapi.Path, "application/json", strings.NewReader(body))
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	var d checkapi.Response
	if json.NewDecoder(resp.Body).Decode(&d) != nil || len(d.Results) == 0 {
		return -1
	}
	return d.Results[0].Limit
}

func admittedOf(t *testing.T, s *sidecar, key string, n int) int {
	t.Helper()
	ok := 0
	for range n {
		req, _ := http.NewRequest(http.MethodGet, s.proxy+"/", nil)
		req.Header.Set("X-Key", key)
		resp, err := httpClient.Do(req)
		if err != nil {
			t.Fatalf("request through %s: %v", s.name, err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			ok++
		}
	}
	return ok
}

// A new document swapped in the way kubelet does is enforced within a second; a corrupt one is
// refused, counted, and the last good limit stays.
func TestReloadAndCorruptDocument(t *testing.T) {
	g := NewWithT(t)
	e := newEnv(t, "web")
	e.write(t, sidecartest.Document(e.namespace, "p", "r", "web", 10, time.Minute, "x-key", "Open"))
	up := newUpstream(t)
	s := start(t, "pod-reload", e, shared.URL(), up.addr(), true)
	g.Expect(admittedOf(t, s, "k1", 12)).To(Equal(10))

	e.write(t, sidecartest.Document(e.namespace, "p", "r", "web", 5, time.Minute, "x-key", "Open"))
	g.Eventually(func() int64 { return limitInForce(s, "p", "r") }).
		WithTimeout(time.Second).WithPolling(20*time.Millisecond).Should(Equal(int64(5)), "new limit within a second")
	g.Expect(admittedOf(t, s, "k2", 8)).To(Equal(5))

	g.Expect(s.metric(t, "redline_sidecar_config_reload_errors_total")).To(Equal(0.0))
	e.write(t, []byte(`{"version":1,"namespace":"x","hash":"0000","scripts":{},"policies":[]}`))
	g.Eventually(func() float64 { return s.metric(t, "redline_sidecar_config_reload_errors_total") }).
		WithTimeout(5 * time.Second).WithPolling(20 * time.Millisecond).Should(Equal(1.0))
	g.Expect(limitInForce(s, "p", "r")).To(Equal(int64(5)), "the last good document stays in force")
	g.Expect(admittedOf(t, s, "k3", 8)).To(Equal(5))
	resp, err := http.Get(s.admin + "/readyz")
	g.Expect(err).NotTo(HaveOccurred())
	resp.Body.Close()
	g.Expect(resp.StatusCode).To(Equal(http.StatusOK), "a refused update does not make a loaded sidecar unready")
	g.Expect(s.Log()).To(ContainSubstring(`"msg":"policies document refused, keeping the set in force"`))
	g.Expect(s.Log()).To(ContainSubstring(`"maxProcs":1`), "one P unless --max-procs or GOMAXPROCS says otherwise")
}

// A namespace without policies has no ConfigMap: the sidecar is ready and limits nothing, so
// pods become Ready before the first policy exists. A corrupt document later is refused and
// the set in force stays.
func TestReadyWithoutDocumentAndCorruptDocumentRefused(t *testing.T) {
	g := NewWithT(t)
	e := newEnv(t, "web")
	up := newUpstream(t)
	s := start(t, "pod-empty", e, shared.URL(), up.addr(), false)
	readyz := func() int {
		resp, err := http.Get(s.admin + "/readyz")
		if err != nil {
			return 0
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	g.Eventually(readyz).WithTimeout(5 * time.Second).WithPolling(20 * time.Millisecond).Should(Equal(http.StatusOK))
	g.Expect(admittedOf(t, s, "k", 3)).To(Equal(3), "no policies in force: nothing is limited")

	e.write(t, []byte("not json"))
	g.Eventually(func() float64 { return s.metric(t, "redline_sidecar_config_reload_errors_total") }).
		WithTimeout(5 * time.Second).WithPolling(20 * time.Millisecond).Should(Equal(1.0))
	g.Expect(readyz()).To(Equal(http.StatusOK), "the last good set (no policies) stays in force")

	e.write(t, sidecartest.Document(e.namespace, "p", "r", "web", 2, time.Minute, "x-key", "Open"))
	g.Eventually(func() int { return admittedOf(t, s, fmt.Sprintf("k-%d", time.Now().UnixNano()), 3) }).
		WithTimeout(5 * time.Second).WithPolling(50 * time.Millisecond).Should(Equal(2))
}

// Streams pass through as they are written, upgrades are tunnelled, and SIGTERM lets an
// in-flight request finish before the process exits cleanly.
func TestStreamingUpgradeAndGracefulShutdown(t *testing.T) {
	g := NewWithT(t)
	e := newEnv(t, "web")
	e.write(t, sidecartest.Document(e.namespace, "p", "r", "web", 1000, time.Minute, "x-key", "Open"))
	release := make(chan struct{})
	slowStarted := make(chan struct{}, 1)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/stream":
			w.Header().Set("Content-Type", "text/event-stream")
			_, _ = io.WriteString(w, "data: first\n\n")
			w.(http.Flusher).Flush()
			<-release
			_, _ = io.WriteString(w, "data: second\n\n")
		case "/ws":
			if r.Header.Get("Upgrade") != "echo" {
				http.Error(w, "want upgrade", http.StatusBadRequest)
				return
			}
			conn, brw, err := http.NewResponseController(w).Hijack()
			if err != nil {
				return
			}
			defer conn.Close()
			_, _ = brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\n")
			_ = brw.Flush()
			line, _ := brw.ReadString('\n')
			_, _ = brw.WriteString("echo: " + line)
			_ = brw.Flush()
		case "/slow":
			slowStarted <- struct{}{}
			time.Sleep(500 * time.Millisecond)
			_, _ = io.WriteString(w, "slow done")
		}
	}))
	t.Cleanup(up.Close)
	s := start(t, "pod-stream", e, shared.URL(), up.Listener.Addr().String(), true)

	// Streaming: the first event arrives while the upstream is still holding the response.
	resp, err := httpClient.Get(s.proxy + "/stream")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(resp.Header.Get("RateLimit-Policy")).To(Equal(`"p/r";q=1000;w=60`))
	br := bufio.NewReader(resp.Body)
	line, err := br.ReadString('\n')
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(line).To(Equal("data: first\n"))
	close(release)
	rest, _ := io.ReadAll(br)
	resp.Body.Close()
	g.Expect(string(rest)).To(ContainSubstring("data: second"))

	// Upgrade: a raw protocol switch is tunnelled both ways.
	conn, err := net.Dial("tcp", strings.TrimPrefix(s.proxy, "http://"))
	g.Expect(err).NotTo(HaveOccurred())
	defer conn.Close()
	_, _ = io.WriteString(conn, "GET /ws HTTP/1.1\r\nHost: app\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\n")
	cr := bufio.NewReader(conn)
	up101, err := http.ReadResponse(cr, nil)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(up101.StatusCode).To(Equal(http.StatusSwitchingProtocols))
	_, _ = io.WriteString(conn, "ping\n")
	echo, err := cr.ReadString('\n')
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(echo).To(Equal("echo: ping\n"))

	// Graceful shutdown with a request in flight.
	type result struct {
		body string
		err  error
	}
	done := make(chan result, 1)
	go func() {
		resp, err := httpClient.Get(s.proxy + "/slow")
		if err != nil {
			done <- result{err: err}
			return
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		done <- result{string(b), err}
	}()
	<-slowStarted
	s.stop(t)
	r := <-done
	g.Expect(r.err).NotTo(HaveOccurred())
	g.Expect(r.body).To(Equal("slow done"))
	g.Expect(s.Log()).To(ContainSubstring(`"msg":"sidecar stopped"`))
	_, err = http.Get(s.admin + "/healthz")
	g.Expect(err).To(HaveOccurred(), "every listener is closed after shutdown")
}
