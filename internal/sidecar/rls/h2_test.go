package rls_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	. "github.com/onsi/gomega"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/redline-dev/redline/internal/limiter"
	"github.com/redline-dev/redline/internal/sidecar/decide"
	"github.com/redline-dev/redline/internal/sidecar/rls"
	"github.com/redline-dev/redline/internal/sidecar/sidecartest"
)

// rawConn is an HTTP/2 client made of a bare Framer, to send what grpc-go never does.
type rawConn struct {
	t    testing.TB
	nc   net.Conn
	fr   *http2.Framer
	hbuf bytes.Buffer
	enc  *hpack.Encoder
}

func rawDial(t testing.TB, addr string, settings ...http2.Setting) *rawConn {
	t.Helper()
	nc, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	_ = nc.SetDeadline(time.Now().Add(20 * time.Second))
	c := &rawConn{t: t, nc: nc, fr: http2.NewFramer(nc, nc)}
	c.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	c.enc = hpack.NewEncoder(&c.hbuf)
	if _, err := io.WriteString(nc, http2.ClientPreface); err != nil {
		t.Fatal(err)
	}
	c.check(c.fr.WriteSettings(settings...))
	return c
}

func (c *rawConn) check(err error) {
	c.t.Helper()
	if err != nil {
		c.t.Fatal(err)
	}
}

// headers opens stream id with a gRPC request's headers for path.
func (c *rawConn) headers(id uint32, endStream bool, path string) {
	c.t.Helper()
	c.hbuf.Reset()
	for _, kv := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", path}, {":authority", "rls"},
		{"content-type", "application/grpc"}, {"te", "trailers"}} {
		c.check(c.enc.WriteField(hpack.HeaderField{Name: kv[0], Value: kv[1]}))
	}
	c.check(c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: c.hbuf.Bytes(), EndStream: endStream, EndHeaders: true}))
}

// next reads a frame, copying a DATA frame's payload, which the Framer reuses.
func (c *rawConn) next() (http2.Frame, []byte, error) {
	f, err := c.fr.ReadFrame()
	if err != nil {
		return nil, nil, err
	}
	if d, ok := f.(*http2.DataFrame); ok {
		return f, append([]byte(nil), d.Data()...), nil
	}
	return f, nil, nil
}

// until reads frames until match returns true for one, which it returns.
func (c *rawConn) until(match func(http2.Frame) bool) http2.Frame {
	c.t.Helper()
	for {
		f, _, err := c.next()
		if err != nil {
			c.t.Fatalf("reading frames: %v", err)
		}
		if match(f) {
			return f
		}
	}
}

// closed reports whether the server closes the connection within 5s, reading whatever comes
// before.
func (c *rawConn) closed() bool {
	_ = c.nc.SetReadDeadline(time.Now().Add(5 * time.Second))
	for {
		if _, _, err := c.next(); err != nil {
			var ne net.Error
			return !errors.As(err, &ne) || !ne.Timeout()
		}
	}
}

func rlsMessage(t testing.TB) []byte {
	msg, err := proto.Marshal(rlsRequest())
	if err != nil {
		t.Fatal(err)
	}
	return frame(0, msg)
}

// cancelLimiter holds each call until its context ends and reports that it did.
type cancelLimiter struct {
	entered chan struct{}
	ended   chan error
}

func (l *cancelLimiter) Allow(ctx context.Context, _ string, _ limiter.Limit, _ int64) (limiter.Result, error) {
	l.entered <- struct{}{}
	<-ctx.Done()
	l.ended <- ctx.Err()
	return limiter.Result{}, ctx.Err()
}

// A client's RST_STREAM (grpc-go cancelling a call) cancels the handler's context.
func TestH2ClientCancel(t *testing.T) {
	g := NewWithT(t)
	lim := &cancelLimiter{entered: make(chan struct{}, 1), ended: make(chan error, 1)}
	addr, _ := serve(t, &rls.Server{Engine: &decide.Engine{Limiter: lim}, Store: sidecartest.Store(t, 10, time.Minute)})
	conn := dial(t, addr)
	client := rlsv3.NewRateLimitServiceClient(conn)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := client.ShouldRateLimit(ctx, rlsRequest())
		done <- err
	}()
	g.Eventually(lim.entered).WithTimeout(10 * time.Second).Should(Receive())
	cancel()
	g.Eventually(lim.ended).WithTimeout(5 * time.Second).Should(Receive(MatchError(context.Canceled)))
	g.Eventually(done).WithTimeout(5 * time.Second).Should(Receive(WithTransform(status.Code, Equal(codes.Canceled))))
	// The connection goes on.
	resp, err := healthpb.NewHealthClient(conn).Check(ctxTimeout(t, 10*time.Second), &healthpb.HealthCheckRequest{})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(resp.Status).To(Equal(healthpb.HealthCheckResponse_SERVING))
}

// A request message of exactly 1 MiB passes both ways of flow control; one byte more is
// RESOURCE_EXHAUSTED.
func TestH2OneMiBMessage(t *testing.T) {
	g := NewWithT(t)
	addr, _ := serve(t, &rls.Server{Engine: &decide.Engine{Limiter: &countingLimiter{}}, Store: sidecartest.Store(t, 10, time.Minute)})
	client := rlsv3.NewRateLimitServiceClient(dial(t, addr))
	sized := func(n int) *rlsv3.RateLimitRequest {
		req := rlsRequest()
		for l := n - proto.Size(req); ; l-- {
			req.Domain = strings.Repeat("d", l)
			if proto.Size(req) <= n {
				break
			}
		}
		g.Expect(proto.Size(req)).To(Equal(n))
		return req
	}
	for range 3 { // several on one connection: the windows are given back
		_, err := client.ShouldRateLimit(ctxTimeout(t, 20*time.Second), sized(rls.MaxMessageSize))
		g.Expect(err).NotTo(HaveOccurred())
		_, err = client.ShouldRateLimit(ctxTimeout(t, 20*time.Second), sized(rls.MaxMessageSize+1))
		g.Expect(status.Code(err)).To(Equal(codes.ResourceExhausted))
	}

	// The same over a raw connection with the protocol's default windows: the message goes out
	// as the server's WINDOW_UPDATEs come.
	c := rawDial(t, addr)
	msg, err := proto.Marshal(sized(rls.MaxMessageSize))
	g.Expect(err).NotTo(HaveOccurred())
	body := frame(0, msg)
	c.headers(1, false, rls.ShouldRateLimitMethod)
	connWin, streamWin := 65535, 65535 // until the server's SETTINGS and WINDOW_UPDATE arrive
	var trailers *http2.MetaHeadersFrame
	for trailers == nil {
		for len(body) > 0 && min(connWin, streamWin) > 0 {
			n := min(len(body), connWin, streamWin, 16384)
			c.check(c.fr.WriteData(1, n == len(body), body[:n]))
			body, connWin, streamWin = body[n:], connWin-n, streamWin-n
		}
		f, _, err := c.next()
		g.Expect(err).NotTo(HaveOccurred())
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if v, ok := f.Value(http2.SettingInitialWindowSize); ok {
				streamWin += int(v) - 65535
			}
			if !f.IsAck() {
				c.check(c.fr.WriteSettingsAck())
			}
		case *http2.WindowUpdateFrame:
			if f.StreamID == 0 {
				connWin += int(f.Increment)
			} else {
				streamWin += int(f.Increment)
			}
		case *http2.MetaHeadersFrame:
			if f.StreamEnded() {
				trailers = f
			}
		case *http2.RSTStreamFrame, *http2.GoAwayFrame:
			t.Fatalf("unexpected %v", f)
		}
	}
	g.Expect(body).To(BeEmpty())
	g.Expect(trailers.PseudoValue("status")).To(BeEmpty(), "trailers, not Trailers-Only")
	for _, hf := range trailers.Fields {
		if hf.Name == "grpc-status" {
			g.Expect(hf.Value).To(Equal("0"))
		}
	}
}

// A client advertising a 10-byte stream window gets its whole answer, 10 bytes per
// WINDOW_UPDATE; PING is answered.
func TestH2TinyWindowAndPing(t *testing.T) {
	g := NewWithT(t)
	addr, _ := serve(t, &rls.Server{Engine: &decide.Engine{Limiter: &countingLimiter{}}, Store: sidecartest.Store(t, 10, time.Minute)})
	c := rawDial(t, addr, http2.Setting{ID: http2.SettingInitialWindowSize, Val: 10})

	c.check(c.fr.WritePing(false, [8]byte{1, 2, 3, 4, 5, 6, 7, 8}))
	ping := c.until(func(f http2.Frame) bool { _, ok := f.(*http2.PingFrame); return ok }).(*http2.PingFrame)
	g.Expect(ping.IsAck()).To(BeTrue())
	g.Expect(ping.Data).To(Equal([8]byte{1, 2, 3, 4, 5, 6, 7, 8}))

	c.headers(1, false, rls.ShouldRateLimitMethod)
	c.check(c.fr.WriteData(1, true, rlsMessage(t)))
	window, updates := 10, 0
	var body []byte
	var hdrs []*http2.MetaHeadersFrame
	for len(hdrs) < 2 {
		f, data, err := c.next()
		g.Expect(err).NotTo(HaveOccurred())
		switch f := f.(type) {
		case *http2.DataFrame:
			g.Expect(f.StreamID).To(Equal(uint32(1)))
			window -= len(data)
			g.Expect(window).To(BeNumerically(">=", 0), "DATA beyond the stream window")
			body = append(body, data...)
			if len(data) > 0 && !f.StreamEnded() {
				// Give the window back a little late, as a slow client would.
				time.Sleep(time.Millisecond)
				c.check(c.fr.WriteWindowUpdate(1, uint32(len(data))))
				window += len(data)
				updates++
			}
		case *http2.MetaHeadersFrame:
			hdrs = append(hdrs, f)
		case *http2.RSTStreamFrame, *http2.GoAwayFrame:
			t.Fatalf("unexpected %v", f)
		}
	}
	g.Expect(hdrs[0].PseudoValue("status")).To(Equal("200"))
	g.Expect(hdrs[1].StreamEnded()).To(BeTrue())
	g.Expect(updates).To(BeNumerically(">", 3), "the answer needed several windows")
	g.Expect(binary.BigEndian.Uint32(body[1:5])).To(Equal(uint32(len(body) - 5)))
	var resp rlsv3.RateLimitResponse
	g.Expect(proto.Unmarshal(body[5:], &resp)).To(Succeed())
	g.Expect(resp.OverallCode).To(Equal(rlsv3.RateLimitResponse_OK))
}

// An answer larger than the client's frame size and windows, through grpc-go.
func TestH2LargeAnswer(t *testing.T) {
	g := NewWithT(t)
	addr, _ := serve(t, &rls.Server{Engine: &decide.Engine{Limiter: &countingLimiter{}}, Store: sidecartest.Store(t, 1<<30, time.Minute)})
	client := rlsv3.NewRateLimitServiceClient(dial(t, addr))
	req := &rlsv3.RateLimitRequest{}
	for range rls.MaxDescriptors {
		req.Descriptors = append(req.Descriptors, desc("generic_key", "p/r", "k", strings.Repeat("v", 100)))
	}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			resp, err := client.ShouldRateLimit(ctxTimeout(t, 20*time.Second), req)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(resp.Statuses).To(HaveLen(rls.MaxDescriptors))
			g.Expect(proto.Size(resp)).To(BeNumerically(">", 65535))
		})
	}
	wg.Wait()
}

// Shutdown sends GOAWAY naming the last stream taken, refuses later streams, lets the call in
// flight answer, then closes the connection.
func TestH2ShutdownGoAway(t *testing.T) {
	g := NewWithT(t)
	lim := newBlockingLimiter()
	addr, hs := serve(t, &rls.Server{Engine: &decide.Engine{Limiter: lim}, Store: sidecartest.Store(t, 10, time.Minute)})
	c := rawDial(t, addr)
	idle := rawDial(t, addr)
	c.headers(1, false, rls.ShouldRateLimitMethod)
	c.check(c.fr.WriteData(1, true, rlsMessage(t)))
	g.Eventually(lim.entered).WithTimeout(10 * time.Second).Should(Receive())
	stopped := make(chan error, 1)
	go func() { stopped <- hs.Shutdown(ctxTimeout(t, 20*time.Second)) }()

	ga := c.until(func(f http2.Frame) bool { _, ok := f.(*http2.GoAwayFrame); return ok }).(*http2.GoAwayFrame)
	g.Expect(ga.LastStreamID).To(Equal(uint32(1)))
	g.Expect(ga.ErrCode).To(Equal(http2.ErrCodeNo))
	c.headers(3, false, rls.ShouldRateLimitMethod)
	rst := c.until(func(f http2.Frame) bool { _, ok := f.(*http2.RSTStreamFrame); return ok }).(*http2.RSTStreamFrame)
	g.Expect(rst.StreamID).To(Equal(uint32(3)))
	g.Expect(rst.ErrCode).To(Equal(http2.ErrCodeRefusedStream))
	g.Consistently(stopped).WithTimeout(200 * time.Millisecond).ShouldNot(Receive())

	g.Expect(idle.closed()).To(BeTrue(), "an idle connection is closed")
	close(lim.release)
	trailers := c.until(func(f http2.Frame) bool {
		h, ok := f.(*http2.MetaHeadersFrame)
		return ok && h.StreamEnded()
	}).(*http2.MetaHeadersFrame)
	g.Expect(trailers.StreamID).To(Equal(uint32(1)))
	g.Expect(c.closed()).To(BeTrue(), "closed once its last call answered")
	g.Eventually(stopped).WithTimeout(5 * time.Second).Should(Receive(BeNil()))
}

// Shutdown returns at its context's end when a call does not finish; Close ends it.
func TestH2ShutdownDeadline(t *testing.T) {
	g := NewWithT(t)
	lim := newBlockingLimiter()
	addr, hs := serve(t, &rls.Server{Engine: &decide.Engine{Limiter: lim}, Store: sidecartest.Store(t, 10, time.Minute)})
	c := rawDial(t, addr)
	c.headers(1, false, rls.ShouldRateLimitMethod)
	c.check(c.fr.WriteData(1, true, rlsMessage(t)))
	g.Eventually(lim.entered).WithTimeout(10 * time.Second).Should(Receive())
	g.Expect(hs.Shutdown(ctxTimeout(t, 200*time.Millisecond))).To(MatchError(context.DeadlineExceeded))
	g.Expect(hs.Close()).To(Succeed())
	g.Expect(c.closed()).To(BeTrue())
}

// What breaks the protocol ends the connection with GOAWAY and the error's code, or resets the
// stream; the client's mistakes on one stream leave the others alone.
func TestH2ProtocolErrors(t *testing.T) {
	addr, _ := serve(t, &rls.Server{Engine: &decide.Engine{Limiter: &countingLimiter{}}, Store: sidecartest.Store(t, 10, time.Minute)})
	goAway := func(t *testing.T, c *rawConn, code http2.ErrCode) {
		t.Helper()
		ga := c.until(func(f http2.Frame) bool { _, ok := f.(*http2.GoAwayFrame); return ok }).(*http2.GoAwayFrame)
		NewWithT(t).Expect(ga.ErrCode).To(Equal(code))
		NewWithT(t).Expect(c.closed()).To(BeTrue())
	}
	reset := func(t *testing.T, c *rawConn, id uint32, code http2.ErrCode) {
		t.Helper()
		rst := c.until(func(f http2.Frame) bool { r, ok := f.(*http2.RSTStreamFrame); return ok && r.StreamID == id }).(*http2.RSTStreamFrame)
		NewWithT(t).Expect(rst.ErrCode).To(Equal(code))
	}
	t.Run("even stream id", func(t *testing.T) {
		c := rawDial(t, addr)
		c.headers(2, true, rls.ShouldRateLimitMethod)
		goAway(t, c, http2.ErrCodeProtocol)
	})
	t.Run("decreasing stream id", func(t *testing.T) {
		c := rawDial(t, addr)
		c.headers(5, true, rls.HealthCheckMethod)
		c.headers(3, false, rls.HealthCheckMethod)
		goAway(t, c, http2.ErrCodeProtocol)
	})
	t.Run("DATA on an idle stream", func(t *testing.T) {
		c := rawDial(t, addr)
		c.check(c.fr.WriteData(7, true, []byte("x")))
		goAway(t, c, http2.ErrCodeProtocol)
	})
	t.Run("first frame not SETTINGS", func(t *testing.T) {
		nc, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		c := &rawConn{t: t, nc: nc, fr: http2.NewFramer(nc, nc)}
		t.Cleanup(func() { nc.Close() })
		_, _ = io.WriteString(nc, http2.ClientPreface)
		c.check(c.fr.WritePing(false, [8]byte{}))
		goAway(t, c, http2.ErrCodeProtocol)
	})
	t.Run("frame over the max frame size", func(t *testing.T) {
		c := rawDial(t, addr)
		c.headers(1, false, rls.ShouldRateLimitMethod)
		c.check(c.fr.WriteData(1, true, make([]byte, 16385)))
		goAway(t, c, http2.ErrCodeFrameSize)
	})
	t.Run("window overflow", func(t *testing.T) {
		c := rawDial(t, addr)
		c.check(c.fr.WriteWindowUpdate(0, 1<<31-1))
		goAway(t, c, http2.ErrCodeFlowControl)
	})
	t.Run("stream errors", func(t *testing.T) {
		g := NewWithT(t)
		c := rawDial(t, addr)
		// DATA after END_STREAM.
		c.headers(1, true, rls.HealthCheckMethod)
		c.check(c.fr.WriteData(1, false, []byte("x")))
		reset(t, c, 1, http2.ErrCodeStreamClosed)
		// Trailers without END_STREAM.
		c.headers(3, false, rls.HealthCheckMethod)
		c.headers(3, false, rls.HealthCheckMethod)
		reset(t, c, 3, http2.ErrCodeProtocol)
		// A stream window overflow.
		c.headers(5, false, rls.HealthCheckMethod)
		c.check(c.fr.WriteWindowUpdate(5, 1<<31-1))
		reset(t, c, 5, http2.ErrCodeFlowControl)
		// No :path.
		c.hbuf.Reset()
		c.check(c.enc.WriteField(hpack.HeaderField{Name: ":method", Value: "POST"}))
		c.check(c.enc.WriteField(hpack.HeaderField{Name: ":scheme", Value: "http"}))
		c.check(c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 7, BlockFragment: c.hbuf.Bytes(), EndStream: true, EndHeaders: true}))
		reset(t, c, 7, http2.ErrCodeProtocol)
		// RST_STREAM of a closed stream, PRIORITY, unknown frames and DATA for a stream already
		// answered are ignored; the connection serves on, a header block in CONTINUATIONs too.
		c.check(c.fr.WriteRSTStream(1, http2.ErrCodeCancel))
		c.check(c.fr.WritePriority(9, http2.PriorityParam{StreamDep: 1, Weight: 3}))
		c.check(c.fr.WriteRawFrame(0xee, 0, 0, []byte("unknown")))
		c.hbuf.Reset()
		for _, kv := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", rls.HealthCheckMethod}, {":authority", "rls"}, {"content-type", "application/grpc"}, {"x-pad", strings.Repeat("p", 40)}} {
			c.check(c.enc.WriteField(hpack.HeaderField{Name: kv[0], Value: kv[1]}))
		}
		block := c.hbuf.Bytes()
		c.check(c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 9, BlockFragment: block[:3]}))
		c.check(c.fr.WriteContinuation(9, false, block[3:6]))
		c.check(c.fr.WriteContinuation(9, true, block[6:]))
		c.check(c.fr.WriteData(9, true, frame(0, nil)))
		trailers := c.until(func(f http2.Frame) bool { h, ok := f.(*http2.MetaHeadersFrame); return ok && h.StreamEnded() }).(*http2.MetaHeadersFrame)
		g.Expect(trailers.StreamID).To(Equal(uint32(9)))
		g.Expect(trailers.Fields).To(ContainElement(hpack.HeaderField{Name: "grpc-status", Value: "0"}))
	})
	t.Run("bad preface", func(t *testing.T) {
		g := NewWithT(t)
		nc, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		_, _ = io.WriteString(nc, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
		_ = nc.SetReadDeadline(time.Now().Add(5 * time.Second))
		n, err := nc.Read(make([]byte, 100))
		g.Expect(n).To(BeZero())
		g.Expect(err).To(MatchError(io.EOF))
	})
}

// A connection that never sends its preface is closed after ReadHeaderTimeout; one without
// calls after IdleTimeout, with GOAWAY.
func TestH2Timeouts(t *testing.T) {
	g := NewWithT(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	g.Expect(err).NotTo(HaveOccurred())
	hs := rls.NewHTTPServer(&rls.Server{Engine: &decide.Engine{Limiter: &countingLimiter{}}, Store: sidecartest.Store(t, 10, time.Minute)})
	hs.ReadHeaderTimeout, hs.IdleTimeout = 200*time.Millisecond, 300*time.Millisecond
	go func() { _ = hs.Serve(ln) }()
	t.Cleanup(func() { _ = hs.Close() })

	silent, err := net.Dial("tcp", ln.Addr().String())
	g.Expect(err).NotTo(HaveOccurred())
	defer silent.Close()
	start := time.Now()
	_ = silent.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err = silent.Read(make([]byte, 1))
	g.Expect(err).To(MatchError(io.EOF))
	g.Expect(time.Since(start)).To(BeNumerically("<", 3*time.Second))

	c := rawDial(t, ln.Addr().String())
	c.headers(1, true, rls.HealthCheckMethod)
	c.until(func(f http2.Frame) bool { h, ok := f.(*http2.MetaHeadersFrame); return ok && h.StreamEnded() })
	time.Sleep(400 * time.Millisecond) // past ReadHeaderTimeout: the handshake's deadline is gone
	ga := c.until(func(f http2.Frame) bool { _, ok := f.(*http2.GoAwayFrame); return ok }).(*http2.GoAwayFrame)
	g.Expect(ga.ErrCode).To(Equal(http2.ErrCodeNo))
	g.Expect(ga.LastStreamID).To(Equal(uint32(1)))
}

// The connection's reader never waits for a handler: calls blocked in the limiter do not stop
// others on the same connection, nor PING.
func TestH2SlowHandlersDoNotBlock(t *testing.T) {
	g := NewWithT(t)
	lim := &cancelLimiter{entered: make(chan struct{}, 100), ended: make(chan error, 100)}
	addr, _ := serve(t, &rls.Server{Engine: &decide.Engine{Limiter: lim}, Store: sidecartest.Store(t, 10, time.Minute)})
	c := rawDial(t, addr)
	for id := uint32(1); id < 20; id += 2 {
		c.headers(id, false, rls.ShouldRateLimitMethod)
		c.check(c.fr.WriteData(id, true, rlsMessage(t)))
	}
	for range 10 {
		g.Eventually(lim.entered).WithTimeout(10 * time.Second).Should(Receive())
	}
	c.headers(21, false, rls.HealthCheckMethod)
	c.check(c.fr.WriteData(21, true, frame(0, nil)))
	c.check(c.fr.WritePing(false, [8]byte{9}))
	pinged, answered := false, false
	c.until(func(f http2.Frame) bool {
		switch f := f.(type) {
		case *http2.PingFrame:
			pinged = pinged || f.IsAck()
		case *http2.MetaHeadersFrame:
			answered = answered || (f.StreamID == 21 && f.StreamEnded())
		}
		return pinged && answered
	})
	c.check(c.fr.WriteRSTStream(1, http2.ErrCodeCancel))
	g.Eventually(lim.ended).WithTimeout(5 * time.Second).Should(Receive(MatchError(context.Canceled)))
}

// pipeListener hands out the server ends of net.Pipe connections.
type pipeListener struct {
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
}

func (l *pipeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *pipeListener) Close() error   { l.once.Do(func() { close(l.done) }); return nil }
func (l *pipeListener) Addr() net.Addr { return &net.UnixAddr{Name: "pipe", Net: "pipe"} }

// fuzzSeeds are frame sequences a client could send after the preface.
func fuzzSeeds(t testing.TB) [][]byte {
	var seeds [][]byte
	msg := rlsMessage(t)
	add := func(write func(c *rawConn)) {
		var b bytes.Buffer
		c := &rawConn{t: t, fr: http2.NewFramer(&b, nil)}
		c.enc = hpack.NewEncoder(&c.hbuf)
		c.check(c.fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 10}))
		write(c)
		seeds = append(seeds, b.Bytes())
	}
	add(func(c *rawConn) {
		c.headers(1, false, rls.ShouldRateLimitMethod)
		c.check(c.fr.WriteData(1, true, msg))
		c.check(c.fr.WriteWindowUpdate(1, 100))
		c.check(c.fr.WriteWindowUpdate(0, 100))
	})
	add(func(c *rawConn) {
		c.headers(1, false, rls.HealthCheckMethod)
		c.check(c.fr.WritePing(false, [8]byte{1}))
		c.check(c.fr.WriteRSTStream(1, http2.ErrCodeCancel))
		c.headers(3, true, rls.HealthCheckMethod)
		c.check(c.fr.WriteGoAway(0, http2.ErrCodeNo, nil))
	})
	add(func(c *rawConn) {
		c.headers(1, false, rls.ShouldRateLimitMethod)
		c.check(c.fr.WriteData(1, false, msg[:3]))
		c.headers(1, true, rls.ShouldRateLimitMethod)
		c.check(c.fr.WriteSettings(http2.Setting{ID: http2.SettingMaxFrameSize, Val: 16384}, http2.Setting{ID: http2.SettingHeaderTableSize, Val: 0}))
	})
	return seeds
}

// toRecords turns HTTP/2 frames into the fuzz target's frame records: type, flags, the stream
// id's low byte and a 2-byte payload length, then the payload.
func toRecords(frames []byte) []byte {
	var out []byte
	for len(frames) >= 9 {
		n := int(frames[0])<<16 | int(frames[1])<<8 | int(frames[2])
		out = append(out, frames[3], frames[4], frames[8], byte(n>>8), byte(n))
		out = append(out, frames[9:9+n]...)
		frames = frames[9+n:]
	}
	return out
}

// fromRecords builds well-framed HTTP/2 frames from records, so that the fuzzer mutates frame
// fields and payloads rather than lengths.
func fromRecords(in []byte) []byte {
	var out []byte
	for len(in) >= 5 {
		typ, flags, id := in[0], in[1], in[2]
		n := min(int(in[3])<<8|int(in[4]), len(in)-5)
		out = append(out, byte(n>>16), byte(n>>8), byte(n), typ, flags, 0, 0, 0, id)
		out = append(out, in[5:5+n]...)
		in = in[5+n:]
	}
	return out
}

// Random frames after a valid preface never crash the server nor leave it hanging: once the
// client closes, Shutdown finds no connection left. Inputs are raw bytes, or frame records.
func FuzzH2Server(f *testing.F) {
	for _, s := range fuzzSeeds(f) {
		f.Add(true, s)
		f.Add(false, toRecords(s))
	}
	store := sidecartest.Store(f, 10, time.Minute)
	f.Fuzz(func(t *testing.T, raw bool, in []byte) {
		if !raw {
			in = fromRecords(in)
		}
		hs := rls.NewHTTPServer(&rls.Server{Engine: &decide.Engine{Limiter: &countingLimiter{}}, Store: store})
		ln := &pipeListener{conns: make(chan net.Conn, 1), done: make(chan struct{})}
		served := make(chan error, 1)
		go func() { served <- hs.Serve(ln) }()
		client, server := net.Pipe()
		ln.conns <- server
		go func() { _, _ = io.Copy(io.Discard, client) }()
		_ = client.SetWriteDeadline(time.Now().Add(5 * time.Second))
		if _, err := client.Write(append([]byte(http2.ClientPreface), in...)); err != nil && !errors.Is(err, io.ErrClosedPipe) {
			t.Fatalf("writing: %v", err) // a deadline: the server stopped reading without closing
		}
		time.Sleep(time.Millisecond)
		client.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := hs.Shutdown(ctx); err != nil {
			t.Fatalf("the connection did not end: %v", err)
		}
		if err := <-served; !errors.Is(err, http.ErrServerClosed) {
			t.Fatalf("Serve: %v", err)
		}
	})
}

// Past 1000 calls running on a connection, new streams are refused (REFUSED_STREAM: the client
// may retry them), as the SETTINGS say; a call ending makes room again.
func TestH2TooManyStreams(t *testing.T) {
	g := NewWithT(t)
	lim := &cancelLimiter{entered: make(chan struct{}, 1001), ended: make(chan error, 1001)}
	addr, _ := serve(t, &rls.Server{Engine: &decide.Engine{Limiter: lim}, Store: sidecartest.Store(t, 10, time.Minute)})
	c := rawDial(t, addr)
	settings := c.until(func(f http2.Frame) bool { s, ok := f.(*http2.SettingsFrame); return ok && !s.IsAck() }).(*http2.SettingsFrame)
	v, ok := settings.Value(http2.SettingMaxConcurrentStreams)
	g.Expect(ok).To(BeTrue())
	g.Expect(v).To(Equal(uint32(1000)))
	msg := rlsMessage(t)
	resets := make(chan http2.RSTStreamFrame, 10)
	go func() { // keep reading, so that the server's writes never block
		for {
			f, _, err := c.next()
			if err != nil {
				return
			}
			if r, ok := f.(*http2.RSTStreamFrame); ok {
				resets <- *r
			}
		}
	}()
	for id := uint32(1); id <= 2001; id += 2 {
		c.headers(id, false, rls.ShouldRateLimitMethod)
		c.check(c.fr.WriteData(id, true, msg))
	}
	for range 1000 {
		g.Eventually(lim.entered).WithTimeout(10 * time.Second).Should(Receive())
	}
	var rst http2.RSTStreamFrame
	g.Eventually(resets).WithTimeout(5 * time.Second).Should(Receive(&rst))
	g.Expect(rst.StreamID).To(Equal(uint32(2001)))
	g.Expect(rst.ErrCode).To(Equal(http2.ErrCodeRefusedStream))
	g.Expect(lim.entered).NotTo(Receive())
	c.check(c.fr.WriteRSTStream(1, http2.ErrCodeCancel))
	g.Eventually(lim.ended).WithTimeout(5 * time.Second).Should(Receive())
	c.headers(2003, false, rls.ShouldRateLimitMethod)
	c.check(c.fr.WriteData(2003, true, msg))
	g.Eventually(lim.entered).WithTimeout(5*time.Second).Should(Receive(), "room again")
}
