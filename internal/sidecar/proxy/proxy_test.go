package proxy_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"net/textproto"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/redline-dev/redline/internal/limiter"
	"github.com/redline-dev/redline/internal/sidecar/decide"
	"github.com/redline-dev/redline/internal/sidecar/proxy"
	"github.com/redline-dev/redline/internal/sidecar/sidecartest"
)

// byKey admits every key but "blocked".
type byKey struct{}

func (byKey) Allow(_ context.Context, key string, l limiter.Limit, _ int64) (limiter.Result, error) {
	if key == limiter.Key("ns", "p", "r", "blocked") {
		return limiter.Result{OverLimit: true, RetryAfter: 2500 * time.Millisecond, ResetAfter: l.Window, Source: limiter.SourceRedis}, nil
	}
	return limiter.Result{Allowed: true, Remaining: 7, ResetAfter: 30 * time.Second, Source: limiter.SourceRedis}, nil
}

func newProxy(t testing.TB, upstream string, headers bool) http.Handler {
	h, err := proxy.New(proxy.Options{Upstream: upstream, Engine: &decide.Engine{Limiter: byKey{}}, Store: sidecartest.Store(t, 10, time.Minute), Headers: headers})
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

// Tests of forwarding, over loopback with real servers on both sides: what a client and the
// application see of each other through the proxy.

// connCounter counts the connections an upstream server accepted and has open.
type connCounter struct{ opened, open atomic.Int64 }

func (c *connCounter) hook(_ net.Conn, s http.ConnState) {
	switch s {
	case http.StateNew:
		c.opened.Add(1)
		c.open.Add(1)
	case http.StateClosed, http.StateHijacked:
		c.open.Add(-1)
	}
}

func startUpstream(t *testing.T, h http.HandlerFunc) (*httptest.Server, *connCounter) {
	t.Helper()
	cc := &connCounter{}
	up := httptest.NewUnstartedServer(h)
	up.Config.ConnState = cc.hook
	up.Start()
	t.Cleanup(up.Close)
	return up, cc
}

func startProxy(t *testing.T, upstream string, mutate func(*proxy.Options)) (*httptest.Server, *proxy.Handler) {
	t.Helper()
	opts := proxy.Options{Upstream: upstream, Engine: &decide.Engine{Limiter: byKey{}}, Store: sidecartest.Store(t, 10, time.Minute), Headers: true}
	if mutate != nil {
		mutate(&opts)
	}
	h, err := proxy.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	front := httptest.NewServer(h)
	t.Cleanup(func() { front.Close(); h.Close() })
	return front, h
}

func do(t *testing.T, c *http.Client, req *http.Request) (*http.Response, string) {
	t.Helper()
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", req.Method, req.URL, err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatalf("reading %s %s: %v", req.Method, req.URL, err)
	}
	return resp, string(body)
}

func TestForwardedHeaders(t *testing.T) {
	type seenReq struct {
		host, uri, body string
		header          http.Header
	}
	seen := make(chan seenReq, 1)
	up, _ := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		seen <- seenReq{r.Host, r.RequestURI, string(b), r.Header.Clone()}
		w.Header().Set("Connection", "X-Internal")
		w.Header().Set("X-Internal", "hop")
		w.Header().Set("Keep-Alive", "timeout=5")
		w.Header().Set("X-App", "yes")
		_, _ = io.WriteString(w, "ok")
	})
	front, _ := startProxy(t, up.Listener.Addr().String(), nil)

	for name, body := range map[string]io.Reader{
		"no body":      nil,
		"sized body":   strings.NewReader("hello"),
		"chunked body": io.MultiReader(strings.NewReader("hel"), strings.NewReader("lo")),
	} {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			method := http.MethodGet
			if body != nil {
				method = http.MethodPost
			}
			req, _ := http.NewRequest(method, front.URL+"/a/b?c=d&e", body)
			req.Host = "shop.example"
			req.Header.Set("X-Key", "k")
			req.Header.Add("X-Forwarded-For", "9.9.9.9")
			req.Header.Add("X-Forwarded-For", "8.8.8.8")
			req.Header.Set("Connection", "X-Secret")
			req.Header.Set("X-Secret", "hop")
			req.Header.Set("Proxy-Authorization", "Basic Zm9vOmJhcg==")
			req.Header.Set("Te", "trailers")
			resp, got := do(t, front.Client(), req)
			g.Expect(resp.StatusCode).To(Equal(http.StatusOK))
			g.Expect(got).To(Equal("ok"))
			g.Expect(resp.Header.Get("X-App")).To(Equal("yes"))
			g.Expect(resp.Header.Get("X-Internal")).To(BeEmpty(), "a field the application's Connection names is hop-by-hop")
			g.Expect(resp.Header.Get("Keep-Alive")).To(BeEmpty())
			g.Expect(resp.Header.Get("RateLimit")).To(Equal(`"p/r";r=7;t=30`))

			s := <-seen
			g.Expect(s.host).To(Equal("shop.example"))
			g.Expect(s.uri).To(Equal("/a/b?c=d&e"))
			if body != nil {
				g.Expect(s.body).To(Equal("hello"))
			}
			g.Expect(s.header.Get("X-Forwarded-For")).To(Equal("9.9.9.9, 8.8.8.8, 127.0.0.1"))
			g.Expect(s.header.Get("X-Forwarded-Host")).To(Equal("shop.example"))
			g.Expect(s.header.Get("X-Forwarded-Proto")).To(Equal("http"))
			g.Expect(s.header.Get("X-Key")).To(Equal("k"))
			g.Expect(s.header).NotTo(HaveKey("X-Secret"), "a field the client's Connection names is hop-by-hop")
			g.Expect(s.header).NotTo(HaveKey("Proxy-Authorization"))
			g.Expect(s.header.Get("Te")).To(Equal("trailers"), "Te: trailers is the one Te value passed on")
		})
	}
}

func TestKeepsOneConnection(t *testing.T) {
	g := NewWithT(t)
	up, cc := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodHead {
			w.Header().Set("Content-Length", "5")
			return
		}
		_, _ = io.WriteString(w, "hello")
	})
	front, h := startProxy(t, up.Listener.Addr().String(), nil)
	for i := range 50 {
		method := http.MethodGet
		if i%5 == 0 {
			method = http.MethodHead
		}
		req, _ := http.NewRequest(method, front.URL+"/", nil)
		resp, body := do(t, front.Client(), req)
		g.Expect(resp.StatusCode).To(Equal(http.StatusOK))
		if method == http.MethodHead {
			g.Expect(body).To(BeEmpty())
			g.Expect(resp.ContentLength).To(Equal(int64(5)))
		} else {
			g.Expect(body).To(Equal("hello"))
		}
	}
	g.Expect(cc.opened.Load()).To(Equal(int64(1)), "50 sequential requests, HEAD among them, share one connection to the application")

	h.Close()
	g.Eventually(cc.open.Load).Should(BeZero(), "Close closes the idle connections")
}

// oneAnswerServer answers the first request on each connection and closes the connection on
// reading the second without answering it, like an application whose keep-alive timeout ran
// out at the wrong moment.
func oneAnswerServer(t *testing.T) (addr string, requests *atomic.Int64) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	requests = &atomic.Int64{}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				for i := 0; ; i++ {
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					_, _ = io.Copy(io.Discard, req.Body)
					requests.Add(1)
					if i > 0 {
						return
					}
					_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
				}
			}()
		}
	}()
	return ln.Addr().String(), requests
}

func TestRetriesOnlyReplayableRequests(t *testing.T) {
	g := NewWithT(t)
	addr, requests := oneAnswerServer(t)
	front, _ := startProxy(t, addr, nil)
	get := func(method string) int {
		req, _ := http.NewRequest(method, front.URL+"/", nil)
		resp, _ := do(t, front.Client(), req)
		return resp.StatusCode
	}
	g.Expect(get(http.MethodGet)).To(Equal(http.StatusOK)) // new connection, then kept
	g.Expect(get(http.MethodGet)).To(Equal(http.StatusOK), "the kept connection fails before any answer: a GET is sent again on a new one")
	g.Expect(requests.Load()).To(Equal(int64(3)))

	g.Expect(get(http.MethodDelete)).To(Equal(http.StatusBadGateway), "a DELETE the application may have seen is not sent twice")
	g.Expect(requests.Load()).To(Equal(int64(4)))
}

func TestDropsConnectionsTheApplicationClosed(t *testing.T) {
	g := NewWithT(t)
	up, cc := startUpstream(t, func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") })
	front, _ := startProxy(t, up.Listener.Addr().String(), nil)
	req, _ := http.NewRequest(http.MethodPost, front.URL+"/", nil) // not replayable
	resp, _ := do(t, front.Client(), req)
	g.Expect(resp.StatusCode).To(Equal(http.StatusOK))
	up.CloseClientConnections() // the application drops its idle keep-alive connections
	g.Eventually(cc.open.Load).Should(BeZero())
	// The transport's read loop of each idle connection sees the close on its own goroutine;
	// this models a close that happened a moment before the next request, not one crossing it
	// (that one fails for any HTTP/1.1 proxy, and is retried only if the request is replayable).
	time.Sleep(100 * time.Millisecond)
	req, _ = http.NewRequest(http.MethodPost, front.URL+"/", nil)
	resp, _ = do(t, front.Client(), req)
	g.Expect(resp.StatusCode).To(Equal(http.StatusOK), "the closed idle connection is noticed before use, so even a POST goes through")
	g.Expect(cc.opened.Load()).To(Equal(int64(2)))
}

func TestStreamsTrailersAndEarlyHints(t *testing.T) {
	g := NewWithT(t)
	release := make(chan struct{}, 1)
	up, _ := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/events", "/events-sized":
			w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
			if r.URL.Path == "/events-sized" {
				w.Header().Set("Content-Length", "22") // a stream of known length is still a stream
			}
			_, _ = io.WriteString(w, "data: one\n\n")
			w.(http.Flusher).Flush()
			<-release
			_, _ = io.WriteString(w, "data: two\n\n")
		case "/trailers":
			w.Header().Set("Trailer", "X-Checksum")
			_, _ = io.WriteString(w, "body")
			w.Header().Set("X-Checksum", "abc")
		case "/hints":
			w.Header().Set("Link", "</app.css>; rel=preload")
			w.WriteHeader(http.StatusEarlyHints)
			_, _ = io.WriteString(w, "final")
		}
	})
	front, _ := startProxy(t, up.Listener.Addr().String(), nil)
	t.Cleanup(func() { close(release) }) // before the servers close: frees a stream left waiting

	for _, path := range []string{"/events", "/events-sized"} {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, front.URL+path, nil)
		resp, err := front.Client().Do(req)
		g.Expect(err).NotTo(HaveOccurred())
		br := bufio.NewReader(resp.Body)
		first := make(chan string, 1)
		go func() { line, _ := br.ReadString('\n'); first <- line }()
		g.Eventually(first).WithTimeout(5*time.Second).Should(Receive(Equal("data: one\n")),
			"%s: the first event arrives while the application still holds the stream open", path)
		release <- struct{}{}
		rest, _ := io.ReadAll(br)
		resp.Body.Close()
		cancel()
		g.Expect(string(rest)).To(Equal("\ndata: two\n\n"), path)
	}

	req, _ := http.NewRequest(http.MethodGet, front.URL+"/trailers", nil)
	resp, body := do(t, front.Client(), req)
	g.Expect(body).To(Equal("body"))
	g.Expect(resp.Trailer.Get("X-Checksum")).To(Equal("abc"))

	var hints []int
	req, _ = http.NewRequestWithContext(withHints(context.Background(), &hints), http.MethodGet, front.URL+"/hints", nil)
	resp, body = do(t, front.Client(), req)
	g.Expect(resp.StatusCode).To(Equal(http.StatusOK))
	g.Expect(body).To(Equal("final"))
	g.Expect(hints).To(Equal([]int{http.StatusEarlyHints}))
}

func TestTimeoutsAndCancellation(t *testing.T) {
	g := NewWithT(t)
	cancelled := make(chan struct{}, 1)
	up, _ := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/slow":
			time.Sleep(300 * time.Millisecond)
		case "/hang":
			<-r.Context().Done()
			cancelled <- struct{}{}
		case "/huge-header":
			w.Header().Set("X-Huge", strings.Repeat("h", 2<<20))
		}
	})
	front, _ := startProxy(t, up.Listener.Addr().String(), func(o *proxy.Options) { o.ResponseHeaderTimeout = 100 * time.Millisecond })

	req, _ := http.NewRequest(http.MethodGet, front.URL+"/slow", nil)
	resp, _ := do(t, front.Client(), req)
	g.Expect(resp.StatusCode).To(Equal(http.StatusGatewayTimeout))

	// No response header timeout from here on (a slow machine may take longer than 100 ms to
	// send 2 MiB of header).
	front2, _ := startProxy(t, up.Listener.Addr().String(), nil)
	req, _ = http.NewRequest(http.MethodGet, front2.URL+"/huge-header", nil)
	resp, _ = do(t, front2.Client(), req)
	g.Expect(resp.StatusCode).To(Equal(http.StatusBadGateway), "a response header block over 1 MiB is refused")

	// A client that gives up cuts the application's request.
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	req, _ = http.NewRequestWithContext(ctx, http.MethodGet, front2.URL+"/hang", nil)
	_, err := front2.Client().Do(req)
	g.Expect(err).To(HaveOccurred())
	g.Eventually(cancelled).WithTimeout(5*time.Second).Should(Receive(), "the application sees its request cancelled")
}

func TestUnderConcurrency(t *testing.T) {
	g := NewWithT(t)
	up, cc := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, r.URL.Query().Get("i"))
	})
	front, _ := startProxy(t, up.Listener.Addr().String(), func(o *proxy.Options) { o.MaxIdleConns = 4 })
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 32}}
	var wg sync.WaitGroup
	var wrong atomic.Int64
	for w := range 32 {
		wg.Go(func() {
			for i := range 50 {
				want := fmt.Sprintf("%d-%d", w, i)
				resp, err := client.Get(front.URL + "/?i=" + want)
				if err != nil {
					wrong.Add(1)
					continue
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if string(b) != want {
					wrong.Add(1)
				}
			}
		})
	}
	wg.Wait()
	g.Expect(wrong.Load()).To(BeZero(), "every response goes back to the request it answers")
	g.Eventually(cc.open.Load).Should(BeNumerically("<=", 4), "idle connections beyond MaxIdleConns are closed")
}

// withHints records the informational status codes a client receives.
func withHints(ctx context.Context, codes *[]int) context.Context {
	return httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		Got1xxResponse: func(code int, _ textproto.MIMEHeader) error {
			*codes = append(*codes, code)
			return nil
		},
	})
}

func TestHTTP10AndTruncatedBodies(t *testing.T) {
	g := NewWithT(t)
	hosts := make(chan string, 1)
	up, _ := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/short" {
			// A stream of unknown length (chunked) that the application drops midway.
			_, _ = io.WriteString(w, "0123456789")
			w.(http.Flusher).Flush()
			conn, _, _ := http.NewResponseController(w).Hijack()
			_ = conn.Close()
			return
		}
		hosts <- r.Host
		_, _ = io.WriteString(w, "ok")
	})
	front, _ := startProxy(t, up.Listener.Addr().String(), nil)

	// An HTTP/1.0 request without Host reaches the application with the upstream's address,
	// as http.Transport would send it.
	conn, err := net.Dial("tcp", front.Listener.Addr().String())
	g.Expect(err).NotTo(HaveOccurred())
	defer conn.Close()
	_, err = io.WriteString(conn, "GET /old HTTP/1.0\r\nX-Key: k\r\n\r\n")
	g.Expect(err).NotTo(HaveOccurred())
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	g.Expect(err).NotTo(HaveOccurred())
	body, _ := io.ReadAll(resp.Body)
	g.Expect(resp.StatusCode).To(Equal(http.StatusOK))
	g.Expect(string(body)).To(Equal("ok"))
	g.Expect(<-hosts).To(Equal(up.Listener.Addr().String()))

	// A body cut short by the application reaches the client cut short, not complete.
	resp, err = front.Client().Get(front.URL + "/short")
	if err == nil {
		_, err = io.ReadAll(resp.Body)
		resp.Body.Close()
	}
	g.Expect(err).To(HaveOccurred(), "the client must not take a truncated body for a complete one")
}

// A refused request's body is read and dropped by the server, so the client's keep-alive
// connection carries its next request; the application never sees the refused one.
func TestRefusedRequestKeepsTheConnection(t *testing.T) {
	g := NewWithT(t)
	var paths []string
	var mu sync.Mutex
	up, _ := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		mu.Lock()
		paths = append(paths, r.URL.Path)
		mu.Unlock()
		_, _ = io.WriteString(w, "ok")
	})
	front, _ := startProxy(t, up.Listener.Addr().String(), nil)
	var opened atomic.Int64
	trace := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{
		GotConn: func(info httptrace.GotConnInfo) {
			if !info.Reused {
				opened.Add(1)
			}
		},
	})
	client := &http.Client{Transport: &http.Transport{}}
	t.Cleanup(client.CloseIdleConnections)
	body := strings.Repeat("x", 16<<10)
	for i, key := range []string{"k", "blocked", "k", "blocked", "k"} {
		req, _ := http.NewRequestWithContext(trace, http.MethodPost, fmt.Sprintf("%s/%d", front.URL, i), strings.NewReader(body))
		req.Header.Set("X-Key", key)
		resp, _ := do(t, client, req)
		want := http.StatusOK
		if key == "blocked" {
			want = http.StatusTooManyRequests
		}
		g.Expect(resp.StatusCode).To(Equal(want), "request %d", i)
	}
	g.Expect(opened.Load()).To(Equal(int64(1)), "all five requests, refusals among them, share one client connection")
	mu.Lock()
	defer mu.Unlock()
	g.Expect(paths).To(Equal([]string{"/0", "/2", "/4"}))
}

// Expect: 100-continue reaches the application, whose 100 Continue reaches the client before
// the body is sent.
func TestExpectContinue(t *testing.T) {
	g := NewWithT(t)
	up, _ := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body) // reading the body sends 100 Continue
		_, _ = fmt.Fprintf(w, "got %s", b)
	})
	front, _ := startProxy(t, up.Listener.Addr().String(), nil)
	conn, err := net.Dial("tcp", front.Listener.Addr().String())
	g.Expect(err).NotTo(HaveOccurred())
	defer func() { _ = conn.Close() }()
	_ = conn.SetDeadline(time.Now().Add(20 * time.Second))
	_, err = io.WriteString(conn, "POST /upload HTTP/1.1\r\nHost: app\r\nX-Key: k\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n")
	g.Expect(err).NotTo(HaveOccurred())
	br := bufio.NewReader(conn)
	interim, err := http.ReadResponse(br, nil)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(interim.StatusCode).To(Equal(http.StatusContinue), "the client is told to send its body before it has sent it")
	_, err = io.WriteString(conn, "hello")
	g.Expect(err).NotTo(HaveOccurred())
	final, err := http.ReadResponse(br, nil)
	g.Expect(err).NotTo(HaveOccurred())
	body, _ := io.ReadAll(final.Body)
	g.Expect(final.StatusCode).To(Equal(http.StatusOK))
	g.Expect(string(body)).To(Equal("got hello"))
}

// A protocol upgrade (WebSocket's mechanism) is tunnelled both ways after the 101.
func TestUpgrade(t *testing.T) {
	g := NewWithT(t)
	up, _ := startUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Upgrade") != "websocket" {
			http.Error(w, "want upgrade", http.StatusBadRequest)
			return
		}
		conn, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer func() { _ = conn.Close() }()
		_, _ = brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
		_ = brw.Flush()
		for {
			line, err := brw.ReadString('\n')
			if err != nil {
				return
			}
			_, _ = brw.WriteString("echo: " + line)
			_ = brw.Flush()
		}
	})
	front, _ := startProxy(t, up.Listener.Addr().String(), nil)
	conn, err := net.Dial("tcp", front.Listener.Addr().String())
	g.Expect(err).NotTo(HaveOccurred())
	defer func() { _ = conn.Close() }()
	_ = conn.SetDeadline(time.Now().Add(20 * time.Second))
	_, err = io.WriteString(conn, "GET /ws HTTP/1.1\r\nHost: app\r\nX-Key: k\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
	g.Expect(err).NotTo(HaveOccurred())
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(resp.StatusCode).To(Equal(http.StatusSwitchingProtocols))
	g.Expect(resp.Header.Get("Upgrade")).To(Equal("websocket"))
	for _, msg := range []string{"one\n", "two\n"} {
		_, err = io.WriteString(conn, msg)
		g.Expect(err).NotTo(HaveOccurred())
		echo, err := br.ReadString('\n')
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(echo).To(Equal("echo: " + msg))
	}
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
