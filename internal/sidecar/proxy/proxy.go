// Package proxy is the sidecar's reverse proxy face: it decides each request against the rule
// set in force and either answers 429 or forwards the request, streaming, to the application.
package proxy

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redline-dev/redline/internal/sidecar/contract"
	"github.com/redline-dev/redline/internal/sidecar/decide"
	"github.com/redline-dev/redline/internal/sidecar/membudget"
	"github.com/redline-dev/redline/internal/sidecar/reqpath"
	"github.com/redline-dev/redline/internal/sidecar/ruleset"
	"github.com/redline-dev/redline/internal/sidecar/slotqueue"
)

// contentTypeJSON is the type of every answer the proxy writes itself.
const contentTypeJSON = "application/json"

// noStore is the Cache-Control of the proxy's own refusals: a cache must not answer a later
// request with one.
const noStore = "no-store"

// Options configure a Handler.
type Options struct {
	// Upstream is the application's host:port.
	Upstream string
	// UpstreamProtocol is how the application is spoken to: one of contract.UpstreamProtocols
	// ("": HTTP1).
	UpstreamProtocol string
	// MaxStreams bounds the HTTP/2 requests in flight on the face, over all connections (0:
	// no bound but MaxConcurrentStreams per connection). A request past it is answered 503
	// (UNAVAILABLE to a gRPC call) with Retry-After, as the connection bound makes an
	// HTTP/1.1 client wait: an HTTP/2 connection multiplies what one slot of the listener holds.
	MaxStreams int
	Engine     *decide.Engine
	Store      *ruleset.Store
	// QueueShare bounds the proxy's requests waiting in the engine's queue for a slot (nil:
	// only the queue's bounds): each holds one of the proxy's connections.
	QueueShare *slotqueue.Share
	// Headers adds the RateLimit fields to admitted responses too (refusals always carry them).
	Headers bool
	// ResponseHeaderTimeout bounds the wait for the application's response headers (0: none).
	// Bodies are not bounded, so streams and upgraded connections can last.
	ResponseHeaderTimeout time.Duration
	// DialTimeout bounds connecting to the application (default 5s).
	DialTimeout time.Duration
	// MaxIdleConns is how many idle keep-alive connections to the application are kept, per
	// path (default 256): the sidecar talks to one host only.
	MaxIdleConns int
	// IdleConnTimeout closes keep-alive connections to the application idle this long
	// (default 90s).
	IdleConnTimeout time.Duration
	// BodyReadTimeout bounds the read of a token budget's request body for sizing (default
	// DefaultBodyReadTimeout); a body slower than it is unsized.
	BodyReadTimeout time.Duration
	// Memory is the budget a token budget's request body is read into, and its holds drawn
	// from until their settle (decide.HoldBytes each; nil: none). A request it has no room
	// for is answered 503 with Retry-After.
	Memory *membudget.Budget
	// OnUnsized hears of each request refused because its body could not be sized (metrics),
	// with the rule that refused it and the reason (Unsized*).
	OnUnsized func(rule *ruleset.Rule, reason string)
	Log       *slog.Logger
}

// Handler decides and forwards requests.
type Handler struct {
	opts      Options
	rp        *httputil.ReverseProxy
	transport http.RoundTripper
	streams   chan struct{} // one token per HTTP/2 request in flight; nil: unbounded
}

// New returns a Handler forwarding to opts.Upstream.
func New(opts Options) (*Handler, error) {
	if _, _, err := net.SplitHostPort(opts.Upstream); err != nil {
		return nil, fmt.Errorf("parsing upstream address %q: %w", opts.Upstream, err)
	}
	if opts.DialTimeout <= 0 {
		opts.DialTimeout = 5 * time.Second
	}
	if opts.MaxIdleConns <= 0 {
		opts.MaxIdleConns = 256
	}
	if opts.IdleConnTimeout <= 0 {
		opts.IdleConnTimeout = 90 * time.Second
	}
	if opts.BodyReadTimeout <= 0 {
		opts.BodyReadTimeout = DefaultBodyReadTimeout
	}
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	target := &url.URL{Scheme: "http", Host: opts.Upstream}
	dialer := net.Dialer{Timeout: opts.DialTimeout, KeepAlive: 30 * time.Second}
	// One Transport, one host: its idle pool is the keep-alive pool to the application, and its
	// read loop closes a connection on which the application sent bytes nobody asked for (past
	// a short Content-Length, a body on HEAD or 204) instead of serving them to the next client;
	// the guard (guard.go) closes the window before it does.
	transport := &http.Transport{
		// The application is in the same pod: never route to it through a proxy named by the
		// environment (HTTP_PROXY is often set for the application's own outbound calls).
		Proxy:       nil,
		DialContext: guardedDialer(&dialer),
		// HTTP/1.1 to loopback: no TLS, so nothing to negotiate; an empty TLSNextProto keeps
		// the HTTP/2 code out of this path even if the scheme ever changes.
		ForceAttemptHTTP2: false,
		TLSNextProto:      map[string]func(string, *tls.Conn) http.RoundTripper{},
		// All idle connections go to the one host.
		MaxIdleConns:          opts.MaxIdleConns,
		MaxIdleConnsPerHost:   opts.MaxIdleConns,
		IdleConnTimeout:       opts.IdleConnTimeout,
		ResponseHeaderTimeout: opts.ResponseHeaderTimeout,
		ExpectContinueTimeout: time.Second,
		// The default is 10 MiB; an application's header block over 1 MiB is a fault, and the
		// sidecar's memory limit is 64 MiB.
		MaxResponseHeaderBytes: 1 << 20,
		// Pass the client's encoding through untouched; the transport must not negotiate gzip
		// on its own and decompress behind the application's back.
		DisableCompression: true,
	}
	upstream, err := upstreamTransport(opts.UpstreamProtocol, transport, &dialer)
	if err != nil {
		return nil, err
	}
	if opts.UpstreamProtocol == contract.UpstreamProtocolHTTPS {
		target.Scheme = "https"
	}
	h := &Handler{opts: opts, transport: upstream}
	if opts.MaxStreams > 0 {
		h.streams = make(chan struct{}, opts.MaxStreams)
	}
	h.rp = &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out = pr.Out.WithContext(httptrace.WithClientTrace(pr.Out.Context(), reuseTrace))
			pr.SetURL(target)
			// Applications route and build links on the original Host. An HTTP/1.0 request
			// without one is sent with the upstream's address, as http.Transport does for "".
			pr.Out.Host = pr.In.Host
			// Rewrite starts from a request without X-Forwarded-*; keep what proxies in front
			// of the sidecar said and append this hop.
			pr.Out.Header["X-Forwarded-For"] = pr.In.Header["X-Forwarded-For"]
			pr.SetXForwarded()
			for _, k := range []string{"X-Forwarded-Host", "X-Forwarded-Proto"} {
				if v := pr.In.Header[k]; len(v) > 0 {
					pr.Out.Header[k] = v
				}
			}
		},
		Transport: upstream,
		// FlushInterval 0: ReverseProxy already flushes every write of a streaming response
		// (text/event-stream or unknown length), and batches fixed-length bodies.
		BufferPool:     bufferPool{},
		ModifyResponse: meterResponse,
		ErrorHandler:   h.upstreamError,
		ErrorLog:       slog.NewLogLogger(opts.Log.Handler(), slog.LevelWarn),
	}
	return h, nil
}

// ServeHTTP decides the request, then refuses it or forwards it.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.ProtoMajor == 2 && h.streams != nil {
		select {
		case h.streams <- struct{}{}:
			defer func() { <-h.streams }()
		default:
			w.Header()[decide.HeaderRetryAfter] = []string{"1"}
			if isGRPC(r) {
				writeGRPCStatus(w, grpcCodeFor(http.StatusServiceUnavailable), "the sidecar is at its bound of requests in flight")
				return
			}
			writeJSONError(w, http.StatusServiceUnavailable, "too_many_streams")
			return
		}
	}
	dropH2CUpgrade(r)
	// The path is matched and forwarded in one normal form (reqpath): the application routes
	// what the rules matched. A path no normal form can agree on with every application is
	// refused.
	norm, decoded, err := reqpath.Normalize(r.URL.EscapedPath())
	if err != nil && isGRPC(r) {
		writeGRPCStatus(w, grpcCodeFor(http.StatusBadRequest), "bad request path: "+err.Error())
		return
	}
	if err != nil {
		w.Header()["Content-Type"] = []string{contentTypeJSON}
		w.WriteHeader(http.StatusBadRequest)
		body, _ := json.Marshal(map[string]string{"error": "bad_request_path", "reason": err.Error()})
		_, _ = w.Write(append(body, '\n'))
		return
	}
	r.URL.Path, r.URL.RawPath = decoded, norm
	set := h.opts.Store.Current()
	if set != nil && (len(set.Rules) > 0 || len(set.InFlight) > 0) {
		// Upper-cased as /v1/check does: a Method key part counts "get" with "GET".
		req := &decide.Request{Method: strings.ToUpper(r.Method), Path: r.URL.Path, Header: r.Header, RemoteAddr: r.RemoteAddr}
		plan, err := h.opts.Engine.Plan(set, req, 1)
		if err != nil {
			refuseRepeatedFor(w, r, err)
			return
		}
		if costed := plan.Costed(); costed != nil {
			if isGRPC(r) {
				h.refuseCostedGRPC(w, costed)
				return
			}
			slots := h.takeSlots(w, r, &plan, nil)
			if slots == nil {
				return
			}
			defer slots.Release(r.Context())
			r, stop := endOnLost(r, slots)
			defer stop()
			h.serveBudget(w, r, set, &plan)
			return
		}
		d := h.opts.Engine.Decide(r.Context(), &plan)
		if !d.Allowed {
			refuseFor(w, r, &d)
			return
		}
		slots := h.takeSlots(w, r, &plan, &d)
		if slots == nil {
			return
		}
		// Deferred, so that it runs however forward ends: ReverseProxy aborts a response cut
		// midway with a panic (http.ErrAbortHandler).
		defer slots.Release(r.Context())
		if h.opts.Headers {
			f := d.Fields()
			slots.WriteFields(&f)
			f.Write(w.Header())
		}
		r, stop := endOnLost(r, slots)
		defer stop()
		h.forward(w, r)
		return
	}
	h.forward(w, r)
}

// forward sends an admitted request to the application.
func (h *Handler) forward(w http.ResponseWriter, r *http.Request) {
	if r.Body != nil && r.Body != http.NoBody {
		// Remember a failure to read the client's body, so that a malformed one (a bad chunk)
		// is answered as the client's fault, not the application's. ReverseProxy hands the
		// error handler its own wrapper of the body, so the record travels in the context.
		cb := &clientBody{ReadCloser: r.Body, left: r.ContentLength}
		r = r.WithContext(context.WithValue(r.Context(), clientBodyKey{}, cb))
		r.Body = cb
	}
	h.rp.ServeHTTP(w, r)
}

// Close closes the idle connections to the application. In-flight requests finish; call it
// after the server in front has shut down.
func (h *Handler) Close() {
	closeIdle(h.transport)
}

// clientBodyKey is the context key of a request's *clientBody.
type clientBodyKey struct{}

// clientBody records whether reading a request body failed other than at its end. The
// transport reads it on its own goroutine, which may still run when the error handler asks.
//
// It also ends a body of known length itself once that length is read. http.Transport reads
// a request body once more after its last byte, to see its end; net/http's HTTP/1 server
// closes the body when the handler's response begins, and an application that answers as soon
// as it has the whole body (a model API streaming its answer) gets its headers back through
// the proxy before that read: it failed on the closed body ("invalid Read on closed Body"), and
// the transport dropped the application's connection, cutting the response (3 streams in 100
// on loopback, TestProxyStreamsEveryResponseWhole). Full duplex would avoid the close, but a
// full-duplex handler whose application answers before reading the body makes net/http read
// the connection twice at once (a panic that resets the client's connection,
// TestEarlyAnswerKeepsTheConnection). A chunked body can still meet the close before its last
// chunk is read.
type clientBody struct {
	io.ReadCloser
	left   int64 // bytes of a known length not yet read; -1 for unknown
	failed atomic.Bool
}

func (b *clientBody) Read(p []byte) (int, error) {
	if b.left == 0 {
		return 0, io.EOF
	}
	if b.left > 0 && int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.ReadCloser.Read(p)
	if b.left > 0 {
		b.left -= int64(n)
		if b.left == 0 && err == nil {
			err = io.EOF
		}
	}
	if err != nil && err != io.EOF {
		b.failed.Store(true)
	}
	return n, err
}

// Refusal is the JSON body of a 429.
type Refusal struct {
	Error             string `json:"error"`
	Policy            string `json:"policy"`
	Rule              string `json:"rule"`
	RetryAfterSeconds int64  `json:"retryAfterSeconds"`
}

func refuse(w http.ResponseWriter, d *decide.Decision) {
	d.Fields().Write(w.Header())
	body, _ := json.Marshal(Refusal{
		Error:             "rate_limited",
		Policy:            d.Refused.Rule.Policy.Name,
		Rule:              d.Refused.Rule.Name,
		RetryAfterSeconds: d.RetryAfterSeconds(),
	})
	body = append(body, '\n')
	hdr := w.Header()
	hdr["Content-Type"] = []string{contentTypeJSON}
	hdr["Content-Length"] = []string{strconv.Itoa(len(body))}
	hdr["Cache-Control"] = []string{noStore}
	w.WriteHeader(http.StatusTooManyRequests)
	_, _ = w.Write(body)
}

// refuseRepeated answers a request that sends a key header more than once (decide.Engine.Plan
// refuses it): 400, naming the header. Nothing was counted.
func refuseRepeated(w http.ResponseWriter, err error) {
	name := ""
	if rh, ok := errors.AsType[*decide.RepeatedHeaderError](err); ok {
		name = rh.Header
	}
	body, _ := json.Marshal(map[string]string{"error": "repeated_key_header", "header": name})
	body = append(body, '\n')
	hdr := w.Header()
	hdr["Content-Type"] = []string{contentTypeJSON}
	hdr["Content-Length"] = []string{strconv.Itoa(len(body))}
	hdr["Cache-Control"] = []string{noStore}
	w.WriteHeader(http.StatusBadRequest)
	_, _ = w.Write(body)
}

func (h *Handler) upstreamError(w http.ResponseWriter, r *http.Request, err error) {
	if b, ok := r.Context().Value(clientBodyKey{}).(*clientBody); ok && b.failed.Load() {
		h.opts.Log.Debug("reading the client's request body failed", "error", err, "method", r.Method, "path", r.URL.Path)
		if isGRPC(r) {
			writeGRPCStatus(w, grpcCodeFor(http.StatusBadRequest), "reading the request body failed")
			return
		}
		w.Header()["Content-Type"] = []string{contentTypeJSON}
		w.Header()["Connection"] = []string{"close"} // the rest of the connection is unframed
		w.WriteHeader(http.StatusBadRequest)
		_, _ = io.WriteString(w, "{\"error\":\"bad_request_body\",\"status\":400}\n")
		return
	}
	status := http.StatusBadGateway
	var ne net.Error
	switch {
	case errors.Is(err, context.Canceled) && r.Context().Err() != nil:
		// The client went away, or half-closed its side (which net/http takes for the same):
		// answer anyway, so that a client still reading never takes an empty 200 for success.
		h.opts.Log.Debug("client went away before the application answered", "method", r.Method, "path", r.URL.Path)
	case errors.As(err, &ne) && ne.Timeout():
		status = http.StatusGatewayTimeout
		fallthrough
	default:
		h.opts.Log.Warn("upstream request failed", "error", err, "upstream", h.opts.Upstream,
			"method", r.Method, "path", r.URL.Path, "status", status)
	}
	if isGRPC(r) {
		msg := "the application is unavailable through the sidecar"
		if status == http.StatusGatewayTimeout {
			msg = "the application did not answer within the sidecar's request timeout"
		}
		writeGRPCStatus(w, grpcCodeFor(status), msg)
		return
	}
	w.Header()["Content-Type"] = []string{contentTypeJSON}
	w.WriteHeader(status)
	_, _ = fmt.Fprintf(w, "{\"error\":\"upstream_unavailable\",\"status\":%d}\n", status)
}

// bufferPool recycles the 32 KiB copy buffers ReverseProxy uses per response.
type bufferPool struct{}

var buffers = sync.Pool{New: func() any { b := make([]byte, 32*1024); return &b }}

func (bufferPool) Get() []byte  { return *buffers.Get().(*[]byte) }
func (bufferPool) Put(b []byte) { buffers.Put(&b) }
