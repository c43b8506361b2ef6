package rls

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"log"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// HTTPServer is a cleartext HTTP/2 server with prior knowledge (h2c, RFC 9113), made for the
// unary calls of the gRPC face: small messages, many concurrent streams per connection. It
// replaces net/http's HTTP/2 server, which writes an answer as three frames, each handed to the
// connection's goroutine and flushed on its own; here a handler's answer (HEADERS, DATA and
// trailers) is encoded into the connection's buffer under its write lock and flushed once.
//
// Each stream's handler runs on its own goroutine with a minimal *http.Request (Method, URL,
// Host, Header, Body and the stream's context) and a buffering http.ResponseWriter whose
// trailers are the header keys with http.TrailerPrefix. Answers are encoded when the handler
// returns: a handler that writes no body and sets no trailers answers Trailers-Only.
type HTTPServer struct {
	Handler http.Handler
	// ReadHeaderTimeout bounds the wait for the client's preface and first SETTINGS frame.
	ReadHeaderTimeout time.Duration
	// IdleTimeout, if positive, closes (with GOAWAY) a connection without calls for this long.
	IdleTimeout time.Duration
	// ErrorLog receives handler panics; nil logs with the log package's standard logger.
	ErrorLog *log.Logger

	mu        sync.Mutex
	listeners map[net.Listener]struct{}
	conns     map[*h2Conn]struct{}
	changed   chan struct{} // closed and replaced when a connection ends
	shutdown  atomic.Bool
}

// NewHTTPServer returns an HTTPServer that serves s on cleartext HTTP/2 connections with prior
// knowledge (h2c), which is how gRPC clients, Envoy's among them, call a plaintext gRPC server.
// It speaks no HTTP/1.
func NewHTTPServer(s *Server) *HTTPServer { return &HTTPServer{Handler: s} }

// The server's HTTP/2 settings and windows.
const (
	h2MaxConcurrentStreams = 1000
	h2MaxHeaderListSize    = 1 << 20 // as net/http's default MaxHeaderBytes
	h2MaxFrameSize         = 16384   // ours, the protocol's default: not advertised
	h2StreamWindow         = 1 << 20 // per stream: a whole 1 MiB message in about one window
	h2ConnWindow           = 4 << 20 // bounds what one connection can make the server buffer
	h2DefaultWindow        = 65535
	h2MaxWindow            = 1<<31 - 1
	h2GoAwayLinger         = time.Second // after a graceful GOAWAY, the wait for the client to close
)

var (
	errStreamClosed = errors.New("http2: stream closed")
	errConnClosed   = errors.New("http2: connection closed")
)

// Serve accepts connections on ln and serves each on its own goroutine. It returns
// http.ErrServerClosed after Shutdown or Close, and closes ln.
func (s *HTTPServer) Serve(ln net.Listener) error {
	s.mu.Lock()
	if s.shutdown.Load() {
		s.mu.Unlock()
		ln.Close()
		return http.ErrServerClosed
	}
	if s.listeners == nil {
		s.listeners = map[net.Listener]struct{}{}
	}
	s.listeners[ln] = struct{}{}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.listeners, ln)
		s.mu.Unlock()
		ln.Close()
	}()
	var delay time.Duration
	for {
		nc, err := ln.Accept()
		if err != nil {
			if s.shutdown.Load() {
				return http.ErrServerClosed
			}
			var te interface{ Temporary() bool }
			if errors.As(err, &te) && te.Temporary() { // out of file descriptors, say: wait, as net/http does
				delay = min(max(2*delay, 5*time.Millisecond), time.Second)
				time.Sleep(delay)
				continue
			}
			return err
		}
		delay = 0
		if c := s.newConn(nc); c != nil {
			go c.serve()
		}
	}
}

// Shutdown stops accepting connections, sends GOAWAY on every connection with the last stream it
// took, lets the calls in flight finish and closes each connection once it has none. It returns
// nil when all connections are closed, or ctx's error at its end (Close then ends the rest).
func (s *HTTPServer) Shutdown(ctx context.Context) error {
	s.shutdown.Store(true)
	s.mu.Lock()
	for ln := range s.listeners {
		ln.Close()
	}
	for c := range s.conns {
		go c.gracefulClose()
	}
	s.mu.Unlock()
	for {
		s.mu.Lock()
		n, ch := len(s.conns), s.changedLocked()
		s.mu.Unlock()
		if n == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-ch:
		}
	}
}

// Close closes the listeners and every connection at once; calls in flight see their context
// canceled.
func (s *HTTPServer) Close() error {
	s.shutdown.Store(true)
	s.mu.Lock()
	defer s.mu.Unlock()
	for ln := range s.listeners {
		ln.Close()
	}
	for c := range s.conns {
		c.nc.Close()
	}
	return nil
}

func (s *HTTPServer) changedLocked() chan struct{} {
	if s.changed == nil {
		s.changed = make(chan struct{})
	}
	return s.changed
}

func (s *HTTPServer) newConn(nc net.Conn) *h2Conn {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.shutdown.Load() {
		nc.Close()
		return nil
	}
	if s.conns == nil {
		s.conns = map[*h2Conn]struct{}{}
	}
	c := &h2Conn{
		srv:               s,
		nc:                nc,
		br:                bufio.NewReaderSize(nc, 8<<10),
		bw:                bufio.NewWriterSize(nc, 16<<10),
		streams:           map[uint32]*stream{},
		sendWindow:        h2DefaultWindow,
		peerInitialWindow: h2DefaultWindow,
		peerMaxFrame:      h2MaxFrameSize,
		connRecvWindow:    h2ConnWindow,
	}
	if a := nc.RemoteAddr(); a != nil {
		c.remoteAddr = a.String()
	}
	c.fr = http2.NewFramer(c.bw, c.br)
	c.fr.SetReuseFrames()
	c.fr.SetMaxReadFrameSize(h2MaxFrameSize)
	c.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	c.fr.MaxHeaderListSize = h2MaxHeaderListSize
	c.henc = hpack.NewEncoder(&c.hbuf)
	c.ctx, c.cancel = context.WithCancel(context.Background())
	s.conns[c] = struct{}{}
	return c
}

func (s *HTTPServer) removeConn(c *h2Conn) {
	s.mu.Lock()
	delete(s.conns, c)
	if s.changed != nil {
		close(s.changed)
		s.changed = nil
	}
	s.mu.Unlock()
}

func (s *HTTPServer) logf(format string, args ...any) {
	if s.ErrorLog != nil {
		s.ErrorLog.Printf(format, args...)
	} else {
		log.Printf(format, args...)
	}
}

// h2Conn is one HTTP/2 connection. Its serve goroutine reads and processes frames and never waits
// for a handler; handlers write their answers themselves under wmu. Lock order: wmu, then mu.
type h2Conn struct {
	srv        *HTTPServer
	nc         net.Conn
	remoteAddr string
	br         *bufio.Reader
	bw         *bufio.Writer
	fr         *http2.Framer // read by the serve goroutine; written under wmu
	ctx        context.Context
	cancel     context.CancelFunc

	wmu      sync.Mutex
	wwaiting atomic.Int32 // goroutines waiting for wmu: the last writer flushes
	werr     error
	henc     *hpack.Encoder
	hbuf     bytes.Buffer

	mu                sync.Mutex
	streams           map[uint32]*stream // open streams whose handler has not answered
	lastStreamID      uint32
	handlers          int   // handler goroutines running
	sendWindow        int64 // connection send window
	peerInitialWindow int64
	peerMaxFrame      uint32 // changed under wmu and mu
	connRecvWindow    int64  // what the client may still send on the connection
	connUnacked       int64  // bytes consumed and not yet returned by WINDOW_UPDATE
	flowCh            chan struct{}
	ready             bool // our SETTINGS are written
	goingAway         bool // we sent GOAWAY
	peerGoneAway      bool
	closed            bool
	idleTimer         *time.Timer
}

// stream is one call. Its fields below ctx are guarded by the connection's mu.
type stream struct {
	c      *h2Conn
	id     uint32
	ctx    context.Context
	cancel context.CancelFunc

	sendWindow   int64
	recvWindow   int64 // what the client may still send on the stream
	recvUnacked  int64
	remoteClosed bool // END_STREAM received
	reset        bool // RST_STREAM sent or received
	buf          []byte
	off          int
	bodyErr      error
	wake         chan struct{}
	deadline     *time.Timer
}

func (c *h2Conn) lockWrite() {
	c.wwaiting.Add(1)
	c.wmu.Lock()
	c.wwaiting.Add(-1)
}

// unlockWrite flushes unless another writer waits for the lock: that one flushes, so answers
// written while a flush is under way leave in one write.
func (c *h2Conn) unlockWrite() {
	if c.werr == nil && c.bw.Buffered() > 0 && c.wwaiting.Load() == 0 {
		c.setWErr(c.bw.Flush())
	}
	c.wmu.Unlock()
}

// setWErr records the first write error and closes the connection, which ends its reader.
func (c *h2Conn) setWErr(err error) {
	if err != nil && c.werr == nil {
		c.werr = err
		c.nc.Close()
	}
}

func (c *h2Conn) serve() {
	defer c.finish()
	if d := c.srv.ReadHeaderTimeout; d > 0 {
		_ = c.nc.SetReadDeadline(time.Now().Add(d))
	}
	var preface [len(http2.ClientPreface)]byte
	if _, err := io.ReadFull(c.br, preface[:]); err != nil || string(preface[:]) != http2.ClientPreface {
		return
	}
	c.lockWrite()
	c.setWErr(c.fr.WriteSettings(
		http2.Setting{ID: http2.SettingMaxConcurrentStreams, Val: h2MaxConcurrentStreams},
		http2.Setting{ID: http2.SettingInitialWindowSize, Val: h2StreamWindow},
		http2.Setting{ID: http2.SettingMaxHeaderListSize, Val: h2MaxHeaderListSize},
	))
	c.setWErr(c.fr.WriteWindowUpdate(0, h2ConnWindow-h2DefaultWindow))
	c.mu.Lock()
	c.ready = true
	goingAway := c.goingAway
	c.mu.Unlock()
	c.unlockWrite()
	if goingAway { // Shutdown came during the handshake
		return
	}
	for first := true; ; first = false {
		f, err := c.fr.ReadFrame()
		if err == nil && first {
			if sf, ok := f.(*http2.SettingsFrame); !ok || sf.IsAck() {
				err = http2.ConnectionError(http2.ErrCodeProtocol) // the preface ends with SETTINGS
			} else {
				c.handshakeDone()
			}
		}
		if err == nil {
			err = c.process(f)
		}
		if err == nil {
			continue
		}
		var se http2.StreamError
		var ce http2.ConnectionError
		switch {
		case errors.As(err, &se):
			c.mu.Lock()
			if se.StreamID > c.lastStreamID && se.StreamID%2 == 1 {
				c.lastStreamID = se.StreamID
			}
			c.mu.Unlock()
			c.resetStream(se.StreamID, se.Code)
			continue
		case errors.As(err, &ce):
			c.goAway(http2.ErrCode(ce))
		case errors.Is(err, http2.ErrFrameTooLarge):
			c.goAway(http2.ErrCodeFrameSize)
		}
		return
	}
}

// handshakeDone ends the preface's deadline and starts the idle timer.
func (c *h2Conn) handshakeDone() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.goingAway {
		return // the GOAWAY's linger deadline stands
	}
	if c.srv.ReadHeaderTimeout > 0 {
		_ = c.nc.SetReadDeadline(time.Time{})
	}
	if d := c.srv.IdleTimeout; d > 0 {
		c.idleTimer = time.AfterFunc(d, c.idle)
	}
}

func (c *h2Conn) idle() {
	c.mu.Lock()
	busy := c.handlers > 0
	c.mu.Unlock()
	if !busy {
		c.gracefulClose()
	}
}

// finish closes the connection once its reader stops: calls still running see their context
// canceled and their answers dropped.
func (c *h2Conn) finish() {
	c.nc.Close()
	c.mu.Lock()
	c.closed = true
	for _, st := range c.streams {
		st.failLocked(errConnClosed)
	}
	c.notifyFlowLocked()
	if c.idleTimer != nil {
		c.idleTimer.Stop()
	}
	c.mu.Unlock()
	c.cancel()
	c.srv.removeConn(c)
}

// goAway ends the connection on a protocol error.
func (c *h2Conn) goAway(code http2.ErrCode) {
	c.mu.Lock()
	last := c.lastStreamID
	c.goingAway = true
	c.mu.Unlock()
	c.lockWrite()
	if c.werr == nil {
		c.setWErr(c.fr.WriteGoAway(last, code, nil))
	}
	c.unlockWrite()
}

// gracefulClose sends GOAWAY with the last stream taken: later streams are refused, calls in
// flight finish, and the connection closes once none is left.
func (c *h2Conn) gracefulClose() {
	c.mu.Lock()
	if c.goingAway || c.closed {
		c.mu.Unlock()
		return
	}
	c.goingAway = true
	last, ready, idle := c.lastStreamID, c.ready, c.handlers == 0
	c.mu.Unlock()
	if !ready { // still in the handshake: nothing to drain
		c.nc.Close()
		return
	}
	c.lockWrite()
	if c.werr == nil {
		c.setWErr(c.fr.WriteGoAway(last, http2.ErrCodeNo, nil))
	}
	c.unlockWrite()
	if idle {
		c.linger()
	}
}

// linger gives the client a moment to read the GOAWAY and close first, then closes: closing
// with unread input could reset the connection before the client has read the last answers.
func (c *h2Conn) linger() { _ = c.nc.SetReadDeadline(time.Now().Add(h2GoAwayLinger)) }

func (c *h2Conn) process(f http2.Frame) error {
	switch f := f.(type) {
	case *http2.MetaHeadersFrame:
		return c.processHeaders(f)
	case *http2.DataFrame:
		return c.processData(f)
	case *http2.SettingsFrame:
		if f.IsAck() {
			return nil
		}
		return c.processSettings(f)
	case *http2.WindowUpdateFrame:
		return c.processWindowUpdate(f)
	case *http2.PingFrame:
		if !f.IsAck() {
			c.lockWrite()
			c.setWErr(c.fr.WritePing(true, f.Data))
			c.unlockWrite()
		}
	case *http2.RSTStreamFrame:
		return c.processReset(f)
	case *http2.GoAwayFrame:
		c.mu.Lock()
		c.peerGoneAway = true
		idle := c.handlers == 0
		c.mu.Unlock()
		if idle {
			return io.EOF // closes the connection
		}
	case *http2.PushPromiseFrame, *http2.ContinuationFrame:
		// A client never pushes; CONTINUATION outside a header block is an error (the Framer
		// joins those inside one).
		return http2.ConnectionError(http2.ErrCodeProtocol)
	}
	return nil // PRIORITY and unknown frame types are ignored
}

func (c *h2Conn) processSettings(f *http2.SettingsFrame) error {
	if err := f.ForeachSetting(func(s http2.Setting) error { return s.Valid() }); err != nil {
		return err
	}
	c.lockWrite()
	defer c.unlockWrite()
	c.mu.Lock()
	err := f.ForeachSetting(func(s http2.Setting) error {
		switch s.ID {
		case http2.SettingInitialWindowSize:
			delta := int64(s.Val) - c.peerInitialWindow
			c.peerInitialWindow = int64(s.Val)
			for _, st := range c.streams {
				if st.sendWindow += delta; st.sendWindow > h2MaxWindow {
					return http2.ConnectionError(http2.ErrCodeFlowControl)
				}
			}
		case http2.SettingMaxFrameSize:
			c.peerMaxFrame = s.Val
		case http2.SettingHeaderTableSize:
			c.henc.SetMaxDynamicTableSizeLimit(s.Val)
		}
		return nil
	})
	c.notifyFlowLocked()
	c.mu.Unlock()
	if err != nil {
		return err
	}
	c.setWErr(c.fr.WriteSettingsAck())
	return nil
}

func (c *h2Conn) processWindowUpdate(f *http2.WindowUpdateFrame) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	inc := int64(f.Increment)
	if f.StreamID == 0 {
		if c.sendWindow += inc; c.sendWindow > h2MaxWindow {
			return http2.ConnectionError(http2.ErrCodeFlowControl)
		}
		c.notifyFlowLocked()
		return nil
	}
	if f.StreamID > c.lastStreamID {
		return http2.ConnectionError(http2.ErrCodeProtocol) // an idle stream
	}
	if st := c.streams[f.StreamID]; st != nil {
		if st.sendWindow += inc; st.sendWindow > h2MaxWindow {
			return http2.StreamError{StreamID: f.StreamID, Code: http2.ErrCodeFlowControl}
		}
		c.notifyFlowLocked()
	}
	return nil
}

func (c *h2Conn) processReset(f *http2.RSTStreamFrame) error {
	c.mu.Lock()
	idle := f.StreamID > c.lastStreamID
	c.mu.Unlock()
	if idle {
		return http2.ConnectionError(http2.ErrCodeProtocol) // an idle stream
	}
	c.sendWindowUpdates(0, 0, c.dropStream(f.StreamID))
	return nil
}

// dropStream forgets stream id, if it is open, and cancels its call. It returns the connection
// window increment to send, if any.
func (c *h2Conn) dropStream(id uint32) int64 {
	c.mu.Lock()
	st := c.streams[id]
	var inc int64
	if st != nil {
		inc = c.dropStreamLocked(st)
	}
	c.mu.Unlock()
	if st != nil {
		st.cancel()
	}
	return inc
}

// dropStreamLocked forgets a reset stream: its unread data returns to the connection window.
// It returns the connection window increment to send, if any.
func (c *h2Conn) dropStreamLocked(st *stream) int64 {
	st.reset = true
	st.failLocked(errStreamClosed)
	if c.streams[st.id] == st {
		delete(c.streams, st.id)
	}
	n := int64(len(st.buf) - st.off)
	st.buf, st.off = nil, 0
	return c.refundLocked(n)
}

// refundLocked counts n bytes of the connection window as consumed and returns the increment
// to send once half the window is.
func (c *h2Conn) refundLocked(n int64) int64 {
	c.connUnacked += n
	if c.connUnacked < h2ConnWindow/2 {
		return 0
	}
	inc := c.connUnacked
	c.connRecvWindow += inc
	c.connUnacked = 0
	return inc
}

// resetStream sends RST_STREAM and ends the stream's call, if it is still open.
func (c *h2Conn) resetStream(id uint32, code http2.ErrCode) {
	inc := c.dropStream(id)
	c.lockWrite()
	if inc > 0 {
		c.setWErr(c.fr.WriteWindowUpdate(0, uint32(inc)))
	}
	c.setWErr(c.fr.WriteRSTStream(id, code))
	c.unlockWrite()
}

func (c *h2Conn) processData(f *http2.DataFrame) error {
	id, n, data := f.StreamID, int64(f.Length), f.Data()
	c.mu.Lock()
	if id > c.lastStreamID {
		c.mu.Unlock()
		return http2.ConnectionError(http2.ErrCodeProtocol) // an idle stream
	}
	if n > c.connRecvWindow {
		c.mu.Unlock()
		return http2.ConnectionError(http2.ErrCodeFlowControl)
	}
	c.connRecvWindow -= n
	st := c.streams[id]
	if st == nil || st.remoteClosed {
		// A stream already answered or reset (whose DATA may still be on its way) is ignored;
		// one whose client ended it sends nothing more.
		halfClosed := st != nil
		inc := c.refundLocked(n)
		c.mu.Unlock()
		c.sendWindowUpdates(0, 0, inc)
		if halfClosed {
			return http2.StreamError{StreamID: id, Code: http2.ErrCodeStreamClosed}
		}
		return nil
	}
	if n > st.recvWindow {
		inc := c.refundLocked(n)
		c.mu.Unlock()
		c.sendWindowUpdates(0, 0, inc)
		return http2.StreamError{StreamID: id, Code: http2.ErrCodeFlowControl}
	}
	st.recvWindow -= n
	var sInc, cInc int64
	if pad := n - int64(len(data)); pad > 0 { // padding is consumed at once
		sInc, cInc = c.consumedLocked(st, pad)
	}
	if len(data) > 0 {
		if st.off == len(st.buf) {
			st.buf, st.off = st.buf[:0], 0
		}
		st.buf = append(st.buf, data...)
	}
	if f.StreamEnded() {
		st.remoteClosed = true
	}
	st.wakeLocked()
	c.mu.Unlock()
	c.sendWindowUpdates(id, sInc, cInc)
	return nil
}

func (c *h2Conn) processHeaders(f *http2.MetaHeadersFrame) error {
	id := f.StreamID
	if id%2 == 0 {
		return http2.ConnectionError(http2.ErrCodeProtocol)
	}
	c.mu.Lock()
	if id <= c.lastStreamID {
		defer c.mu.Unlock()
		st := c.streams[id]
		switch {
		case st == nil && f.StreamEnded():
			return nil // trailers of a stream already answered or reset
		case st == nil:
			return http2.ConnectionError(http2.ErrCodeProtocol) // stream ids only increase
		case st.remoteClosed:
			return http2.StreamError{StreamID: id, Code: http2.ErrCodeStreamClosed}
		case !f.StreamEnded():
			return http2.StreamError{StreamID: id, Code: http2.ErrCodeProtocol} // trailers end the stream
		}
		st.remoteClosed = true // the client's trailers: gRPC clients send none, nothing in them matters
		st.wakeLocked()
		return nil
	}
	c.lastStreamID = id
	c.mu.Unlock()
	if f.Truncated {
		c.writeStatusOnly(id, http.StatusRequestHeaderFieldsTooLarge)
		return nil
	}
	r, err := c.newRequest(f)
	if err != nil {
		return http2.StreamError{StreamID: id, Code: http2.ErrCodeProtocol}
	}
	st := &stream{c: c, id: id, recvWindow: h2StreamWindow, remoteClosed: f.StreamEnded()}
	c.mu.Lock()
	if c.goingAway || c.closed || c.handlers >= h2MaxConcurrentStreams {
		c.mu.Unlock()
		return http2.StreamError{StreamID: id, Code: http2.ErrCodeRefusedStream}
	}
	st.ctx, st.cancel = context.WithCancel(c.ctx)
	st.sendWindow = c.peerInitialWindow
	c.streams[id] = st
	if c.handlers++; c.handlers == 1 && c.idleTimer != nil {
		c.idleTimer.Stop()
	}
	c.mu.Unlock()
	r = r.WithContext(st.ctx)
	r.Body = body{st}
	go c.runHandler(st, r)
	return nil
}

// newRequest builds the request a handler sees from a stream's headers.
func (c *h2Conn) newRequest(f *http2.MetaHeadersFrame) (*http.Request, error) {
	method, path := f.PseudoValue("method"), f.PseudoValue("path")
	if method == "" || path == "" {
		return nil, errors.New("missing :method or :path")
	}
	u := &url.URL{Path: path}
	if strings.ContainsAny(path, "%?#") {
		var err error
		if u, err = url.ParseRequestURI(path); err != nil {
			return nil, err
		}
	}
	fields := f.RegularFields()
	h := make(http.Header, len(fields))
	for _, hf := range fields {
		k := canonicalName(hf.Name)
		h[k] = append(h[k], hf.Value)
	}
	return &http.Request{
		Method: method, URL: u, Proto: "HTTP/2.0", ProtoMajor: 2, Header: h,
		Host: f.PseudoValue("authority"), RequestURI: path, RemoteAddr: c.remoteAddr,
	}, nil
}

func canonicalName(n string) string {
	switch n {
	case "content-type":
		return "Content-Type"
	case "te":
		return "Te"
	case "grpc-timeout":
		return "Grpc-Timeout"
	case "grpc-encoding":
		return "Grpc-Encoding"
	case "grpc-accept-encoding":
		return "Grpc-Accept-Encoding"
	case "user-agent":
		return "User-Agent"
	}
	return http.CanonicalHeaderKey(n)
}

func (c *h2Conn) runHandler(st *stream, r *http.Request) {
	w := &responseWriter{st: st}
	ok := c.callHandler(w, r)
	c.mu.Lock()
	if st.deadline != nil {
		st.deadline.Stop()
	}
	c.mu.Unlock()
	if ok {
		c.writeResponse(st, w)
	} else {
		c.resetStream(st.id, http2.ErrCodeInternal)
	}
	c.closeStream(st)
}

func (c *h2Conn) callHandler(w *responseWriter, r *http.Request) (ok bool) {
	defer func() {
		if p := recover(); p != nil {
			if p != http.ErrAbortHandler {
				c.srv.logf("rls: panic serving %s: %v", c.remoteAddr, p)
			}
			ok = false
		}
	}()
	c.srv.Handler.ServeHTTP(w, r)
	return true
}

// closeStream ends a stream whose handler returned: what it left unread returns to the
// connection window, and the connection closes if it is going away and this was its last call.
func (c *h2Conn) closeStream(st *stream) {
	c.mu.Lock()
	var inc int64
	if c.streams[st.id] == st {
		delete(c.streams, st.id)
		inc = c.refundLocked(int64(len(st.buf) - st.off))
		st.buf, st.off = nil, 0
	}
	c.handlers--
	last := c.handlers == 0
	if last && c.idleTimer != nil && !c.goingAway {
		c.idleTimer.Reset(c.srv.IdleTimeout)
	}
	goingAway, peerGone := c.goingAway, c.peerGoneAway
	c.mu.Unlock()
	st.cancel()
	c.sendWindowUpdates(0, 0, inc)
	switch {
	case last && peerGone:
		c.nc.Close()
	case last && goingAway:
		c.linger()
	}
}

// consumedLocked counts n bytes of a stream as consumed and returns the stream and connection
// window increments to send, once half of either window is consumed.
func (c *h2Conn) consumedLocked(st *stream, n int64) (streamInc, connInc int64) {
	if !st.remoteClosed {
		st.recvUnacked += n
		if st.recvUnacked >= h2StreamWindow/2 {
			streamInc = st.recvUnacked
			st.recvWindow += streamInc
			st.recvUnacked = 0
		}
	}
	return streamInc, c.refundLocked(n)
}

func (c *h2Conn) sendWindowUpdates(id uint32, streamInc, connInc int64) {
	if streamInc == 0 && connInc == 0 {
		return
	}
	c.lockWrite()
	if connInc > 0 {
		c.setWErr(c.fr.WriteWindowUpdate(0, uint32(connInc)))
	}
	if streamInc > 0 {
		c.setWErr(c.fr.WriteWindowUpdate(id, uint32(streamInc)))
	}
	c.unlockWrite()
}

// notifyFlowLocked wakes the answers waiting for send window.
func (c *h2Conn) notifyFlowLocked() {
	if c.flowCh != nil {
		close(c.flowCh)
		c.flowCh = nil
	}
}

func (st *stream) wakeLocked() {
	if st.wake != nil {
		select {
		case st.wake <- struct{}{}:
		default:
		}
	}
}

func (st *stream) failLocked(err error) {
	if st.bodyErr == nil {
		st.bodyErr = err
	}
	st.wakeLocked()
}

// body is a request body: the stream's DATA as it arrives. A read returns when data arrives, the
// stream ends, the read deadline passes or the call's context ends.
type body struct{ st *stream }

func (b body) Read(p []byte) (int, error) {
	st := b.st
	c := st.c
	for {
		c.mu.Lock()
		if st.off < len(st.buf) {
			n := copy(p, st.buf[st.off:])
			st.off += n
			sInc, cInc := c.consumedLocked(st, int64(n))
			c.mu.Unlock()
			c.sendWindowUpdates(st.id, sInc, cInc)
			return n, nil
		}
		switch {
		case st.remoteClosed:
			c.mu.Unlock()
			return 0, io.EOF
		case st.bodyErr != nil:
			err := st.bodyErr
			c.mu.Unlock()
			return 0, err
		}
		if st.wake == nil {
			st.wake = make(chan struct{}, 1)
		}
		wake := st.wake
		c.mu.Unlock()
		if len(p) == 0 {
			return 0, nil
		}
		select {
		case <-wake:
		case <-st.ctx.Done():
			return 0, st.ctx.Err()
		}
	}
}

func (body) Close() error { return nil }

// responseWriter buffers a handler's answer; writeResponse encodes it when the handler returns.
type responseWriter struct {
	st     *stream
	hdr    http.Header
	status int
	body   []byte
}

func (w *responseWriter) Header() http.Header {
	if w.hdr == nil {
		w.hdr = make(http.Header, 4)
	}
	return w.hdr
}

func (w *responseWriter) WriteHeader(code int) {
	if w.status == 0 && code >= 200 {
		w.status = code
	}
}

func (w *responseWriter) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	w.body = append(w.body, p...)
	return len(p), nil
}

// SetReadDeadline bounds the wait for the request body (http.ResponseController uses it): reads
// after t fail with os.ErrDeadlineExceeded.
func (w *responseWriter) SetReadDeadline(t time.Time) error {
	st := w.st
	c := st.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if st.deadline != nil {
		st.deadline.Stop()
		st.deadline = nil
	}
	if t.IsZero() {
		return nil
	}
	st.deadline = time.AfterFunc(time.Until(t), func() {
		c.mu.Lock()
		st.failLocked(os.ErrDeadlineExceeded)
		c.mu.Unlock()
	})
	return nil
}

func (w *responseWriter) hasTrailers() bool {
	for k, v := range w.hdr {
		if len(v) > 0 && strings.HasPrefix(k, http.TrailerPrefix) {
			return true
		}
	}
	return false
}

// writeResponse writes a handler's answer: HEADERS, the body in DATA frames within the client's
// windows and trailers, or a Trailers-Only HEADERS, then flushes once.
func (c *h2Conn) writeResponse(st *stream, w *responseWriter) {
	c.lockWrite()
	defer c.unlockWrite()
	if !c.writable(st) {
		return
	}
	status := w.status
	if status == 0 {
		status = http.StatusOK
	}
	data, trailers := w.body, w.hasTrailers()
	c.hbuf.Reset()
	c.writeField(":status", statusValue(status))
	for k, vs := range w.hdr {
		if !strings.HasPrefix(k, http.TrailerPrefix) {
			c.writeFields(k, vs)
		}
	}
	c.writeHeaderBlock(st.id, len(data) == 0 && !trailers)
	for len(data) > 0 {
		c.mu.Lock()
		n := min(int64(len(data)), int64(c.peerMaxFrame), c.sendWindow, st.sendWindow)
		if st.reset || c.closed {
			c.mu.Unlock()
			return
		}
		if n <= 0 { // wait for the client's WINDOW_UPDATE, without the write lock
			if c.flowCh == nil {
				c.flowCh = make(chan struct{})
			}
			ch := c.flowCh
			c.mu.Unlock()
			if c.werr == nil {
				c.setWErr(c.bw.Flush())
			}
			c.wmu.Unlock()
			select {
			case <-ch:
			case <-st.ctx.Done():
			}
			c.lockWrite()
			if st.ctx.Err() != nil || !c.writable(st) {
				return
			}
			continue
		}
		c.sendWindow -= n
		st.sendWindow -= n
		c.mu.Unlock()
		c.setWErr(c.fr.WriteData(st.id, n == int64(len(data)) && !trailers, data[:n]))
		data = data[n:]
	}
	if trailers {
		c.hbuf.Reset()
		for k, vs := range w.hdr {
			if name, ok := strings.CutPrefix(k, http.TrailerPrefix); ok {
				c.writeFields(name, vs)
			}
		}
		c.writeHeaderBlock(st.id, true)
	}
	c.mu.Lock()
	unfinished := !st.remoteClosed && !st.reset
	c.mu.Unlock()
	if unfinished {
		// Answered before the request ended: the client stops sending (RFC 9113, 8.1).
		c.setWErr(c.fr.WriteRSTStream(st.id, http2.ErrCodeNo))
	}
}

// writable reports whether a stream's answer can still be written; wmu is held.
func (c *h2Conn) writable(st *stream) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.werr == nil && !c.closed && !st.reset
}

// writeStatusOnly answers a stream with an HTTP status and no body.
func (c *h2Conn) writeStatusOnly(id uint32, status int) {
	c.lockWrite()
	defer c.unlockWrite()
	if c.werr != nil {
		return
	}
	c.hbuf.Reset()
	c.writeField(":status", statusValue(status))
	c.writeHeaderBlock(id, true)
}

func statusValue(code int) string {
	if code == http.StatusOK {
		return "200"
	}
	return strconv.Itoa(code)
}

// writeFields encodes a header's values into hbuf; wmu is held.
func (c *h2Conn) writeFields(k string, vs []string) {
	switch k {
	case "Connection", "Keep-Alive", "Proxy-Connection", "Transfer-Encoding", "Upgrade", "Trailer":
		return // connection-specific, not HTTP/2's
	}
	if len(vs) == 0 {
		return
	}
	name := lowerName(k)
	for _, v := range vs {
		c.writeField(name, v)
	}
}

func (c *h2Conn) writeField(name, value string) {
	_ = c.henc.WriteField(hpack.HeaderField{Name: name, Value: value}) // writes to a bytes.Buffer
}

func lowerName(k string) string {
	switch k {
	case "Content-Type":
		return "content-type"
	case "Grpc-Status":
		return "grpc-status"
	case "Grpc-Message":
		return "grpc-message"
	case "Grpc-Accept-Encoding":
		return "grpc-accept-encoding"
	}
	return strings.ToLower(k)
}

// writeHeaderBlock writes hbuf as HEADERS and CONTINUATION frames within the client's frame
// size; wmu is held, so nothing comes between them.
func (c *h2Conn) writeHeaderBlock(id uint32, endStream bool) {
	block := c.hbuf.Bytes()
	maxFrame := int(c.peerMaxFrame)
	for first := true; first || len(block) > 0; first = false {
		chunk := block[:min(len(block), maxFrame)]
		block = block[len(chunk):]
		if first {
			c.setWErr(c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: chunk, EndStream: endStream, EndHeaders: len(block) == 0}))
		} else {
			c.setWErr(c.fr.WriteContinuation(id, len(block) == 0, chunk))
		}
	}
}
