// Package meter is the sidecar's side of token budgets that touches bodies: it reads a request
// body within a size and a time bound for sizing the hold (ReadBody), and it meters a response
// as it streams to the client (Wrap), reporting once, at the response's end, the usage the
// upstream gave. Neither buffers a body: the request body is held at most to its bound, the
// response body one read (plus one event where a chunk is removed) at a time.
package meter

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"sync"

	"github.com/redline-dev/redline/internal/tokens"
)

// DefaultCostHeader is the response header (or trailer) in which an application states a
// response's cost itself.
const DefaultCostHeader = "Redline-Cost"

// ErrClientAbort is in Outcome.Err when the client side stopped the response before its end:
// it went away (the upstream read failed on the cancelled request) or the proxy closed the
// body early (writing to the client failed).
var ErrClientAbort = errors.New("meter: the client side ended the response before its end")

// Options configure a meter.
type Options struct {
	// Kind is the response's API (tokens.KindFromPath of the request).
	Kind tokens.Kind
	// StripUsage: the sidecar asked an OpenAI chat stream for its usage chunk on the client's
	// behalf (tokens.SetOutputCap with askUsage), and the chunk is removed before the client.
	StripUsage bool
	// CostHeader names the cost header and trailer (default DefaultCostHeader). It is removed
	// from the response whatever its value.
	CostHeader string
	// OnEnd receives the outcome, exactly once. It runs on the goroutine reading or closing
	// the body, so it should hand the settle off rather than block.
	OnEnd func(Outcome)
}

// Outcome is what the meter saw of one response.
type Outcome struct {
	// Usage is what the response reported: a cost header or trailer gives Usage.Total (and
	// Clamped), a body's usage object its counts (tokens.UsageScanner). Usage.Cost() is the
	// cost to settle.
	Usage tokens.Usage
	// Found: the response reported a usage or a cost. Without it, the caller settles as its
	// rule says for a response with no count.
	Found bool
	// FromHeader: the cost came from the cost header or trailer (which, when present and
	// valid, win over the body: the application states its cost deliberately; the trailer
	// over the header, being the later word).
	FromHeader bool
	// Streamed estimates, from above, the output tokens the body carried
	// (tokens.UsageScanner.Streamed): what a response that reported no usage, or was cut
	// after a partial report, is charged at least. 0 for a body that was not scanned.
	Streamed int64
	// Complete: the body was read to its end with no error. An error event the upstream sent
	// in its stream is still a complete body; its usage is what the events said before it.
	Complete bool
	// Err is why the body ended early: the upstream's read error, or one wrapping
	// ErrClientAbort.
	Err error
}

// meter is an upstream response body that scans what passes through it.
type meter struct {
	body  io.ReadCloser
	res   *http.Response
	name  string // canonical cost header name
	onEnd func(Outcome)

	mu       sync.Mutex // the scanner and the end, against a Close from another goroutine
	scan     *tokens.UsageScanner
	ended    bool
	complete bool // ended at EOF
	header   cost // from the response header
	trailer  cost // from the trailer, at EOF

	// Removing a chunk: what the filter passed on waits in pending until the proxy reads it;
	// readErr is the upstream's end, returned once pending is drained. Only the reading
	// goroutine touches them.
	filter  *tokens.UsageChunkFilter
	pending bytes.Buffer
	readErr error
}

// Wrap meters res, replacing its Body; call it from httputil.ReverseProxy.ModifyResponse. It
// removes the cost header and the cost trailer's announcement at once (ReverseProxy copies
// the header and announces res.Trailer's keys after ModifyResponse), and the trailer itself
// at the body's end, before the proxy copies the trailers. The body must be closed (the proxy
// does), or read to its end, for OnEnd to run; a response without a body, and a protocol
// switch (whose body the proxy needs unwrapped), end at once.
func Wrap(res *http.Response, opts Options) {
	name := opts.CostHeader
	if name == "" {
		name = DefaultCostHeader
	}
	m := &meter{res: res, name: http.CanonicalHeaderKey(name), onEnd: opts.OnEnd}
	if m.onEnd == nil {
		m.onEnd = func(Outcome) {}
	}
	m.header = parseCost(res.Header[m.name])
	delete(res.Header, m.name)
	delete(res.Trailer, m.name)
	if res.StatusCode == http.StatusSwitchingProtocols || res.Body == nil || res.Body == http.NoBody {
		m.body = http.NoBody
		m.finish(io.EOF)
		return
	}
	mt, _, _ := mime.ParseMediaType(res.Header.Get("Content-Type"))
	eventStream := mt == "text/event-stream"
	// A compressed body cannot be scanned without decompressing it, which the sidecar does
	// not do on the client's behalf: the caller keeps metered requests uncompressed (removes
	// Accept-Encoding) and settles a compressed answer as one with no count.
	if ce := res.Header.Get("Content-Encoding"); ce == "" || ce == "identity" {
		m.scan = tokens.NewUsageScanner(opts.Kind, eventStream)
		if opts.StripUsage && (opts.Kind == tokens.OpenAIChat || opts.Kind == tokens.OpenAICompletions) && eventStream {
			m.filter = tokens.NewUsageChunkFilter(&m.pending)
			// the body gets shorter: its length is no longer known, and the server chunks it
			res.Header.Del("Content-Length")
			res.ContentLength = -1
		}
	}
	m.body = res.Body
	res.Body = m
}

func (m *meter) Read(p []byte) (int, error) {
	if m.filter == nil {
		n, err := m.body.Read(p)
		m.feed(p[:n], err)
		return n, err
	}
	for m.pending.Len() == 0 && m.readErr == nil {
		n, err := m.body.Read(p)
		m.feed(p[:n], err)
		if err != nil {
			m.readErr = err
		}
	}
	if m.pending.Len() > 0 {
		return m.pending.Read(p)
	}
	return 0, m.readErr
}

// feed scans (and filters) b, and ends the meter at a read error or EOF.
func (m *meter) feed(b []byte, err error) {
	m.mu.Lock()
	if len(b) > 0 && m.scan != nil && !m.ended {
		_, _ = m.scan.Write(b)
	}
	if m.filter != nil {
		// the filter writes into pending, which cannot fail
		_, _ = m.filter.Write(b)
		if err != nil {
			_ = m.filter.Close()
		}
	}
	m.mu.Unlock()
	if err != nil {
		m.finish(err)
	}
}

// Close closes the upstream body; before the end, that is the client side giving up.
func (m *meter) Close() error {
	err := m.body.Close()
	m.finish(ErrClientAbort)
	// trailers arrive with the body's end; one that came only with the Close still must not
	// reach the client (ReverseProxy copies res.Trailer after it). Only after the end: before
	// it, a Read on another goroutine may be filling the map, and the proxy copies no
	// trailers of a body it gave up.
	m.mu.Lock()
	if m.complete {
		delete(m.res.Trailer, m.name)
	}
	m.mu.Unlock()
	return err
}

// finish reports the outcome, once. err is io.EOF at the body's end.
func (m *meter) finish(err error) {
	m.mu.Lock()
	if m.ended {
		m.mu.Unlock()
		return
	}
	m.ended = true
	var o Outcome
	switch {
	case err == io.EOF:
		o.Complete, m.complete = true, true
		if v, ok := m.res.Trailer[m.name]; ok {
			m.trailer = parseCost(v)
			delete(m.res.Trailer, m.name)
		}
	case errors.Is(err, ErrClientAbort):
		o.Err = err
	case m.res.Request != nil && m.res.Request.Context().Err() != nil:
		o.Err = fmt.Errorf("%w: %w", ErrClientAbort, err)
	default:
		o.Err = err
	}
	switch {
	case m.trailer.ok:
		o.Usage, o.Found, o.FromHeader = m.trailer.usage(), true, true
	case m.header.ok:
		o.Usage, o.Found, o.FromHeader = m.header.usage(), true, true
	case m.scan != nil:
		o.Usage, o.Found = m.scan.Usage()
	}
	if m.scan != nil {
		if o.FromHeader {
			_, _ = m.scan.Usage() // a plain body is parsed there
		}
		o.Streamed = m.scan.Streamed()
	}
	m.scan = nil // its buffers go now, not when the response does
	m.mu.Unlock()
	m.onEnd(o)
}
