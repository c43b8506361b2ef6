//nolint:goconst // the APIs' request field names, as in shapes.go
package fakemodel

import (
	"bytes"
	"net/http"

	"github.com/redline-dev/redline/internal/tokens"
)

// Call describes a request to the fake, in its API's request shape.
type Call struct {
	Kind   tokens.Kind
	Stream bool
	// IncludeUsage sets stream_options.include_usage (OpenAI chat streams).
	IncludeUsage bool
	// GeminiArray asks a Gemini stream as one JSON array (no alt=sse).
	GeminiArray bool
	// Cap is the output cap the request sets; 0 sets none.
	Cap int64
	// Prompt is the user message (default "Say hello.").
	Prompt string
}

// Path is the request path, with its query.
func (c Call) Path() string {
	switch c.Kind {
	case tokens.OpenAIChat:
		return "/v1/chat/completions"
	case tokens.OpenAIResponses:
		return "/v1/responses"
	case tokens.Anthropic:
		return "/v1/messages"
	case tokens.Gemini:
		switch {
		case !c.Stream:
			return "/v1beta/models/" + model + ":generateContent"
		case c.GeminiArray:
			return "/v1beta/models/" + model + ":streamGenerateContent"
		}
		return "/v1beta/models/" + model + ":streamGenerateContent?alt=sse"
	}
	return "/"
}

// Body is the request body.
func (c Call) Body() []byte {
	p := c.Prompt
	if p == "" {
		p = "Say hello."
	}
	b := obj{}
	var capField string
	switch c.Kind {
	case tokens.OpenAIChat:
		b["model"], b["messages"], capField = model, []any{obj{"role": "user", "content": p}}, "max_completion_tokens"
		if c.IncludeUsage {
			b["stream_options"] = obj{"include_usage": true}
		}
	case tokens.OpenAIResponses:
		b["model"], b["input"], capField = model, p, "max_output_tokens"
	case tokens.Anthropic:
		b["model"], b["messages"], capField = model, []any{obj{"role": "user", "content": p}}, "max_tokens"
	case tokens.Gemini:
		b["contents"] = []any{obj{"role": "user", "parts": []any{obj{"text": p}}}}
		if c.Cap > 0 {
			b["generationConfig"] = obj{"maxOutputTokens": c.Cap}
		}
	}
	if capField != "" && c.Cap > 0 {
		b[capField] = c.Cap
	}
	if c.Stream && c.Kind != tokens.Gemini {
		b["stream"] = true
	}
	out, err := marshal(b)
	if err != nil {
		panic(err) // a map of plain values always marshals
	}
	return out
}

// NewRequest returns the request to base (a URL without a path) for c.
func (c Call) NewRequest(base string) (*http.Request, error) {
	r, err := http.NewRequest(http.MethodPost, base+c.Path(), bytes.NewReader(c.Body()))
	if err != nil {
		return nil, err
	}
	r.Header.Set("Content-Type", "application/json")
	return r, nil
}

// Calls are the request shapes a test goes through: every API, streamed and not (Gemini's
// stream both as events and as an array; OpenAI chat's stream with and without usage).
func Calls(capTokens int64) []Call {
	return []Call{
		{Kind: tokens.OpenAIChat, Cap: capTokens},
		{Kind: tokens.OpenAIChat, Stream: true, Cap: capTokens},
		{Kind: tokens.OpenAIChat, Stream: true, IncludeUsage: true, Cap: capTokens},
		{Kind: tokens.OpenAIResponses, Cap: capTokens},
		{Kind: tokens.OpenAIResponses, Stream: true, Cap: capTokens},
		{Kind: tokens.Anthropic, Cap: capTokens},
		{Kind: tokens.Anthropic, Stream: true, Cap: capTokens},
		{Kind: tokens.Gemini, Cap: capTokens},
		{Kind: tokens.Gemini, Stream: true, Cap: capTokens},
		{Kind: tokens.Gemini, Stream: true, GeminiArray: true, Cap: capTokens},
	}
}

// Name names c in test output.
func (c Call) Name() string {
	n := c.Kind.String()
	if c.Stream {
		n += "/stream"
	}
	if c.IncludeUsage {
		n += "+usage"
	}
	if c.GeminiArray {
		n += "/array"
	}
	return n
}
