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
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
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
	// OpenAICompletions is OpenAI's legacy text completions (/v1/completions), which
	// vLLM, SGLang, llama.cpp and LiteLLM still serve.
	OpenAICompletions
	// OpenAIEmbeddings is OpenAI's embeddings (/v1/embeddings): input only, no output.
	OpenAIEmbeddings
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
	case OpenAICompletions:
		return "openai-completions"
	case OpenAIEmbeddings:
		return "openai-embeddings"
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

// ErrNotJSON is returned for a body that is not JSON.
var ErrNotJSON = errors.New("tokens: body is not JSON")

// ErrNumber is returned for a count (an output cap, a choice count) or a
// flag (stream, include_usage) in a form this package does not read as the
// upstreams do: true, a fraction, a negative other than -1, a string that is
// not a number. The caller cannot know what the upstream will spend.
var ErrNumber = errors.New("tokens: a count or flag in a form not understood")

// KindFromPath names the API of a request path, and whether the path itself
// asks for a stream (Gemini's streamGenerateContent; the other kinds say so
// in their bodies). Case does not matter: an upstream that routes without it
// (or a gateway that lowercases) serves /v1/Chat/Completions as the API, so
// the path is read as the API rather than as no API at all.
func KindFromPath(path string) (kind Kind, stream bool) {
	switch {
	case hasSuffix(path, "/chat/completions"):
		return OpenAIChat, false
	case hasSuffix(path, "/completions"):
		return OpenAICompletions, false
	case hasSuffix(path, "/embeddings"):
		return OpenAIEmbeddings, false
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
	if i := strings.IndexByte(path, '?'); i >= 0 {
		path = path[:i]
	}
	return len(path) >= len(suffix) && strings.EqualFold(path[len(path)-len(suffix):], suffix)
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

// jsonNull is JSON's null, which reads as absent.
const jsonNull = "null"

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

// readNumber reads a count of a request body as the upstreams do (pydantic's
// lax mode in vLLM, SGLang and LiteLLM; llama.cpp's JSON reader): a JSON
// integer, an integral float (100000.0, 1e5) or a string holding either
// ("100000"). Larger than MaxTokens is MaxTokens; a negative integral value is
// returned as it is (the caller says what -1 means). null or absent is
// present false. Anything else (true, a fraction, a string that is not a
// number, an object) is ErrNumber: what the upstream would make of it is not
// known.
func readNumber(raw []byte) (n int64, present bool, err error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == jsonNull {
		return 0, false, nil
	}
	text := raw
	if raw[0] == '"' {
		var s string
		if json.Unmarshal(raw, &s) != nil {
			return 0, false, fmt.Errorf("%w: %.32q", ErrNumber, raw)
		}
		text = []byte(strings.TrimSpace(s))
	}
	if len(text) == 0 || len(text) > 64 {
		return 0, false, fmt.Errorf("%w: %.32q", ErrNumber, raw)
	}
	for _, c := range text {
		if !strings.ContainsRune("0123456789-+.eE", rune(c)) {
			return 0, false, fmt.Errorf("%w: %.32q is not a number", ErrNumber, raw)
		}
	}
	if i, err := strconv.ParseInt(string(text), 10, 64); err == nil {
		return min(i, MaxTokens), true, nil
	}
	f, err := strconv.ParseFloat(string(text), 64)
	switch {
	case err != nil && !errors.Is(err, strconv.ErrRange):
		return 0, false, fmt.Errorf("%w: %.32q is not a number", ErrNumber, raw)
	case math.IsNaN(f) || math.IsInf(f, -1) || f != math.Trunc(f):
		return 0, false, fmt.Errorf("%w: %.32q is not an integer", ErrNumber, raw)
	case f >= float64(MaxTokens):
		return MaxTokens, true, nil
	case f <= -float64(MaxTokens):
		return -MaxTokens, true, nil
	}
	return int64(f), true, nil
}

// readCap reads an output cap: a count of at least 1; -1 and 0 are no cap
// (llama.cpp generates until its context ends for -1; an upstream that reads
// 0 as no cap does the same), so the caller writes one. Other negatives are
// ErrNumber.
func readCap(raw []byte) (n int64, noCap bool, err error) {
	n, present, err := readNumber(raw)
	switch {
	case err != nil:
		return 0, false, err
	case !present:
		return 0, false, nil
	case n == 0 || n == -1:
		return 0, true, nil
	case n < 0:
		return 0, false, fmt.Errorf("%w: output cap %d", ErrNumber, n)
	}
	return n, false, nil
}

// readFlag reads a boolean as pydantic's lax mode does: JSON true or false,
// 0 or 1, or a string of true/false, 1/0, yes/no, on/off, t/f, y/n in any
// case. null or absent is false. Anything else is ErrNumber.
func readFlag(raw []byte) (bool, error) {
	raw = bytes.TrimSpace(raw)
	switch string(raw) {
	case "", "null", "false", "0":
		return false, nil
	case "true", "1":
		return true, nil
	}
	if raw[0] == '"' {
		var s string
		if json.Unmarshal(raw, &s) == nil {
			switch strings.ToLower(strings.TrimSpace(s)) {
			case "true", "1", "yes", "on", "t", "y":
				return true, nil
			case "false", "0", "no", "off", "f", "n":
				return false, nil
			}
		}
	}
	return false, fmt.Errorf("%w: %.32q is not a boolean", ErrNumber, raw)
}

func clampAdd(a, b int64) int64 {
	if a+b > MaxTokens {
		return MaxTokens
	}
	return a + b
}
