// Package fakemodel is a fake model API server for tests: OpenAI chat completions and
// Responses, Anthropic messages and Gemini generateContent, streamed (server-sent events) and
// not, in the shapes the real APIs send and internal/tokens reads. It counts every token it
// generates, so a budget test holds what the upstream really spent, not what a body claimed.
//
// The output is deterministic (fixed ids, no timestamps): the same request gives the same
// bytes, so a test can compare what a client saw through a proxy with the upstream's own.
package fakemodel

import (
	"fmt"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// CostMode says where a response reports its usage.
type CostMode int

// The cost modes.
const (
	// CostInBody: the usage object where the API puts it (for an OpenAI chat stream, only when
	// the request asked with stream_options.include_usage).
	CostInBody CostMode = iota
	// CostInHeader: input+output in the cost response header; the body carries no usage.
	CostInHeader
	// CostInTrailer: in a trailer announced by the Trailer header; no usage in the body.
	CostInTrailer
	// CostInUndeclaredTrailer: in a trailer the Trailer header did not announce.
	CostInUndeclaredTrailer
)

// FailMode says how a response fails after Config.FailAfter output tokens.
type FailMode int

// The failure modes.
const (
	FailNone FailMode = iota
	// FailCut: the connection is cut (no end of the chunked body, or short of its
	// Content-Length).
	FailCut
	// FailErrorEvent: the stream ends with the API's error event; a plain response is a 500
	// with the API's error body.
	FailErrorEvent
)

// DefaultCostHeader is the header (or trailer) of CostInHeader and CostInTrailer.
const DefaultCostHeader = "Redline-Cost"

// KnobHeader is the request header that overrides a Config for one request: settings
// separated by ";", each "name=value" or a bare flag: length=N, input=N, ignore-cap,
// cost=body|header|trailer|undeclared-trailer, fail=cut:K|error:K, delay=DURATION,
// fixed-length. An unknown setting is answered 400, so a typo cannot pass unnoticed.
const KnobHeader = "X-Fake-Model"

// Config is a server's behaviour.
type Config struct {
	// Length is how many output tokens a response produces when the request's cap (its
	// output cap times its choices) allows; default 16.
	Length int64
	// IgnoreCap produces Length tokens whatever the request's cap: an upstream that spends
	// past the cap the sidecar wrote.
	IgnoreCap bool
	// Input is the input token count reported; 0 reports the estimate internal/tokens makes
	// of the request (Request.PromptTokens), so a hold sized from it is exact.
	Input int64
	Cost  CostMode
	// CostHeader names the cost header or trailer (default DefaultCostHeader).
	CostHeader string
	Fail       FailMode
	// FailAfter is how many output tokens are served before the failure.
	FailAfter int64
	// TokenDelay is the time each output token takes (the request's cancellation stops the
	// generation, as real upstreams stop on a client's disconnect).
	TokenDelay time.Duration
	// FixedLength sends a stream buffered whole, with a Content-Length.
	FixedLength bool
}

// Served counts what a server generated.
type Served struct {
	Input, Output int64
	Requests      int64
}

// Total is Input+Output.
func (s Served) Total() int64 { return s.Input + s.Output }

// Server is the fake upstream, an http.Handler.
type Server struct {
	cfg                     Config
	input, output, requests atomic.Int64
}

// New returns a server behaving as cfg says (defaults filled in).
func New(cfg Config) *Server {
	if cfg.Length <= 0 {
		cfg.Length = 16
	}
	if cfg.CostHeader == "" {
		cfg.CostHeader = DefaultCostHeader
	}
	return &Server{cfg: cfg}
}

// Start serves a new Server on a loopback port until the test ends; it returns the server and
// its base URL.
func Start(tb testing.TB, cfg Config) (*Server, string) {
	tb.Helper()
	s := New(cfg)
	ts := httptest.NewServer(s)
	tb.Cleanup(ts.Close)
	return s, ts.URL
}

// Served returns the totals so far. Tokens are counted as they are generated, before they are
// written: a token generated for a client that has gone away was still spent.
func (s *Server) Served() Served {
	return Served{Input: s.input.Load(), Output: s.output.Load(), Requests: s.requests.Load()}
}

// withKnobs returns cfg overridden by a KnobHeader value.
func (c Config) withKnobs(v string) (Config, error) {
	for f := range strings.SplitSeq(v, ";") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		name, val, _ := strings.Cut(f, "=")
		var err error
		switch name {
		case "length":
			c.Length, err = positive(val)
		case "input":
			c.Input, err = positive(val)
		case "ignore-cap":
			c.IgnoreCap = true
		case "fixed-length":
			c.FixedLength = true
		case "delay":
			c.TokenDelay, err = time.ParseDuration(val)
		case "cost":
			c.Cost, err = costMode(val)
		case "fail":
			mode, k, _ := strings.Cut(val, ":")
			switch mode {
			case "cut":
				c.Fail = FailCut
			case "error": //nolint:goconst // a knob's word, not a field of the APIs
				c.Fail = FailErrorEvent
			default:
				return c, fmt.Errorf("fail mode %q is not cut or error", mode)
			}
			c.FailAfter, err = strconv.ParseInt(k, 10, 64)
			if err == nil && c.FailAfter < 0 {
				err = fmt.Errorf("negative fail count %d", c.FailAfter)
			}
		default:
			return c, fmt.Errorf("unknown setting %q", name)
		}
		if err != nil {
			return c, fmt.Errorf("setting %q: %w", f, err)
		}
	}
	return c, nil
}

func positive(v string) (int64, error) {
	n, err := strconv.ParseInt(v, 10, 64)
	if err == nil && n <= 0 {
		err = fmt.Errorf("%d is not positive", n)
	}
	return n, err
}

func costMode(v string) (CostMode, error) {
	switch v {
	case "body":
		return CostInBody, nil
	case "header":
		return CostInHeader, nil
	case "trailer":
		return CostInTrailer, nil
	case "undeclared-trailer":
		return CostInUndeclaredTrailer, nil
	}
	return 0, fmt.Errorf("cost mode %q is not body, header, trailer or undeclared-trailer", v)
}
