package proxy_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/textproto"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/redline-dev/redline/internal/sidecar/proxy"
)

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
	// HTTP allows more interim responses before the final one: the application's own 100 may
	// come after the one net/http sent when the proxy began to read the body (the transport
	// sends the body after ExpectContinueTimeout without waiting for the application's).
	final, err := http.ReadResponse(br, nil)
	for err == nil && final.StatusCode == http.StatusContinue {
		final, err = http.ReadResponse(br, nil)
	}
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
