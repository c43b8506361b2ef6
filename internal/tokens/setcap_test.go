package tokens

import (
	"bytes"
	"encoding/json"
	"testing"
)

// fieldsEqualBut checks that every top-level field of before but those in
// changed has the same compacted value in after, and after has no field
// before lacks but those in changed.
func fieldsEqualBut(t testing.TB, before, after []byte, changed ...string) {
	t.Helper()
	var b, a map[string]json.RawMessage
	if err := json.Unmarshal(before, &b); err != nil {
		t.Fatalf("reading the body: %v", err)
	}
	if err := json.Unmarshal(after, &a); err != nil {
		t.Fatalf("reading the rewritten body: %v\n%s", err, after)
	}
	skip := map[string]bool{}
	for _, c := range changed {
		skip[c] = true
	}
	for k, v := range b {
		if skip[k] {
			continue
		}
		var want, got bytes.Buffer
		if err := json.Compact(&want, v); err != nil {
			t.Fatalf("compacting %s: %v", k, err)
		}
		if err := json.Compact(&got, a[k]); err != nil {
			t.Fatalf("field %s lost or broken: %v", k, err)
		}
		if !bytes.Equal(want.Bytes(), got.Bytes()) {
			t.Errorf("field %s = %s, want %s", k, got.Bytes(), want.Bytes())
		}
	}
	for k := range a {
		if _, ok := b[k]; !ok && !skip[k] {
			t.Errorf("field %s added", k)
		}
	}
}

func TestSetOutputCap(t *testing.T) {
	tests := []struct {
		name     string
		kind     Kind
		body     string
		limit    int64
		askUsage bool
		changed  []string
		want     Request // after, PromptTokens not compared
		check    func(t *testing.T, top map[string]json.RawMessage)
	}{
		{"chat documented stream", OpenAIChat, string(readTestdata(t, "openai-chat-request.json")), 100, true,
			[]string{"max_tokens", "max_completion_tokens", "stream_options"},
			Request{Kind: OpenAIChat, Choices: 1, OutputCap: 100, Stream: true, IncludeUsage: true}, nil},
		{"chat: max_tokens lowered, include_usage added, other options kept", OpenAIChat,
			`{"messages":[{"role":"user","content":"hi <b>"}],"max_tokens":500,"stream":true,"stream_options":{"x":[1, 2]},"logit_bias":{"50256":-100}}`, 64, true,
			[]string{"max_tokens", "max_completion_tokens", "stream_options"},
			Request{Kind: OpenAIChat, Choices: 1, OutputCap: 64, Stream: true, IncludeUsage: true},
			func(t *testing.T, top map[string]json.RawMessage) {
				if string(top["max_tokens"]) != "64" || string(top["max_completion_tokens"]) != "64" {
					t.Errorf("caps = %s, %s, want 64, 64", top["max_tokens"], top["max_completion_tokens"])
				}
				var so map[string]json.RawMessage
				if err := json.Unmarshal(top["stream_options"], &so); err != nil || string(so["x"]) != "[1,2]" {
					t.Errorf("stream_options = %s, want x kept", top["stream_options"])
				}
			}},
		{"chat: a smaller max_tokens stays", OpenAIChat, `{"messages":[],"max_tokens":10}`, 64, false,
			[]string{"max_completion_tokens"}, Request{Kind: OpenAIChat, Choices: 1, OutputCap: 64},
			func(t *testing.T, top map[string]json.RawMessage) {
				if string(top["max_tokens"]) != "10" {
					t.Errorf("max_tokens = %s, want 10 kept", top["max_tokens"])
				}
			}},
		{"chat: not a stream, no usage asked", OpenAIChat, `{"messages":[]}`, 5, true,
			[]string{"max_completion_tokens"}, Request{Kind: OpenAIChat, Choices: 1, OutputCap: 5}, nil},
		{"responses", OpenAIResponses, string(readTestdata(t, "openai-responses-request.json")), 7, false,
			[]string{"max_output_tokens"}, Request{Kind: OpenAIResponses, Choices: 1, OutputCap: 7}, nil},
		{"anthropic", Anthropic, string(readTestdata(t, "anthropic-request.json")), 0, false,
			[]string{"max_tokens"}, Request{Kind: Anthropic, Choices: 1, OutputCap: 0, Stream: true}, nil},
		{"gemini", Gemini, string(readTestdata(t, "gemini-request.json")), 50, false,
			[]string{"generationConfig"}, Request{Kind: Gemini, Choices: 1, OutputCap: 50},
			func(t *testing.T, top map[string]json.RawMessage) {
				var gc map[string]json.RawMessage
				if err := json.Unmarshal(top["generationConfig"], &gc); err != nil || string(gc["stopSequences"]) != `["Title"]` || string(gc["temperature"]) != "1.0" {
					t.Errorf("generationConfig = %s, want its other fields kept", top["generationConfig"])
				}
			}},
		{"gemini without a config", Gemini, `{"contents":[]}`, 50, false,
			[]string{"generationConfig"}, Request{Kind: Gemini, Choices: 1, OutputCap: 50}, nil},
		{"gemini snake case config keeps its spelling", Gemini, `{"contents":[],"generation_config":{"max_output_tokens":900,"candidate_count":1}}`, 50, false,
			[]string{"generation_config"}, Request{Kind: Gemini, Choices: 1, OutputCap: 50},
			func(t *testing.T, top map[string]json.RawMessage) {
				if _, ok := top["generationConfig"]; ok || string(top["generation_config"]) != `{"candidate_count":1,"max_output_tokens":50}` {
					t.Errorf("generation_config = %s, generationConfig %s; want the snake case one alone, its cap 50", top["generation_config"], top["generationConfig"])
				}
			}},
		{"gemini null config", Gemini, `{"contents":[],"generationConfig":null}`, 50, false,
			[]string{"generationConfig"}, Request{Kind: Gemini, Choices: 1, OutputCap: 50}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, err := SetOutputCap([]byte(tt.body), tt.kind, tt.limit, tt.askUsage)
			if err != nil {
				t.Fatalf("SetOutputCap: %v", err)
			}
			got, err := ScanRequest(out, tt.kind, tt.want.Stream && tt.kind == Gemini)
			if err != nil {
				t.Fatalf("re-scanning %s: %v", out, err)
			}
			got.PromptTokens = 0
			if got != tt.want {
				t.Errorf("re-scan = %+v, want %+v\n%s", got, tt.want, out)
			}
			before, _ := ScanRequest([]byte(tt.body), tt.kind, false)
			after, _ := ScanRequest(out, tt.kind, false)
			if before.PromptTokens != after.PromptTokens {
				t.Errorf("prompt estimate %d after, %d before", after.PromptTokens, before.PromptTokens)
			}
			fieldsEqualBut(t, []byte(tt.body), out, tt.changed...)
			if tt.check != nil {
				var top map[string]json.RawMessage
				if err := json.Unmarshal(out, &top); err != nil {
					t.Fatal(err)
				}
				tt.check(t, top)
			}
		})
	}
}

func TestSetOutputCapRefuses(t *testing.T) {
	for _, tt := range []struct {
		name  string
		body  string
		limit int64
	}{
		{"negative cap", `{"messages":[]}`, -1},
		{"cap over MaxTokens", `{"messages":[]}`, MaxTokens + 1},
		{"not of the shape", `{"contents":[]}`, 1},
		{"not JSON", `{`, 1},
	} {
		if out, err := SetOutputCap([]byte(tt.body), OpenAIChat, tt.limit, false); err == nil {
			t.Errorf("%s: SetOutputCap = %s, want an error", tt.name, out)
		}
	}
}

// TestSetOutputCapWritesACapWhereNoneWasUnderstood: a cap the upstream reads as none (-1, 0),
// or in a form it reads as a number (a string, a float), is replaced by an integer within the
// limit, in every field the upstream may read.
func TestSetOutputCapWritesACapWhereNoneWasUnderstood(t *testing.T) {
	for _, tt := range []struct {
		kind   Kind
		body   string
		fields []string
	}{
		{OpenAIChat, `{"messages":[],"max_tokens":-1}`, []string{"max_tokens", "max_completion_tokens"}},
		{OpenAIChat, `{"messages":[],"max_tokens":0}`, []string{"max_tokens", "max_completion_tokens"}},
		{OpenAIChat, `{"messages":[],"max_tokens":"100000"}`, []string{"max_tokens", "max_completion_tokens"}},
		{OpenAIChat, `{"messages":[],"max_tokens":1e5,"n_predict":-1}`, []string{"max_tokens", "max_completion_tokens", "n_predict"}},
		{OpenAIChat, `{"messages":[]}`, []string{"max_completion_tokens"}},
		{OpenAICompletions, `{"prompt":"x","max_tokens":100000.0}`, []string{"max_tokens"}},
		{OpenAICompletions, `{"prompt":"x"}`, []string{"max_tokens"}},
		{Anthropic, `{"messages":[],"max_tokens":"-1"}`, []string{"max_tokens"}},
		{OpenAIResponses, `{"input":"x","max_output_tokens":"1e5"}`, []string{"max_output_tokens"}},
	} {
		out, err := SetOutputCap([]byte(tt.body), tt.kind, 500, false)
		if err != nil {
			t.Fatalf("SetOutputCap(%s): %v", tt.body, err)
		}
		var top map[string]json.RawMessage
		if err := json.Unmarshal(out, &top); err != nil {
			t.Fatal(err)
		}
		for _, f := range tt.fields {
			if string(top[f]) != "500" {
				t.Errorf("SetOutputCap(%s): %s = %s, want 500", tt.body, f, top[f])
			}
		}
		r, err := ScanRequest(out, tt.kind, false)
		if err != nil || r.OutputCap != 500 {
			t.Errorf("SetOutputCap(%s) reads back as cap %d, %v", tt.body, r.OutputCap, err)
		}
	}
	if _, err := SetOutputCap([]byte(`{"input":"x"}`), OpenAIEmbeddings, 5, false); err == nil {
		t.Error("an embeddings body got an output cap")
	}
}
