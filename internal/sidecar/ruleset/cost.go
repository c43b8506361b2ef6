package ruleset

import (
	"fmt"
	"net/http"
	"net/textproto"
	"slices"
	"strings"
	"time"

	"github.com/redline-dev/redline/internal/policydoc"
	"github.com/redline-dev/redline/internal/tokens"
)

// Cost is a rule's cost that comes from the response (a Rule without one costs one unit per
// request): the request holds an estimate, sized from its body where Usage can read it,
// before it is forwarded, and its response's usage settles the hold.
type Cost struct {
	// ByPath reads the body of the API the request path names (usage Auto): KindFor.
	ByPath bool
	// Kind is the API whose bodies are read when not ByPath; tokens.Unknown reads no body
	// (usage Header), so every request holds DefaultHold and only Header settles it.
	Kind tokens.Kind
	// Header is the response header, or trailer, that reports the cost, in canonical form
	// (as http.Header keys it). It wins over a body's usage, and is removed before the
	// client sees the response.
	Header string
	// DefaultHold is what a request holds when its body cannot be sized; at most the rule's
	// capacity.
	DefaultHold int64
	// MinOutput is the least output a request is let through with; at most the capacity.
	MinOutput int64
	// ZeroOnError gives the whole hold back on an upstream error, a timeout or a client
	// abort; otherwise they are charged the usage reported before them, else the whole hold.
	ZeroOnError bool
	// Timeout is how long the hold waits for its settle (the limiter ends it at the window's
	// end too).
	Timeout time.Duration
	// RefuseUnsized refuses a request whose body cannot be sized (on a path whose API is not
	// read, too large, too slow, compressed, not of its API's shape, a count not understood)
	// rather than holding DefaultHold with no cap written; a decision API reserve without a
	// size and an Envoy descriptor are refused too. Never with usage Header (Kind Unknown
	// and not ByPath), which reads no body.
	RefuseUnsized bool
}

// ReadsBody says whether the rule sizes requests from their bodies (any usage but Header).
func (c *Cost) ReadsBody() bool { return c.ByPath || c.Kind != tokens.Unknown }

// usageKinds are the document's usages that read a body of one API whatever the path.
var usageKinds = map[string]tokens.Kind{
	policydoc.UsageOpenAIChat:      tokens.OpenAIChat,
	policydoc.UsageOpenAIResponses: tokens.OpenAIResponses,
	policydoc.UsageAnthropic:       tokens.Anthropic,
	policydoc.UsageGemini:          tokens.Gemini,
}

// KindFor names the API whose bodies size and settle a request to path (the path without its
// query is enough), and whether the path itself asks for a stream (Gemini's
// streamGenerateContent). tokens.Unknown: read no body; the request is unsized (refused, or
// holds DefaultHold and settles by the header only, as RefuseUnsized says); so it is with
// usage Auto on a path that names no API this release reads. Paths are read without case.
func (c *Cost) KindFor(path string) (kind tokens.Kind, stream bool) {
	k, s := tokens.KindFromPath(path)
	if c.ByPath {
		return k, s
	}
	return c.Kind, s && k == c.Kind
}

// newCost compiles the document's cost of a rule (nil: none). Parse checked its values; what
// a document that skipped Parse could still hold is checked again here.
func newCost(c *policydoc.Cost) (*Cost, error) {
	if c == nil {
		return nil, nil
	}
	if c.From != policydoc.CostFromResponse {
		return nil, fmt.Errorf("unknown cost source %q", c.From)
	}
	out := &Cost{
		Header:        textproto.CanonicalMIMEHeaderKey(c.Header),
		DefaultHold:   c.DefaultHold,
		MinOutput:     c.MinOutput,
		ZeroOnError:   c.OnError == policydoc.OnErrorZero,
		Timeout:       time.Duration(c.TimeoutMS) * time.Millisecond,
		RefuseUnsized: c.UnsizedBody == policydoc.UnsizedRefuse,
	}
	switch c.Usage {
	case policydoc.UsageAuto:
		out.ByPath = true
	case policydoc.UsageHeader:
	default:
		k, ok := usageKinds[c.Usage]
		if !ok {
			return nil, fmt.Errorf("unknown cost usage %q", c.Usage)
		}
		out.Kind = k
	}
	if err := policydoc.CheckCostHeader(c.Header); err != nil {
		return nil, fmt.Errorf("cost %w", err)
	}
	if out.RefuseUnsized && !out.ReadsBody() {
		return nil, fmt.Errorf("cost unsizedBody %s with usage %s would refuse every request", c.UnsizedBody, c.Usage)
	}
	if out.DefaultHold < 1 || out.MinOutput < 0 || out.Timeout < time.Second {
		return nil, fmt.Errorf("cost defaultHold %d, minOutput %d, timeout %s out of bounds", out.DefaultHold, out.MinOutput, out.Timeout)
	}
	return out, nil
}

// methodMatches reports whether a rule's method want (upper-case, as the API writes it) counts
// a request's method: compared case-insensitively, since some servers route a "get" as a GET
// (and a rule must not be dodged by spelling a method in lower case), and GET counts HEAD,
// which every common router serves with the GET handler.
func methodMatches(want, method string) bool {
	return strings.EqualFold(want, method) || want == http.MethodGet && strings.EqualFold(method, http.MethodHead)
}

// Matches reports whether a request (its method, normalised path and header fields, canonical
// names) is one the rule counts. A nil Match matches every request.
func (m *Match) Matches(method, path string, header http.Header) bool {
	if m == nil {
		return true
	}
	if m.Path != nil && !m.Path.Matches(path) {
		return false
	}
	if len(m.Methods) > 0 && !slices.ContainsFunc(m.Methods, func(want string) bool { return methodMatches(want, method) }) {
		return false
	}
	for _, h := range m.Headers {
		vals := header[h.Name]
		if len(vals) == 0 {
			return false
		}
		if h.Value != nil && !slices.Contains(vals, *h.Value) {
			return false
		}
	}
	return true
}
