// Package tokens reads the token cost of AI API calls from their bodies: the
// size of a request before it is sent (ScanRequest), a lower output cap
// written into it (SetOutputCap), and the usage the upstream reports in its
// response, scanned as the bytes stream by (UsageScanner). It knows the
// shapes of OpenAI chat completions, OpenAI Responses, Anthropic messages and
// Gemini generateContent. Every function bounds its work and memory by its
// input or by the exported limits; nothing here does I/O.
//
// What a body that lies can do. A client's request sizes its own hold: it
// can make the prompt estimate low only as far as its text is denser than
// four bytes a token (the settle charges the real count), it cannot show a
// cap the upstream would not read (keys are matched exactly, duplicates
// resolve to the last as upstreams do), and a body that is not of its API's
// shape is refused, so the caller holds the rule's default. An upstream's
// response settles the hold: it can report any count up to MaxTokens, which
// no sum here wraps; a negative, fractional or non-numeric count is no usage
// at all, and the caller settles as its rule says for a missing count.
package tokens

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
)

// Kind is the API a body belongs to. The caller knows it from the route
// (KindFromPath); bodies are not guessed, because OpenAI chat and Anthropic
// messages share their field names.
type Kind int

// The API kinds.
const (
	Unknown Kind = iota
	OpenAIChat
	OpenAIResponses
	Anthropic
	Gemini
)

func (k Kind) String() string {
	switch k {
	case OpenAIChat:
		return "openai-chat"
	case OpenAIResponses:
		return "openai-responses"
	case Anthropic:
		return "anthropic"
	case Gemini:
		return "gemini"
	}
	return "unknown"
}

const (
	// MaxRequestBytes is the longest request body ScanRequest and
	// SetOutputCap accept; the caller reads at most this much.
	MaxRequestBytes = 1 << 20
	// MaxDepth is the deepest nesting of JSON objects and arrays accepted
	// in a request body.
	MaxDepth = 64
	// MaxTokens bounds every token count read from a body: larger values
	// are clamped to it (and flagged in Usage.Clamped), so that sums of
	// many counts cannot wrap an int64 counter.
	MaxTokens int64 = 1_000_000_000_000
)

// ErrTooLarge is returned for a request body over MaxRequestBytes.
var ErrTooLarge = errors.New("tokens: request body over MaxRequestBytes")

// ErrTooDeep is returned for a body nested deeper than MaxDepth.
var ErrTooDeep = errors.New("tokens: JSON nested deeper than MaxDepth")

// ErrShape is returned for a body that is JSON but not of the kind's shape.
var ErrShape = errors.New("tokens: body is not of the API's shape")

// KindFromPath names the API of a request path, and whether the path itself
// asks for a stream (Gemini's streamGenerateContent; the other kinds say so
// in their bodies).
func KindFromPath(path string) (kind Kind, stream bool) {
	switch {
	case hasSuffix(path, "/chat/completions"):
		return OpenAIChat, false
	case hasSuffix(path, "/responses"):
		return OpenAIResponses, false
	case hasSuffix(path, "/messages"):
		return Anthropic, false
	case hasSuffix(path, ":streamGenerateContent"):
		return Gemini, true
	case hasSuffix(path, ":generateContent"):
		return Gemini, false
	}
	return Unknown, false
}

func hasSuffix(path, suffix string) bool {
	if i := bytes.IndexByte([]byte(path), '?'); i >= 0 {
		path = path[:i]
	}
	return len(path) >= len(suffix) && path[len(path)-len(suffix):] == suffix
}

// checkDepth refuses bodies nested deeper than MaxDepth before any decoder
// sees them: one pass, no allocation.
func checkDepth(b []byte) error {
	depth, inString, escaped := 0, false, false
	for _, c := range b {
		if inString {
			switch {
			case escaped:
				escaped = false
			case c == '\\':
				escaped = true
			case c == '"':
				inString = false
			}
			continue
		}
		switch c {
		case '"':
			inString = true
		case '{', '[':
			depth++
			if depth > MaxDepth {
				return ErrTooDeep
			}
		case '}', ']':
			depth--
		}
	}
	return nil
}

// parseCount reads a token count: a JSON integer literal, no sign, no
// fraction, no exponent. Larger than MaxTokens is clamped (clamped true).
// null or absent reads as 0.
func parseCount(raw []byte) (n int64, clamped bool, err error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return 0, false, nil
	}
	for _, c := range raw {
		if c < '0' || c > '9' {
			return 0, false, fmt.Errorf("tokens: count %.32q is not a non-negative integer", raw)
		}
	}
	if len(raw) > 13 {
		return MaxTokens, true, nil
	}
	n, err = strconv.ParseInt(string(raw), 10, 64)
	if err != nil {
		return 0, false, fmt.Errorf("tokens: reading count %.32q: %w", raw, err)
	}
	if n > MaxTokens {
		return MaxTokens, true, nil
	}
	return n, false, nil
}

func clampAdd(a, b int64) int64 {
	if a+b > MaxTokens {
		return MaxTokens
	}
	return a + b
}
