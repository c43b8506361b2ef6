package sidecar_test

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/redline-dev/redline/internal/testutil/sidecartest"
)

// Attacks on the proxy face from the client's side, against the built binary with the
// timeouts and limits it is configured with. net/http parses and bounds every request; these
// tests pin down that what reaches the application is only what the sidecar decided, framed
// as the sidecar framed it.

// seenRequest is what the application received.
type seenRequest struct {
	Method, Path, Host string
	Header             http.Header
	Body               string
}

// recordingApp records every request that reaches it.
type recordingApp struct {
	*httptest.Server
	mu   sync.Mutex
	seen []seenRequest
}

func newRecordingApp(t *testing.T) *recordingApp {
	a := &recordingApp{}
	a.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		a.mu.Lock()
		a.seen = append(a.seen, seenRequest{r.Method, r.URL.Path, r.Host, r.Header.Clone(), string(body)})
		a.mu.Unlock()
		_, _ = io.WriteString(w, "app "+r.URL.Path)
	}))
	t.Cleanup(a.Close)
	return a
}

func (a *recordingApp) requests() []seenRequest {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]seenRequest(nil), a.seen...)
}

// exchange writes raw bytes on a new connection to addr and returns the responses the sidecar
// sent before closing the connection. raw must end in a request that makes the sidecar close
// (Connection: close) or in one it refuses.
func exchange(t *testing.T, addr, raw string) []*http.Response {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	_ = conn.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := io.WriteString(conn, raw); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(conn)
	var out []*http.Response
	for {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				t.Fatalf("the sidecar neither answered nor closed the connection: %v", err)
			}
			return out
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body = io.NopCloser(strings.NewReader(string(body)))
		out = append(out, resp)
	}
}

func statuses(rs []*http.Response) []int {
	out := make([]int, 0, len(rs))
	for _, r := range rs {
		out = append(out, r.StatusCode)
	}
	return out
}

// Ambiguous framing and header tricks never let a request reach the application undecided,
// nor with a meaning the sidecar did not give it. The policy admits one request per key, so a
// request smuggled past the decision would show as a second request of its key at the
// application, or as its path /smuggled.
func TestRequestSmugglingThroughTheSidecar(t *testing.T) {
	e := newEnv(t, "web")
	e.write(t, sidecartest.Document(e.namespace, "p", "r", "web", 1, time.Minute, "x-key", "Closed"))
	app := newRecordingApp(t)
	s := start(t, "pod-smuggle", e, shared.URL(), app.Listener.Addr().String(), true)
	addr := strings.TrimPrefix(s.proxy, "http://")
	// After the smuggled request, one of another key that closes the connection.
	smuggled := "GET /smuggled HTTP/1.1\r\nHost: app\r\nX-Key: %[1]s\r\n\r\n" +
		"GET /end HTTP/1.1\r\nHost: app\r\nX-Key: end-%[1]s\r\nConnection: close\r\n\r\n"

	for _, tc := range []struct{ name, raw string }{
		{"Content-Length and Transfer-Encoding", "POST /a HTTP/1.1\r\nHost: app\r\nX-Key: %[1]s\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + smuggled},
		{"Transfer-Encoding and Content-Length", "POST /a HTTP/1.1\r\nHost: app\r\nX-Key: %[1]s\r\nTransfer-Encoding: chunked\r\nContent-Length: 60\r\n\r\n0\r\n\r\n" + smuggled},
		{"two Content-Lengths", "POST /a HTTP/1.1\r\nHost: app\r\nX-Key: %[1]s\r\nContent-Length: 0\r\nContent-Length: 46\r\n\r\n" + smuggled},
		{"Transfer-Encoding not ending in chunked", "POST /a HTTP/1.1\r\nHost: app\r\nX-Key: %[1]s\r\nTransfer-Encoding: chunked, identity\r\n\r\n0\r\n\r\n" + smuggled},
		{"obfuscated Transfer-Encoding", "POST /a HTTP/1.1\r\nHost: app\r\nX-Key: %[1]s\r\nTransfer-Encoding : chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n" + smuggled},
		{"chunk size overflow", "POST /a HTTP/1.1\r\nHost: app\r\nX-Key: %[1]s\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffff1\r\n\r\n0\r\n\r\n" + smuggled},
		{"obs-fold", "GET /a HTTP/1.1\r\nHost: app\r\nX-Key: %[1]s\r\nX-Fold: f\r\n X-Evil: 1\r\nX-Other: o\r\n\tTransfer-Encoding: chunked\r\n\r\n" + smuggled},
		{"bare CR in a field", "GET /a HTTP/1.1\r\nHost: app\r\nX-Key: %[1]s\rX-Evil: 1\r\n\r\n" + smuggled},
		{"no Host in HTTP/1.1", "GET /a HTTP/1.1\r\nX-Key: %[1]s\r\n\r\n" + smuggled},
		{"two Hosts", "GET /a HTTP/1.1\r\nHost: app\r\nHost: other\r\nX-Key: %[1]s\r\n\r\n" + smuggled},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			key := fmt.Sprintf("key-%d", time.Now().UnixNano())
			before := len(app.requests())
			responses := exchange(t, addr, fmt.Sprintf(tc.raw, key))
			for _, r := range responses {
				g.Expect(r.StatusCode).To(BeElementOf(http.StatusOK, http.StatusBadRequest, http.StatusNotImplemented, http.StatusTooManyRequests),
					"every answer is the application's, a refusal of the request, or the limit's")
			}
			var ofKey []seenRequest
			for _, r := range app.requests()[before:] {
				g.Expect(r.Path).NotTo(Equal("/smuggled"), "a smuggled request reached the application past the limit")
				g.Expect(r.Header).NotTo(HaveKey("X-Evil"), "a header hidden in another reached the application as its own")
				g.Expect(r.Header.Values("Transfer-Encoding")).To(BeEmpty(), "net/http removes the field once it decoded the body")
				for _, vv := range r.Header {
					for _, v := range vv {
						g.Expect(strings.ContainsAny(v, "\r\n")).To(BeFalse(), "field value %q", v)
					}
				}
				if r.Header.Get("X-Key") == key {
					ofKey = append(ofKey, r)
				}
			}
			g.Expect(len(ofKey)).To(BeNumerically("<=", 1), "the limit admits one request of the key: %v", statuses(responses))
		})
	}

	// The sidecar keeps serving.
	req, _ := http.NewRequest(http.MethodGet, s.proxy+"/after", nil)
	req.Header.Set("X-Key", "after")
	resp, err := httpClient.Do(req)
	NewWithT(t).Expect(err).NotTo(HaveOccurred())
	_ = resp.Body.Close()
	NewWithT(t).Expect(resp.StatusCode).To(Equal(http.StatusOK))
}

// A header block larger than --max-header-bytes is answered 431 and never forwarded.
func TestOversizedRequestHeaders(t *testing.T) {
	g := NewWithT(t)
	e := newEnv(t, "web")
	e.write(t, sidecartest.Document(e.namespace, "p", "r", "web", 1000, time.Minute, "x-key", "Open"))
	app := newRecordingApp(t)
	s := start(t, "pod-headers", e, shared.URL(), app.Listener.Addr().String(), true, "--max-header-bytes=8192")
	addr := strings.TrimPrefix(s.proxy, "http://")

	rs := exchange(t, addr, "GET /big HTTP/1.1\r\nHost: app\r\nX-Key: k\r\nX-Big: "+strings.Repeat("b", 64<<10)+"\r\n\r\n")
	g.Expect(statuses(rs)).To(Equal([]int{http.StatusRequestHeaderFieldsTooLarge}))
	rs = exchange(t, addr, "GET /many HTTP/1.1\r\nHost: app\r\nX-Key: k\r\n"+strings.Repeat("X-Many: m\r\n", 4096)+"\r\n")
	g.Expect(statuses(rs)).To(Equal([]int{http.StatusRequestHeaderFieldsTooLarge}))
	rs = exchange(t, addr, "GET /fits HTTP/1.1\r\nHost: app\r\nX-Key: k\r\nX-Fits: "+strings.Repeat("f", 4000)+"\r\nConnection: close\r\n\r\n")
	g.Expect(statuses(rs)).To(Equal([]int{http.StatusOK}), "a header block within the limit passes")
	var paths []string
	for _, r := range app.requests() {
		paths = append(paths, r.Path)
	}
	g.Expect(paths).To(Equal([]string{"/fits"}))
}

// Slow clients (slowloris) are cut at --read-header-timeout, and idle keep-alive connections at
// --idle-timeout, while other clients keep being served.
func TestSlowClientsAreCut(t *testing.T) {
	g := NewWithT(t)
	e := newEnv(t, "web")
	e.write(t, sidecartest.Document(e.namespace, "p", "r", "web", 1000, time.Minute, "x-key", "Open"))
	app := newRecordingApp(t)
	s := start(t, "pod-slow", e, shared.URL(), app.Listener.Addr().String(), true,
		"--read-header-timeout=500ms", "--idle-timeout=500ms")
	addr := strings.TrimPrefix(s.proxy, "http://")

	// closedBySidecar reports whether the sidecar closed conn (EOF or reset) before our own,
	// generous, deadline.
	closedBySidecar := func(conn net.Conn) error {
		_ = conn.SetReadDeadline(time.Now().Add(20 * time.Second))
		_, err := io.Copy(io.Discard, conn)
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return fmt.Errorf("still open: %w", err)
		}
		return nil
	}

	const slow = 20
	var stopped atomic.Bool
	errs := make(chan error, slow)
	var wg sync.WaitGroup
	for i := range slow {
		conn, err := net.Dial("tcp", addr)
		g.Expect(err).NotTo(HaveOccurred())
		t.Cleanup(func() { _ = conn.Close() })
		wg.Go(func() {
			// Trickle the header block a byte at a time, never finishing it.
			go func() {
				for !stopped.Load() {
					if _, err := conn.Write([]byte{'a' + byte(i%26)}); err != nil {
						return
					}
					time.Sleep(50 * time.Millisecond)
				}
			}()
			_, _ = io.WriteString(conn, "GET /slow HTTP/1.1\r\nHost: app\r\nX-Trickle: ")
			errs <- closedBySidecar(conn)
		})
	}
	// A legitimate client is served meanwhile.
	req, _ := http.NewRequest(http.MethodGet, s.proxy+"/legit", nil)
	req.Header.Set("X-Key", "k")
	resp, err := httpClient.Do(req)
	g.Expect(err).NotTo(HaveOccurred())
	_ = resp.Body.Close()
	g.Expect(resp.StatusCode).To(Equal(http.StatusOK))

	wg.Wait()
	stopped.Store(true)
	close(errs)
	for err := range errs {
		g.Expect(err).NotTo(HaveOccurred(), "a client that never finishes its header block is cut")
	}

	// An idle keep-alive connection is closed after --idle-timeout.
	conn, err := net.Dial("tcp", addr)
	g.Expect(err).NotTo(HaveOccurred())
	defer func() { _ = conn.Close() }()
	_, err = io.WriteString(conn, "GET /idle HTTP/1.1\r\nHost: app\r\nX-Key: k\r\n\r\n")
	g.Expect(err).NotTo(HaveOccurred())
	br := bufio.NewReader(conn)
	first, err := http.ReadResponse(br, nil)
	g.Expect(err).NotTo(HaveOccurred())
	_, _ = io.Copy(io.Discard, first.Body)
	g.Expect(first.StatusCode).To(Equal(http.StatusOK))
	_ = conn.SetReadDeadline(time.Now().Add(20 * time.Second))
	_, err = br.ReadByte()
	g.Expect(err).To(MatchError(io.EOF), "the sidecar closes an idle keep-alive connection")

	var paths []string
	for _, r := range app.requests() {
		paths = append(paths, r.Path)
	}
	g.Expect(paths).To(ConsistOf("/legit", "/idle"), "no slow request reached the application")
}

// The proxy connects to its application and nowhere else, whatever the request names: an
// absolute-form target or CONNECT to another address on loopback (another container of the pod,
// or a node-local service) is sent to the application, never to that address.
func TestProxyConnectsOnlyToItsApplication(t *testing.T) {
	g := NewWithT(t)
	e := newEnv(t, "web")
	e.write(t, sidecartest.Document(e.namespace, "p", "r", "web", 1000, time.Minute, "x-key", "Open"))
	app := newRecordingApp(t)
	var reached atomic.Int64
	internal := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "internal secret")
	}))
	internal.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			reached.Add(1)
		}
	}
	internal.Start()
	t.Cleanup(internal.Close)
	other := internal.Listener.Addr().String()
	s := start(t, "pod-ssrf", e, shared.URL(), app.Listener.Addr().String(), true)
	addr := strings.TrimPrefix(s.proxy, "http://")

	for _, raw := range []string{
		"GET http://" + other + "/secret HTTP/1.1\r\nHost: " + other + "\r\nX-Key: k\r\nConnection: close\r\n\r\n",
		"CONNECT " + other + " HTTP/1.1\r\nHost: " + other + "\r\nX-Key: k\r\nConnection: close\r\n\r\n",
		"GET //" + other + "/secret HTTP/1.1\r\nHost: app\r\nX-Key: k\r\nConnection: close\r\n\r\n",
	} {
		for _, r := range exchange(t, addr, raw) {
			body, _ := io.ReadAll(r.Body)
			g.Expect(string(body)).NotTo(ContainSubstring("internal secret"))
		}
	}
	g.Expect(reached.Load()).To(BeZero(), "the sidecar opened a connection to an address other than its application")
	g.Expect(app.requests()).NotTo(BeEmpty(), "the requests went to the application")
}
