package fakemodel

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/redline-dev/redline/internal/tokens"
)

// route names the API of a path the fake serves; Unknown for any other.
func route(path string) (tokens.Kind, bool) {
	switch path {
	case "/v1/chat/completions":
		return tokens.OpenAIChat, false
	case "/v1/responses":
		return tokens.OpenAIResponses, false
	case "/v1/messages":
		return tokens.Anthropic, false
	}
	if m, ok := strings.CutPrefix(path, "/v1beta/models/"); ok && !strings.Contains(m, "/") {
		if kind, stream := tokens.KindFromPath(path); kind == tokens.Gemini {
			return kind, stream
		}
	}
	return tokens.Unknown, false
}

// ServeHTTP answers one API call.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	kind, pathStream := route(r.URL.Path)
	if kind == tokens.Unknown {
		http.NotFound(w, r)
		return
	}
	if r.Method != http.MethodPost {
		http.Error(w, "POST only", http.StatusMethodNotAllowed)
		return
	}
	cfg, err := s.cfg.withKnobs(r.Header.Get(KnobHeader))
	if err != nil {
		http.Error(w, "fakemodel: "+KnobHeader+": "+err.Error(), http.StatusBadRequest)
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, tokens.MaxRequestBytes))
	if err != nil {
		http.Error(w, "fakemodel: reading the body: "+err.Error(), http.StatusRequestEntityTooLarge)
		return
	}
	req, err := tokens.ScanRequest(body, kind, pathStream)
	if err != nil {
		http.Error(w, "fakemodel: "+err.Error(), http.StatusBadRequest)
		return
	}
	s.requests.Add(1)
	g := &gen{s: s, cfg: cfg, w: w, r: r, sh: shapes[kind], in: cfg.Input, out: cfg.Length}
	if g.in == 0 {
		g.in = req.PromptTokens
	}
	if m := req.MaxOutput(); !cfg.IgnoreCap && m > 0 && m < g.out {
		g.out, g.capped = m, true
	}
	g.serve = g.out
	if cfg.Fail != FailNone && cfg.FailAfter < g.out {
		g.serve = cfg.FailAfter
	}
	// Usage in the body: where the API puts it, except an OpenAI chat stream that did not ask.
	g.bodyUsage = cfg.Cost == CostInBody && (kind != tokens.OpenAIChat || !req.Stream || req.IncludeUsage)
	g.usageNull = kind == tokens.OpenAIChat && req.IncludeUsage
	s.input.Add(g.in)
	switch {
	case !req.Stream:
		g.plain()
	case kind == tokens.Gemini && r.URL.Query().Get("alt") != "sse":
		g.stream(modeArray)
	case kind == tokens.Gemini:
		g.stream(modeSSECRLF)
	default:
		g.stream(modeSSE)
	}
}

// gen writes one response.
type gen struct {
	s   *Server
	cfg Config
	w   http.ResponseWriter
	r   *http.Request
	sh  shape
	in  int64
	out int64 // output tokens the response would have without a failure
	// serve is how many are generated: out, or FailAfter when it fails first.
	serve     int64
	capped    bool // out was cut to the request's cap
	bodyUsage bool // the body reports usage
	usageNull bool // OpenAI chat chunks carry "usage":null (the request asked for usage)
}

// next generates output token i (from 1), or reports the client gone.
func (g *gen) next() bool {
	if d := g.cfg.TokenDelay; d > 0 {
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-g.r.Context().Done():
			t.Stop()
		}
	}
	if g.r.Context().Err() != nil {
		return false
	}
	g.s.output.Add(1)
	return true
}

func tokenText(i int64) string { return " w" + strconv.FormatInt(i, 10) }

func (g *gen) usage() usage { return usage{in: g.in, out: g.serve, capped: g.capped} }

// costHeaders sets the cost header, or announces the trailer, before the header is written.
func (g *gen) costHeaders() {
	h := g.w.Header()
	switch g.cfg.Cost {
	case CostInHeader:
		h.Set(g.cfg.CostHeader, strconv.FormatInt(g.in+g.serve, 10))
	case CostInTrailer:
		h.Set("Trailer", g.cfg.CostHeader)
	}
}

// costTrailer sets the trailer after the body.
func (g *gen) costTrailer() {
	v := strconv.FormatInt(g.in+g.serve, 10)
	switch g.cfg.Cost {
	case CostInTrailer:
		g.w.Header().Set(g.cfg.CostHeader, v)
	case CostInUndeclaredTrailer:
		g.w.Header().Set(http.TrailerPrefix+g.cfg.CostHeader, v)
	}
}

func (g *gen) trailerMode() bool {
	return g.cfg.Cost == CostInTrailer || g.cfg.Cost == CostInUndeclaredTrailer
}

func (g *gen) plain() {
	var text strings.Builder
	for i := int64(1); i <= g.serve; i++ {
		if !g.next() {
			return
		}
		text.WriteString(tokenText(i))
	}
	h := g.w.Header()
	h.Set("Content-Type", "application/json")
	g.costHeaders()
	if g.cfg.Fail == FailErrorEvent && g.serve < g.out {
		b, _ := marshal(g.sh.errorBody())
		g.w.WriteHeader(http.StatusInternalServerError)
		_, _ = g.w.Write(b)
		g.costTrailer()
		return
	}
	b, _ := marshal(g.sh.body(g.usage(), text.String(), g.bodyUsage))
	if !g.trailerMode() {
		h.Set("Content-Length", strconv.Itoa(len(b)))
	}
	if g.cfg.Fail == FailCut && g.serve < g.out {
		h.Set("Content-Length", strconv.Itoa(len(b)))
		g.w.WriteHeader(http.StatusOK)
		_, _ = g.w.Write(b[:len(b)/2])
		g.abort()
	}
	g.w.WriteHeader(http.StatusOK)
	if g.cfg.Cost == CostInUndeclaredTrailer {
		// a body written whole is sent with a computed Content-Length, and trailers the
		// header did not announce are then dropped: flushing first makes it chunked
		_ = http.NewResponseController(g.w).Flush()
	}
	_, _ = g.w.Write(b)
	g.costTrailer()
}

// abort flushes what was written and cuts the connection.
func (g *gen) abort() {
	_ = http.NewResponseController(g.w).Flush()
	panic(http.ErrAbortHandler)
}

func (g *gen) stream(mode streamMode) {
	h := g.w.Header()
	if mode == modeArray {
		h.Set("Content-Type", "application/json")
	} else {
		h.Set("Content-Type", "text/event-stream")
		h.Set("Cache-Control", "no-cache")
	}
	g.costHeaders()
	e := &emitter{mode: mode}
	var buf bytes.Buffer
	if g.cfg.FixedLength {
		e.w = &buf
	} else {
		rc := http.NewResponseController(g.w)
		e.w, e.flush = g.w, rc.Flush
		g.w.WriteHeader(http.StatusOK)
	}
	g.sh.start(e, g)
	for i := int64(1); i <= g.serve && e.err == nil; i++ {
		if !g.next() {
			return
		}
		g.sh.token(e, g, tokenText(i), i)
	}
	if e.err != nil {
		return
	}
	failed := g.cfg.Fail != FailNone && g.serve < g.out
	switch {
	case failed && g.cfg.Fail == FailCut:
		if g.cfg.FixedLength {
			h.Set("Content-Length", strconv.Itoa(buf.Len()+1))
			g.w.WriteHeader(http.StatusOK)
			_, _ = g.w.Write(buf.Bytes())
		}
		g.abort()
	case failed:
		g.sh.fail(e, g)
	default:
		g.sh.end(e, g)
	}
	e.close()
	if g.cfg.FixedLength {
		h.Set("Content-Length", strconv.Itoa(buf.Len()))
		g.w.WriteHeader(http.StatusOK)
		_, _ = g.w.Write(buf.Bytes())
	}
	g.costTrailer()
}

type streamMode int

const (
	modeSSE     streamMode = iota
	modeSSECRLF            // Gemini ends its lines with CRLF
	modeArray              // Gemini's streamGenerateContent without alt=sse: one JSON array
)

// emitter writes events, flushing each (unless buffered for FixedLength).
type emitter struct {
	w     io.Writer
	flush func() error
	mode  streamMode
	n     int
	err   error
}

// event writes one event; typ may be empty.
func (e *emitter) event(typ string, data any) {
	b, err := marshal(data)
	if err != nil {
		e.err = err
		return
	}
	e.raw(typ, b)
}

func (e *emitter) raw(typ string, b []byte) {
	if e.err != nil {
		return
	}
	var out []byte
	switch e.mode {
	case modeArray:
		if e.n == 0 {
			out = append(out, '[')
		} else {
			out = append(out, ",\r\n"...)
		}
		out = append(out, b...)
	default:
		eol := "\n"
		if e.mode == modeSSECRLF {
			eol = "\r\n"
		}
		if typ != "" {
			out = append(out, "event: "+typ+eol...)
		}
		out = append(out, "data: "...)
		out = append(out, b...)
		out = append(out, eol+eol...)
	}
	e.n++
	e.write(out)
}

func (e *emitter) write(b []byte) {
	if _, err := e.w.Write(b); err != nil {
		e.err = err
		return
	}
	if e.flush != nil {
		if err := e.flush(); err != nil {
			e.err = err
		}
	}
}

// close ends an array stream.
func (e *emitter) close() {
	if e.mode == modeArray && e.err == nil {
		if e.n == 0 {
			e.write([]byte("[]"))
		} else {
			e.write([]byte("]"))
		}
	}
}

var errNotMarshalled = errors.New("fakemodel: event not marshalled")

func marshal(v any) ([]byte, error) {
	if v == nil {
		return nil, errNotMarshalled
	}
	var buf bytes.Buffer
	enc := newEncoder(&buf)
	if err := enc.Encode(v); err != nil {
		return nil, fmt.Errorf("fakemodel: marshalling an event: %w", err)
	}
	return bytes.TrimRight(buf.Bytes(), "\n"), nil
}
