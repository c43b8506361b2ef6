package tokens

import (
	"errors"
	"os"
	"strings"
	"testing"
)

func readTestdata(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile("testdata/" + name)
	if err != nil {
		t.Fatalf("reading testdata: %v", err)
	}
	return b
}

func TestScanRequestDocumentedBodies(t *testing.T) {
	tests := []struct {
		file   string
		kind   Kind
		stream bool // the route's
		want   Request
	}{
		{"openai-chat-request.json", OpenAIChat, false, Request{Kind: OpenAIChat, Choices: 1, OutputCap: 300, Stream: true, IncludeUsage: true}},
		{"openai-responses-request.json", OpenAIResponses, false, Request{Kind: OpenAIResponses, Choices: 1, OutputCap: 1024}},
		{"anthropic-request.json", Anthropic, false, Request{Kind: Anthropic, Choices: 1, OutputCap: 1024, Stream: true}},
		{"gemini-request.json", Gemini, true, Request{Kind: Gemini, Choices: 1, OutputCap: 800, Stream: true}},
	}
	prompts := map[string]int64{
		// (28+22+3)/4 + 4*2 + 3: the image URL and detail are not text
		"openai-chat-request.json": (28+22+3)/4 + 4*2 + 3,
		// instructions 19 + text 55
		"openai-responses-request.json": (19+55+3)/4 + 4*1 + 3,
		// system 26 + 13 + 6 + 28
		"anthropic-request.json": (26+13+6+28+3)/4 + 4*3 + 3,
		// system 33 + 35
		"gemini-request.json": (33+35+3)/4 + 4*1 + 3,
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			got, err := ScanRequest(readTestdata(t, tt.file), tt.kind, tt.stream)
			if err != nil {
				t.Fatalf("ScanRequest: %v", err)
			}
			tt.want.PromptTokens = prompts[tt.file]
			if got != tt.want {
				t.Errorf("ScanRequest = %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestScanRequestShapes(t *testing.T) {
	deep := strings.Repeat("[", MaxDepth+1) + strings.Repeat("]", MaxDepth+1)
	tests := []struct {
		name    string
		kind    Kind
		body    string
		want    Request
		wantErr error // nil: any error when wantOK is false
		wantOK  bool
	}{
		{"chat both caps take the larger", OpenAIChat, `{"messages":[],"max_tokens":10,"max_completion_tokens":20}`, Request{Kind: OpenAIChat, Choices: 1, PromptTokens: 3, OutputCap: 20}, nil, true},
		{"chat no cap", OpenAIChat, `{"messages":[{"role":"user","content":"abcd"}]}`, Request{Kind: OpenAIChat, Choices: 1, PromptTokens: 1 + 4 + 3}, nil, true},
		{"chat stream without usage", OpenAIChat, `{"messages":[],"stream":true,"stream_options":{"include_usage":false}}`, Request{Kind: OpenAIChat, Choices: 1, PromptTokens: 3, Stream: true}, nil, true},
		{"keys match exactly", OpenAIChat, `{"messages":[],"Max_Tokens":10,"STREAM":true}`, Request{Kind: OpenAIChat, Choices: 1, PromptTokens: 3}, nil, true},
		{"duplicate key: the last wins", Anthropic, `{"messages":[],"max_tokens":10,"max_tokens":99}`, Request{Kind: Anthropic, Choices: 1, PromptTokens: 3, OutputCap: 99}, nil, true},
		{"responses input string", OpenAIResponses, `{"input":"12345678","max_output_tokens":5}`, Request{Kind: OpenAIResponses, Choices: 1, PromptTokens: 2 + 4 + 3, OutputCap: 5}, nil, true},
		{"gemini snake case config", Gemini, `{"contents":[],"generation_config":{"max_output_tokens":7}}`, Request{Kind: Gemini, Choices: 1, PromptTokens: 3, OutputCap: 7}, nil, true},
		{"gemini stream is the route's", Gemini, `{"contents":[],"stream":false}`, Request{Kind: Gemini, Choices: 1, PromptTokens: 3, Stream: false}, nil, true},
		{"huge cap clamped", Anthropic, `{"messages":[],"max_tokens":99999999999999999999}`, Request{Kind: Anthropic, Choices: 1, PromptTokens: 3, OutputCap: MaxTokens}, nil, true},
		{"negative cap", Anthropic, `{"messages":[],"max_tokens":-1}`, Request{}, nil, false},
		{"float cap", OpenAIChat, `{"messages":[],"max_tokens":1.5}`, Request{}, nil, false},
		{"string cap", OpenAIChat, `{"messages":[],"max_tokens":"100"}`, Request{}, nil, false},
		{"stream not a bool", OpenAIChat, `{"messages":[],"stream":"yes"}`, Request{}, nil, false},
		{"anthropic messages string", Anthropic, `{"messages":"hi"}`, Request{}, ErrShape, false},
		{"no messages", OpenAIChat, `{"model":"x"}`, Request{}, ErrShape, false},
		{"gemini shape under chat", OpenAIChat, `{"contents":[]}`, Request{}, ErrShape, false},
		{"top-level array", OpenAIChat, `[{"messages":[]}]`, Request{}, ErrShape, false},
		{"not JSON", OpenAIChat, `messages=hi`, Request{}, ErrShape, false},
		{"truncated JSON", OpenAIChat, `{"messages":[`, Request{}, nil, false},
		{"invalid UTF-8 in a string", OpenAIChat, "{\"messages\":[{\"content\":\"\xff\xfe\"}]}", Request{Kind: OpenAIChat, Choices: 1, PromptTokens: 1 + 4 + 3}, nil, true},
		{"deep nesting", OpenAIChat, `{"messages":[{"content":` + deep + `}]}`, Request{}, ErrTooDeep, false},
		{"brackets in strings are not nesting", OpenAIChat, `{"messages":[{"content":"` + deep + `"}]}`, Request{Kind: OpenAIChat, Choices: 1, PromptTokens: (2*(MaxDepth+1)+3)/4 + 4 + 3}, nil, true},
		{"chat n multiplies the output", OpenAIChat, `{"messages":[],"max_tokens":100,"n":3}`, Request{Kind: OpenAIChat, PromptTokens: 3, OutputCap: 100, Choices: 3}, nil, true},
		{"gemini candidateCount", Gemini, `{"contents":[],"generationConfig":{"maxOutputTokens":10,"candidateCount":2}}`, Request{Kind: Gemini, PromptTokens: 3, OutputCap: 10, Choices: 2}, nil, true},
		{"negative n", OpenAIChat, `{"messages":[],"n":-2}`, Request{}, nil, false},
		{"unknown kind", Unknown, `{"messages":[]}`, Request{}, ErrShape, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ScanRequest([]byte(tt.body), tt.kind, false)
			if tt.wantOK {
				if err != nil {
					t.Fatalf("ScanRequest: %v", err)
				}
				if got != tt.want {
					t.Errorf("ScanRequest = %+v, want %+v", got, tt.want)
				}
				return
			}
			if err == nil {
				t.Fatalf("ScanRequest = %+v, want an error", got)
			}
			if tt.wantErr != nil && !errors.Is(err, tt.wantErr) {
				t.Errorf("ScanRequest error %v, want %v", err, tt.wantErr)
			}
		})
	}
}

func TestRequestMaxOutput(t *testing.T) {
	for _, tt := range []struct {
		r    Request
		want int64
	}{
		{Request{OutputCap: 100, Choices: 3}, 300},
		{Request{OutputCap: 0, Choices: 3}, 0},
		{Request{OutputCap: MaxTokens, Choices: MaxTokens}, MaxTokens},
	} {
		if got := tt.r.MaxOutput(); got != tt.want {
			t.Errorf("%+v.MaxOutput() = %d, want %d", tt.r, got, tt.want)
		}
	}
}

func TestScanRequestRefusesTooLarge(t *testing.T) {
	body := []byte(`{"messages":[{"content":"` + strings.Repeat("a", MaxRequestBytes) + `"}]}`)
	if _, err := ScanRequest(body, OpenAIChat, false); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("ScanRequest of %d bytes: %v, want ErrTooLarge", len(body), err)
	}
}

func TestKindFromPath(t *testing.T) {
	tests := []struct {
		path   string
		kind   Kind
		stream bool
	}{
		{"/v1/chat/completions", OpenAIChat, false},
		{"/v1/responses", OpenAIResponses, false},
		{"/v1/messages", Anthropic, false},
		{"/v1beta/models/gemini-2.5-flash:generateContent", Gemini, false},
		{"/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse", Gemini, true},
		{"/v1/embeddings", Unknown, false},
	}
	for _, tt := range tests {
		kind, stream := KindFromPath(tt.path)
		if kind != tt.kind || stream != tt.stream {
			t.Errorf("KindFromPath(%q) = %v, %v, want %v, %v", tt.path, kind, stream, tt.kind, tt.stream)
		}
	}
}
