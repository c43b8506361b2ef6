package tokens

import (
	"strings"
	"testing"
)

// scanAll feeds body in chunks of size n (0: all at once).
func scanAll(kind Kind, sse bool, body []byte, n int) (*UsageScanner, Usage, bool) {
	s := NewUsageScanner(kind, sse)
	if n <= 0 {
		n = len(body) + 1
	}
	for len(body) > 0 {
		k := min(n, len(body))
		if w, err := s.Write(body[:k]); w != k || err != nil {
			panic("Write failed")
		}
		body = body[k:]
	}
	u, ok := s.Usage()
	return s, u, ok
}

func TestUsageDocumentedResponses(t *testing.T) {
	tests := []struct {
		file string
		kind Kind
		sse  bool
		want Usage
		cost int64
	}{
		{"openai-chat-stream.sse", OpenAIChat, true, Usage{Input: 9, Output: 12, Total: 21}, 21},
		{"openai-chat.json", OpenAIChat, false, Usage{Input: 1117, Output: 46, Total: 1163}, 1163},
		{"openai-responses-stream.sse", OpenAIResponses, true, Usage{Input: 37, Output: 11, Total: 48}, 48},
		{"openai-responses.json", OpenAIResponses, false, Usage{Input: 328, Output: 52, Total: 380}, 380},
		{"anthropic-stream.sse", Anthropic, true, Usage{Input: 25, Output: 15}, 40},
		{"anthropic.json", Anthropic, false, Usage{Input: 2095, Output: 503}, 2598},
		{"gemini-stream.sse", Gemini, true, Usage{Input: 8, Output: 7, Total: 15}, 15},
		{"gemini.json", Gemini, false, Usage{Input: 8, Output: 10, Total: 38}, 38},
		{"gemini-stream-array.json", Gemini, false, Usage{Input: 8, Output: 6, Total: 14}, 14},
		// the stream was cut by an error event: what message_start said is what was used
		{"anthropic-error-stream.sse", Anthropic, true, Usage{Input: 40, Output: 1}, 41},
	}
	for _, tt := range tests {
		body := readTestdata(t, tt.file)
		for _, crlf := range []bool{false, true} {
			b := body
			if crlf {
				b = []byte(strings.ReplaceAll(string(body), "\n", "\r\n"))
			}
			for _, n := range []int{0, 1, 2, 7, 64} {
				_, u, ok := scanAll(tt.kind, tt.sse, b, n)
				if !ok || u != tt.want || u.Cost() != tt.cost {
					t.Errorf("%s (CRLF %v, chunks of %d): Usage = %+v, %v, cost %d; want %+v, cost %d", tt.file, crlf, n, u, ok, u.Cost(), tt.want, tt.cost)
				}
			}
		}
	}
}

func TestUsageHostileOrBroken(t *testing.T) {
	tests := []struct {
		name string
		kind Kind
		sse  bool
		body string
		want Usage
		ok   bool
	}{
		{"huge count clamped", OpenAIChat, false, `{"usage":{"prompt_tokens":1,"completion_tokens":99999999999999999999999,"total_tokens":5000000000000}}`,
			Usage{Input: 1, Output: MaxTokens, Total: MaxTokens, Clamped: true}, true},
		{"sum clamped", Anthropic, false, `{"type":"message","usage":{"input_tokens":900000000000,"output_tokens":900000000000}}`,
			Usage{Input: 900000000000, Output: 900000000000}, true},
		{"negative", OpenAIChat, false, `{"usage":{"prompt_tokens":-5,"completion_tokens":3}}`, Usage{}, false},
		{"float", Gemini, false, `{"usageMetadata":{"promptTokenCount":1.5}}`, Usage{}, false},
		{"exponent", Gemini, false, `{"usageMetadata":{"promptTokenCount":1e3}}`, Usage{}, false},
		{"string count", OpenAIResponses, false, `{"usage":{"input_tokens":"12"}}`, Usage{}, false},
		{"a bad count spoils the stream", OpenAIChat, true, "data: {\"usage\":{\"prompt_tokens\":-1}}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":2,\"total_tokens\":3}}\n\n", Usage{}, false},
		{"error object, no usage", OpenAIChat, false, `{"error":{"message":"Rate limit","type":"requests","code":"rate_limit_exceeded"}}`, Usage{}, false},
		{"error chunk mid-stream keeps nothing", OpenAIChat, true, "data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}],\"usage\":null}\n\ndata: {\"error\":{\"message\":\"server error\"}}\n\n", Usage{}, false},
		{"stream cut mid-event", OpenAIChat, true, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":2,\"total_tokens\":3}}\n", Usage{}, false},
		{"stream cut after the usage event", OpenAIChat, true, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":2,\"total_tokens\":3}}\n\ndata: {\"choi", Usage{Input: 1, Output: 2, Total: 3}, true},
		{"responses failed reports usage", OpenAIResponses, true, "event: response.failed\ndata: {\"type\":\"response.failed\",\"response\":{\"status\":\"failed\",\"usage\":{\"input_tokens\":4,\"output_tokens\":0,\"total_tokens\":4}}}\n\n", Usage{Input: 4, Total: 4}, true},
		{"ignored cap: the usage says what was spent", Anthropic, true, "data: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":10,\"output_tokens\":1}}}\n\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":5000}}\n\n", Usage{Input: 10, Output: 5000}, true},
		{"anthropic cache counts as input", Anthropic, false, `{"type":"message","usage":{"input_tokens":3,"cache_creation_input_tokens":100,"cache_read_input_tokens":20,"output_tokens":9}}`, Usage{Input: 123, Output: 9}, true},
		{"gemini last chunk wins", Gemini, true, "data: {\"usageMetadata\":{\"promptTokenCount\":5,\"candidatesTokenCount\":1,\"totalTokenCount\":6}}\n\ndata: {\"usageMetadata\":{\"promptTokenCount\":5,\"candidatesTokenCount\":4,\"totalTokenCount\":9}}\n\n", Usage{Input: 5, Output: 4, Total: 9}, true},
		{"comments, other fields, multi-line data", OpenAIChat, true, ": keep-alive\nid: 7\nretry: 10\ndata: {\"choices\":[],\ndata: \"usage\":{\"prompt_tokens\":2,\"completion_tokens\":2,\"total_tokens\":4}}\n\n", Usage{Input: 2, Output: 2, Total: 4}, true},
		{"CR line ends", OpenAIChat, true, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":2,\"completion_tokens\":2,\"total_tokens\":4}}\r\r", Usage{Input: 2, Output: 2, Total: 4}, true},
		{"invalid UTF-8 in text", OpenAIChat, true, "data: {\"choices\":[{\"delta\":{\"content\":\"\xff\"}}]}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":2,\"completion_tokens\":2,\"total_tokens\":4}}\n\n", Usage{Input: 2, Output: 2, Total: 4}, true},
		{"not JSON", OpenAIChat, false, `<html>502 Bad Gateway</html>`, Usage{}, false},
		{"empty body", Anthropic, false, ``, Usage{}, false},
		{"plain body read as a stream", OpenAIChat, true, `{"usage":{"prompt_tokens":1}}`, Usage{}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, n := range []int{0, 1, 3} {
				_, u, ok := scanAll(tt.kind, tt.sse, []byte(tt.body), n)
				if ok != tt.ok || u != tt.want {
					t.Errorf("chunks of %d: Usage = %+v, %v; want %+v, %v", n, u, ok, tt.want, tt.ok)
				}
			}
		})
	}
	u := Usage{Input: 900000000000, Output: 900000000000}
	if u.Cost() != MaxTokens {
		t.Errorf("Cost of %+v = %d, want MaxTokens", u, u.Cost())
	}
}

func TestUsageBounds(t *testing.T) {
	usageEvent := "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":2,\"completion_tokens\":2,\"total_tokens\":4}}\n\n"
	big := "data: {\"choices\":[{\"delta\":{\"content\":\"" + strings.Repeat("x", MaxEventBytes) + "\"}}],\"usage\":{\"prompt_tokens\":999}}\n\n"
	s, u, ok := scanAll(OpenAIChat, true, []byte(big+usageEvent), 4096)
	if !ok || u.Total != 4 || s.Skipped() != 1 {
		t.Errorf("an event over MaxEventBytes then a usage event: Usage = %+v, %v, skipped %d; want total 4, 1 skipped", u, ok, s.Skipped())
	}
	if c := cap(s.sse.line) + cap(s.sse.data); c > 3*MaxEventBytes {
		t.Errorf("scanner holds %d bytes of buffers after an oversized event, want at most %d", c, 3*MaxEventBytes)
	}

	plain := `{"usage":{"prompt_tokens":1,"completion_tokens":1}, "pad":"` + strings.Repeat("x", MaxResponseBytes) + `"}`
	s, _, ok = scanAll(OpenAIChat, false, []byte(plain), 1<<16)
	if ok {
		t.Error("a plain body over MaxResponseBytes reported usage")
	}
	if s.body != nil {
		t.Errorf("scanner kept %d bytes of a body over MaxResponseBytes", len(s.body))
	}
}

// TestStreamedEstimatesWhatPassed: a stream that reports no usage is estimated from its text,
// at least one token an event that carries any; a cut Anthropic stream's partial usage is
// below what its events carried.
func TestStreamedEstimatesWhatPassed(t *testing.T) {
	var chat strings.Builder
	for range 100 {
		chat.WriteString(`data: {"id":"c","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{"content":" w1"},"finish_reason":null}]}` + "\n\n")
	}
	s := NewUsageScanner(OpenAIChat, true)
	_, _ = s.Write([]byte(chat.String() + "data: [DONE]\n\n"))
	if _, ok := s.Usage(); ok {
		t.Fatal("a stream without usage reported one")
	}
	if got := s.Streamed(); got != 100 {
		t.Errorf("Streamed of 100 one-token chunks = %d, want 100", got)
	}

	a := NewUsageScanner(Anthropic, true)
	_, _ = a.Write([]byte("event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":10,\"output_tokens\":1},\"content\":[]}}\n\n"))
	for range 50 {
		_, _ = a.Write([]byte("event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"hello world\"}}\n\n"))
	}
	u, ok := a.Usage()
	if !ok || u.Cost() != 11 {
		t.Fatalf("cut Anthropic stream usage = %+v, %v; want message_start's 11", u, ok)
	}
	if got := a.Streamed(); got != 50*3 {
		t.Errorf("Streamed of 50 events of 11 bytes = %d, want 150", got)
	}

	p := NewUsageScanner(OpenAIChat, false)
	_, _ = p.Write([]byte(`{"choices":[{"message":{"role":"assistant","content":"` + strings.Repeat("x", 400) + `"}}]}`))
	_, _ = p.Usage()
	if got := p.Streamed(); got != 100 {
		t.Errorf("Streamed of a plain body of 400 bytes of text = %d, want 100", got)
	}
}
