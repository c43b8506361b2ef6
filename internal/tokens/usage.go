package tokens

import (
	"bytes"
	"encoding/json"
)

// MaxResponseBytes bounds the plain JSON response body a UsageScanner keeps
// to parse at its end; over it, the scanner reports no usage.
const MaxResponseBytes = 1 << 20

// Usage is the token usage a response reports.
type Usage struct {
	Input, Output int64
	// Total is the total the response gave, 0 when it gave none.
	Total int64
	// Clamped: a count was over MaxTokens and was read as MaxTokens.
	Clamped bool
}

// Cost is what the response spent: Total when the response gave one, else
// Input+Output; at most MaxTokens.
func (u Usage) Cost() int64 {
	if u.Total > 0 {
		return u.Total
	}
	return clampAdd(u.Input, u.Output)
}

// UsageScanner reads the usage out of a response body fed to it as it
// arrives. Where each kind reports it:
//   - OpenAI chat: usage.{prompt_tokens, completion_tokens, total_tokens},
//     top-level, or in the stream's chunk that carries it;
//   - OpenAI Responses: usage.{input_tokens, output_tokens, total_tokens},
//     top-level, or response.usage of the stream's response.completed (or
//     .incomplete, .failed) event;
//   - Anthropic: usage.{input_tokens, output_tokens} top-level, or
//     message.usage of message_start and usage of message_delta (output is
//     cumulative there); cache_creation_input_tokens and
//     cache_read_input_tokens count as input;
//   - Gemini: usageMetadata.{promptTokenCount, candidatesTokenCount,
//     totalTokenCount}, the last chunk's winning in a stream (an event
//     stream, or streamGenerateContent's JSON array).
//
// The last report wins. A count that is negative or not an integer literal
// spoils the whole response: Usage reports none. An event stream is held at
// most one event at a time (MaxEventBytes); a plain body up to
// MaxResponseBytes. The result does not depend on how the bytes are split
// into Write calls.
type UsageScanner struct {
	kind   Kind
	stream bool
	sse    sseParser
	body   []byte
	over   bool
	u      Usage
	seen   bool
	bad    bool
	n      int64 // bytes written
	text   int64 // the output estimate of the events read so far (Streamed)
}

// NewUsageScanner returns a scanner for a response of the kind; eventStream
// says the response is text/event-stream (from its Content-Type), else it is
// read as one JSON document.
func NewUsageScanner(kind Kind, eventStream bool) *UsageScanner {
	s := &UsageScanner{kind: kind, stream: eventStream}
	s.sse.onEvent = s.onEvent
	s.sse.onSkip = func(size int) { s.text = clampAdd(s.text, int64(size+3)/4) }
	return s
}

// Write feeds the next bytes of the body. It never fails.
func (s *UsageScanner) Write(p []byte) (int, error) {
	s.n += int64(len(p))
	if s.stream {
		s.sse.write(p)
		return len(p), nil
	}
	if !s.over {
		if len(s.body)+len(p) > MaxResponseBytes {
			s.over, s.body = true, nil
		} else {
			s.body = append(s.body, p...)
		}
	}
	return len(p), nil
}

// Usage returns the usage read, once the body has ended; ok is false when
// the body reported none, reported an invalid count, or (plain JSON) was over
// MaxResponseBytes or not JSON. A stream cut short reports what its events
// said before the cut: an event without its closing blank line is dropped,
// as the event stream format says.
func (s *UsageScanner) Usage() (Usage, bool) {
	if !s.stream && !s.over && s.body != nil {
		body := s.body
		s.body = nil
		if firstByte(body) == '[' {
			var elems []json.RawMessage
			if json.Unmarshal(body, &elems) == nil {
				for _, e := range elems {
					s.read(e)
				}
			}
		} else {
			s.read(body)
		}
		s.text = textTokens(body)
		s.over = true // parsed once
	} else if !s.stream && s.body == nil && s.text == 0 {
		s.text = (s.n + 3) / 4 // over MaxResponseBytes: every byte may be text
	}
	if s.bad || !s.seen {
		return Usage{}, false
	}
	return s.u, true
}

// Streamed estimates the output tokens that passed through the scanner, from
// above, for a response that reports no usage (or was cut after a partial
// report): the text of each event (content, text, delta, arguments,
// partial_json, thinking, refusal, reasoning and reasoning_content strings),
// four bytes a token as the prompt's estimate, at least one token an event
// that carries any (most servers stream a token an event); an event over
// MaxEventBytes, and a plain body over MaxResponseBytes, counts four bytes a
// token of all its bytes. Call it after Usage.
func (s *UsageScanner) Streamed() int64 { return s.text }

// textKeys name the string values that are generated text in the responses
// of the kinds this package reads.
var textKeys = map[string]bool{
	"content": true, "text": true, "delta": true, "arguments": true, "partial_json": true,
	"thinking": true, "refusal": true, "reasoning": true, "reasoning_content": true,
}

// textTokens estimates the generated text of one JSON document: its textKeys
// strings at four bytes a token, at least one when there is any.
func textTokens(v []byte) int64 {
	n := sumStrings(v, func(key []byte) bool { return textKeys[string(key)] })
	if n == 0 {
		return 0
	}
	return max((n+3)/4, 1)
}

// Skipped counts the events skipped for being over MaxEventBytes.
func (s *UsageScanner) Skipped() int { return s.sse.skipped }

var usageMark = []byte(`"usage`)

func (s *UsageScanner) onEvent(_, data []byte) {
	s.text = clampAdd(s.text, textTokens(data))
	if mayHaveUsage(data) {
		s.read(data)
	}
}

// mayHaveUsage is false for the chunks that certainly carry no usage: no
// "usage in them but as "usage":null (OpenAI sends that in every chunk of a
// stream that asked for usage). Most chunks carry text, so this keeps them
// from being decoded.
func mayHaveUsage(data []byte) bool {
	for {
		i := bytes.Index(data, usageMark)
		if i < 0 {
			return false
		}
		data = data[i+len(usageMark):]
		rest, ok := bytes.CutPrefix(data, []byte(`"`))
		if !ok {
			return true
		}
		rest = bytes.TrimLeft(rest, " \t\r\n")
		if rest, ok = bytes.CutPrefix(rest, []byte(":")); !ok {
			return true
		}
		if !bytes.HasPrefix(bytes.TrimLeft(rest, " \t\r\n"), []byte("null")) {
			return true
		}
	}
}

// counts names a kind's usage fields.
type counts struct{ input, output, total []string }

var (
	openaiChatCounts = counts{[]string{"prompt_tokens"}, []string{"completion_tokens"}, []string{"total_tokens"}}
	responsesCounts  = counts{[]string{"input_tokens"}, []string{"output_tokens"}, []string{"total_tokens"}}
	anthropicCounts  = counts{[]string{"input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens"}, []string{"output_tokens"}, nil}
	geminiCounts     = counts{[]string{"promptTokenCount"}, []string{"candidatesTokenCount"}, []string{"totalTokenCount"}}
)

// read takes the usage out of one JSON document (an event's data or a whole
// body).
func (s *UsageScanner) read(doc []byte) {
	if firstByte(doc) != '{' {
		return
	}
	var top map[string]json.RawMessage
	if json.Unmarshal(doc, &top) != nil {
		return
	}
	switch s.kind {
	case OpenAIChat, OpenAICompletions, OpenAIEmbeddings:
		s.take(top["usage"], openaiChatCounts, false)
	case OpenAIResponses:
		switch typ := stringValue(top["type"]); typ {
		case "response.completed", "response.incomplete", "response.failed":
			if resp := object(top["response"]); resp != nil {
				s.take(resp["usage"], responsesCounts, false)
			}
		case "":
			s.take(top["usage"], responsesCounts, false)
		}
	case Anthropic:
		switch stringValue(top["type"]) {
		case "message_start":
			if msg := object(top["message"]); msg != nil {
				s.take(msg["usage"], anthropicCounts, false)
			}
		case "message_delta":
			s.take(top["usage"], anthropicCounts, true)
		case "message":
			s.take(top["usage"], anthropicCounts, false)
		}
	case Gemini:
		s.take(top["usageMetadata"], geminiCounts, false)
	}
}

// take reads a usage object. delta: Anthropic's message_delta, whose counts
// replace only the ones it names.
func (s *UsageScanner) take(raw json.RawMessage, c counts, delta bool) {
	m := object(raw)
	if m == nil {
		return
	}
	sum := func(names []string) (int64, bool) {
		var total int64
		found := false
		for _, n := range names {
			v, ok := m[n]
			if !ok {
				continue
			}
			found = true
			x, clamped, err := parseCount(v)
			if err != nil {
				s.bad = true
			}
			if clamped {
				s.u.Clamped = true
			}
			total = clampAdd(total, x)
		}
		return total, found
	}
	in, hasIn := sum(c.input)
	out, hasOut := sum(c.output)
	tot, hasTot := sum(c.total)
	if !delta || hasIn {
		s.u.Input = in
	}
	if !delta || hasOut {
		s.u.Output = out
	}
	if !delta || hasTot {
		s.u.Total = tot
	}
	s.seen = true
}

func object(raw json.RawMessage) map[string]json.RawMessage {
	if firstByte(raw) != '{' {
		return nil
	}
	var m map[string]json.RawMessage
	if json.Unmarshal(raw, &m) != nil {
		return nil
	}
	return m
}

func stringValue(raw json.RawMessage) string {
	if firstByte(raw) != '"' {
		return ""
	}
	var s string
	if json.Unmarshal(raw, &s) != nil {
		return ""
	}
	return s
}
