package tokens

import (
	"bytes"
	"testing"
)

var fuzzKinds = []Kind{OpenAIChat, OpenAIResponses, Anthropic, Gemini}

func addRequestSeeds(f *testing.F) {
	for i, name := range []string{"openai-chat-request.json", "openai-responses-request.json", "anthropic-request.json", "gemini-request.json"} {
		f.Add(readTestdata(f, name), uint8(i))
	}
	f.Add([]byte(`{"messages":[],"max_tokens":1e3,"stream":true}`), uint8(0))
	f.Add([]byte("{\"messages\":[{\"content\":\"<a&b> \xff \xe2\x80\xa8\"}],\"stream\":true,\"x\":\"\\u003c\"}"), uint8(4))
	f.Add([]byte(`{"contents":[],"generation_config":{"max_output_tokens":7},"generationConfig":null}`), uint8(3))
	f.Add([]byte(`{"messages":[{"role":"user","content":[{"type":"image\u005furl","image_url":{"url":"u","detail":"low"}},{"type":"image","source":{}}]}]}`), uint8(0))
	f.Add([]byte(`{"contents":[{"parts":[{"inlineData":{"mimeType":"image/png","data":""}}]}],"cachedContent":null}`), uint8(3))
}

// FuzzScanRequest: any body is sized or refused, never a panic, and a sized
// body's numbers are in bounds.
func FuzzScanRequest(f *testing.F) {
	addRequestSeeds(f)
	f.Fuzz(func(t *testing.T, body []byte, k uint8) {
		kind := fuzzKinds[int(k)%len(fuzzKinds)]
		r, err := ScanRequest(body, kind, k >= 128)
		if err != nil {
			return
		}
		// text at most 2 a byte, and an image (an object) at most the dearest image price
		images := int64(bytes.Count(body, []byte("{"))) * max(OpenAIImageHigh, AnthropicImage, GeminiImage)
		if r.Kind != kind || r.PromptTokens < 3 || r.PromptTokens > 2*int64(len(body))+3+images || r.OutputCap < 0 || r.OutputCap > MaxTokens || r.Choices < 1 || r.Choices > MaxTokens || r.MaxOutput() > MaxTokens {
			t.Fatalf("ScanRequest(%q) = %+v", body, r)
		}
	})
}

// FuzzSetOutputCap: a body ScanRequest accepts takes any cap; the result
// re-scans to that cap, with the same stream, the same prompt estimate, and
// every other top-level field of the same value.
func FuzzSetOutputCap(f *testing.F) {
	addRequestSeeds(f)
	f.Fuzz(func(t *testing.T, body []byte, k uint8) {
		kind := fuzzKinds[int(k)%len(fuzzKinds)]
		before, err := ScanRequest(body, kind, false)
		if err != nil {
			return
		}
		limit := int64(k) * 7
		askUsage := k&4 != 0
		out, err := SetOutputCap(body, kind, limit, askUsage)
		if err != nil {
			t.Fatalf("SetOutputCap of a body ScanRequest accepts: %v", err)
		}
		after, err := ScanRequest(out, kind, false)
		if err != nil {
			t.Fatalf("re-scanning %q: %v", out, err)
		}
		want := before
		want.OutputCap = limit
		if kind == OpenAIChat && before.Stream && askUsage {
			want.IncludeUsage = true
		}
		if after != want {
			t.Fatalf("re-scan = %+v, want %+v\nin  %q\nout %q", after, want, body, out)
		}
		fieldsEqualBut(t, body, out, "max_tokens", "max_completion_tokens", "max_output_tokens", "stream_options", "generationConfig", "generation_config")
	})
}

// FuzzUsageScanner: any byte stream, split anywhere, gives the same usage as
// fed whole, never a panic, and the scanner's buffers stay within bounds.
func FuzzUsageScanner(f *testing.F) {
	for i, name := range []string{"openai-chat-stream.sse", "openai-responses-stream.sse", "anthropic-stream.sse", "gemini-stream.sse"} {
		f.Add(readTestdata(f, name), uint8(i), uint8(3), uint8(17))
	}
	for i, name := range []string{"openai-chat.json", "openai-responses.json", "anthropic.json", "gemini-stream-array.json"} {
		f.Add(readTestdata(f, name), uint8(i+4), uint8(1), uint8(2))
	}
	f.Add(readTestdata(f, "anthropic-error-stream.sse"), uint8(2), uint8(5), uint8(0))
	f.Fuzz(func(t *testing.T, body []byte, k, a, b uint8) {
		kind := fuzzKinds[int(k)%len(fuzzKinds)]
		sse := k%8 < 4
		_, want, wantOK := scanAll(kind, sse, body, 0)

		// split at a, then in pieces of b (b 0: one piece)
		s := NewUsageScanner(kind, sse)
		cut := min(int(a), len(body))
		_, _ = s.Write(body[:cut])
		rest := body[cut:]
		step := int(b)
		if step == 0 {
			step = len(rest) + 1
		}
		for len(rest) > 0 {
			n := min(step, len(rest))
			_, _ = s.Write(rest[:n])
			rest = rest[n:]
			if c := cap(s.sse.line) + cap(s.sse.data) + cap(s.sse.event); c > 4*MaxEventBytes {
				t.Fatalf("scanner holds %d bytes", c)
			}
		}
		got, ok := s.Usage()
		if got != want || ok != wantOK {
			t.Fatalf("split at %d then by %d: %+v, %v; whole: %+v, %v", a, b, got, ok, want, wantOK)
		}
		if ok && (got.Input < 0 || got.Input > MaxTokens || got.Output < 0 || got.Output > MaxTokens || got.Total < 0 || got.Total > MaxTokens || got.Cost() > MaxTokens) {
			t.Fatalf("usage out of bounds: %+v", got)
		}

		// the filter: the same output whatever the split; what it keeps
		// when it removes nothing is the input
		var whole, split bytes.Buffer
		fw, fs := NewUsageChunkFilter(&whole), NewUsageChunkFilter(&split)
		_, _ = fw.Write(body)
		_ = fw.Close()
		_, _ = fs.Write(body[:cut])
		for r := body[cut:]; len(r) > 0; {
			n := min(step, len(r))
			_, _ = fs.Write(r[:n])
			r = r[n:]
		}
		_ = fs.Close()
		if !bytes.Equal(whole.Bytes(), split.Bytes()) || fw.Removed() != fs.Removed() {
			t.Fatalf("filter output depends on the split:\nwhole %q\nsplit %q", whole.Bytes(), split.Bytes())
		}
		if fw.Removed() == 0 && !bytes.Equal(whole.Bytes(), body) {
			t.Fatalf("filter removed nothing but changed the stream:\nin  %q\nout %q", body, whole.Bytes())
		}
	})
}
