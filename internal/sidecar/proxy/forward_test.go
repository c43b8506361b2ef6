package proxy_test

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/redline-dev/redline/internal/sidecar/decide"
	"github.com/redline-dev/redline/internal/sidecar/proxy"
	"github.com/redline-dev/redline/internal/testutil/fakemodel"
	"github.com/redline-dev/redline/internal/testutil/sidecartest"
	"github.com/redline-dev/redline/internal/tokens"
)

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
	opts := proxy.Options{Upstream: upstream, Engine: &decide.Engine{Limiter: sidecartest.FakeLimiter{Decide: byKey{}.Allow}}, Store: sidecartest.Store(t, 10, time.Minute), Headers: true}
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

// A streamed response whose request had a Content-Length reaches the client whole, every
// time: an application that answers once it has the whole body writes its headers back
// before the transport's last read of that body, which the server has closed by then; the
// transport then dropped the connection mid-stream (about 3 responses in 100 here).
func TestProxyStreamsEveryResponseWhole(t *testing.T) {
	model := fakemodel.New(fakemodel.Config{Length: 500})
	up := httptest.NewServer(model)
	defer up.Close()
	ts := httptest.NewServer(newProxy(t, up.Listener.Addr().String(), false))
	defer ts.Close()
	call := fakemodel.Call{Kind: tokens.OpenAIChat, Stream: true}
	direct, err := http.Post(up.URL+call.Path(), "application/json", bytes.NewReader(call.Body()))
	if err != nil {
		t.Fatal(err)
	}
	want, err := io.ReadAll(direct.Body)
	_ = direct.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	var cut []string
	for i := range 200 {
		res, err := http.Post(ts.URL+call.Path(), "application/json", bytes.NewReader(call.Body()))
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		got, err := io.ReadAll(res.Body)
		_ = res.Body.Close()
		if err != nil || !bytes.Equal(got, want) {
			cut = append(cut, fmt.Sprintf("#%d: %d of %d bytes, %v", i, len(got), len(want), err))
		}
	}
	if len(cut) > 0 {
		t.Errorf("%d of 200 streams not whole: %s", len(cut), strings.Join(cut, "; "))
	}
}

// An application that answers before it reads a large body (a 401, a 413) leaves the
// client's connection usable for its next request.
func TestEarlyAnswerKeepsTheConnection(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusUnauthorized)
		_, _ = io.WriteString(w, "no")
	}))
	defer up.Close()
	ts := httptest.NewServer(newProxy(t, up.Listener.Addr().String(), false))
	defer ts.Close()
	body := bytes.Repeat([]byte("x"), 300<<10)
	for i := range 50 {
		res, err := http.Post(ts.URL+"/a", "application/octet-stream", bytes.NewReader(body))
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		_, _ = io.ReadAll(res.Body)
		_ = res.Body.Close()
		if res.StatusCode != http.StatusUnauthorized {
			t.Fatalf("request %d: status %d", i, res.StatusCode)
		}
	}
}
