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
		// (28+22+3)/4 + 4*2 + 3, and a low-detail image
		"openai-chat-request.json": (28+22+3)/4 + 4*2 + 3 + OpenAIImageLow,
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
		{"negative cap", Anthropic, `{"messages":[],"max_tokens":-2}`, Request{}, ErrNumber, false},
		{"fractional cap", OpenAIChat, `{"messages":[],"max_tokens":1.5}`, Request{}, ErrNumber, false},
		{"stream not a bool", OpenAIChat, `{"messages":[],"stream":"maybe"}`, Request{}, ErrNumber, false},
		{"anthropic messages string", Anthropic, `{"messages":"hi"}`, Request{}, ErrShape, false},
		{"no messages", OpenAIChat, `{"model":"x"}`, Request{}, ErrShape, false},
		{"gemini shape under chat", OpenAIChat, `{"contents":[]}`, Request{}, ErrShape, false},
		{"top-level array", OpenAIChat, `[{"messages":[]}]`, Request{}, ErrShape, false},
		{"not JSON", OpenAIChat, `messages=hi`, Request{}, ErrNotJSON, false},
		{"truncated JSON", OpenAIChat, `{"messages":[`, Request{}, ErrNotJSON, false},
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
		{"/v1/embeddings", OpenAIEmbeddings, false},
		{"/v1/completions", OpenAICompletions, false},
		{"/v1/Chat/Completions", OpenAIChat, false},
		{"/V1/MESSAGES?beta=true", Anthropic, false},
		{"/v1/models", Unknown, false},
	}
	for _, tt := range tests {
		kind, stream := KindFromPath(tt.path)
		if kind != tt.kind || stream != tt.stream {
			t.Errorf("KindFromPath(%q) = %v, %v, want %v, %v", tt.path, kind, stream, tt.kind, tt.stream)
		}
	}
}

// TestScanRequestReadsNumbersAsUpstreamsDo: every form of an output cap that pydantic-based
// servers (vLLM, SGLang, LiteLLM) or llama.cpp read is read as they read it; -1 and 0 are no
// cap (the caller writes one); a form none of them reads as a count is ErrNumber, so the
// request is unsized rather than sized as something the upstream does not read.
func TestScanRequestReadsNumbersAsUpstreamsDo(t *testing.T) {
	for _, tt := range []struct {
		raw    string
		cap    int64
		errNum bool
	}{
		{`100000`, 100000, false},
		{`1e5`, 100000, false},
		{`1E5`, 100000, false},
		{`"100000"`, 100000, false},
		{`" 100000 "`, 100000, false},
		{`100000.0`, 100000, false},
		{`"1e5"`, 100000, false},
		{`-1`, 0, false},
		{`"-1"`, 0, false},
		{`-1.0`, 0, false},
		{`0`, 0, false},
		{`null`, 0, false},
		{`99999999999999999999`, MaxTokens, false},
		{`1e300`, MaxTokens, false},
		{`"1e400"`, MaxTokens, false},
		{`true`, 0, true},
		{`false`, 0, true},
		{`-2`, 0, true},
		{`-1e400`, 0, true},
		{`100000.5`, 0, true},
		{`"100k"`, 0, true},
		{`"0x10"`, 0, true},
		{`"1_000"`, 0, true},
		{`""`, 0, true},
		{`{}`, 0, true},
		{`[1]`, 0, true},
	} {
		for _, kind := range []Kind{OpenAIChat, OpenAICompletions, Anthropic} {
			body := `{"messages":[],"prompt":"","max_tokens":` + tt.raw + `}`
			got, err := ScanRequest([]byte(body), kind, false)
			if tt.errNum {
				if !errors.Is(err, ErrNumber) {
					t.Errorf("%v max_tokens %s: %+v, %v; want ErrNumber", kind, tt.raw, got, err)
				}
				continue
			}
			if err != nil || got.OutputCap != tt.cap {
				t.Errorf("%v max_tokens %s: cap %d, %v; want %d", kind, tt.raw, got.OutputCap, err, tt.cap)
			}
		}
	}
}

func TestScanRequestFlagsAndCounts(t *testing.T) {
	for _, tt := range []struct {
		body string
		want Request
	}{
		{`{"messages":[],"stream":"true"}`, Request{Kind: OpenAIChat, Choices: 1, PromptTokens: 3, Stream: true}},
		{`{"messages":[],"stream":1,"stream_options":{"include_usage":"yes"}}`, Request{Kind: OpenAIChat, Choices: 1, PromptTokens: 3, Stream: true, IncludeUsage: true}},
		{`{"messages":[],"stream":"False"}`, Request{Kind: OpenAIChat, Choices: 1, PromptTokens: 3}},
		{`{"messages":[],"n":"3","max_tokens":10}`, Request{Kind: OpenAIChat, Choices: 3, PromptTokens: 3, OutputCap: 10}},
		{`{"messages":[],"n":2.0,"best_of":4,"max_tokens":10}`, Request{Kind: OpenAIChat, Choices: 4, PromptTokens: 3, OutputCap: 10}},
		// one field says no cap: the request has none, whatever the others say
		{`{"messages":[],"max_completion_tokens":50,"max_tokens":-1}`, Request{Kind: OpenAIChat, Choices: 1, PromptTokens: 3}},
		{`{"messages":[],"max_tokens":50,"n_predict":100000}`, Request{Kind: OpenAIChat, Choices: 1, PromptTokens: 3, OutputCap: 100000}},
	} {
		got, err := ScanRequest([]byte(tt.body), OpenAIChat, false)
		if err != nil || got != tt.want {
			t.Errorf("ScanRequest(%s) = %+v, %v; want %+v", tt.body, got, err, tt.want)
		}
	}
}

func TestScanRequestCompletionsAndEmbeddings(t *testing.T) {
	for _, tt := range []struct {
		kind Kind
		body string
		want Request
	}{
		// one prompt: (8 bytes + 3)/4 + 4 + 3; completions' cap times n, times the prompts
		{OpenAICompletions, `{"prompt":"12345678","max_tokens":"20","n":2}`, Request{Kind: OpenAICompletions, Choices: 2, PromptTokens: 2 + 4 + 3, OutputCap: 20}},
		{OpenAICompletions, `{"prompt":["1234","5678","abcd"],"max_tokens":20,"stream":"true"}`, Request{Kind: OpenAICompletions, Choices: 3, PromptTokens: 3 + 12 + 3, OutputCap: 20, Stream: true}},
		// token ids: each number is one token, one prompt
		{OpenAICompletions, `{"prompt":[1,2,3,4,5,6,7,8],"max_tokens":1}`, Request{Kind: OpenAICompletions, Choices: 1, PromptTokens: 8 + 4 + 3, OutputCap: 1}},
		{OpenAICompletions, `{"prompt":[[1,2],[3,4]],"max_tokens":1}`, Request{Kind: OpenAICompletions, Choices: 2, PromptTokens: 4 + 8 + 3, OutputCap: 1}},
		{OpenAIEmbeddings, `{"input":"12345678","model":"e"}`, Request{Kind: OpenAIEmbeddings, Choices: 1, PromptTokens: 2 + 4 + 3}},
		{OpenAIEmbeddings, `{"input":[[1,2,3,4],[5,6,7,8]]}`, Request{Kind: OpenAIEmbeddings, Choices: 1, PromptTokens: 8 + 8 + 3}},
	} {
		got, err := ScanRequest([]byte(tt.body), tt.kind, false)
		if err != nil || got != tt.want {
			t.Errorf("ScanRequest(%v, %s) = %+v, %v; want %+v", tt.kind, tt.body, got, err, tt.want)
		}
	}
	if _, err := ScanRequest([]byte(`{"model":"x"}`), OpenAIEmbeddings, false); !errors.Is(err, ErrShape) {
		t.Errorf("embeddings without input: %v, want ErrShape", err)
	}
	if r := (Request{Kind: OpenAIEmbeddings}); r.HasOutput() {
		t.Error("embeddings have an output")
	}
}
