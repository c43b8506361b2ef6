package tokens

import (
	"bytes"
	"fmt"
	"io"
	"strings"
	"testing"
)

// openAIStream is an OpenAI chat stream of n content chunks of one token
// each, as the API sends them with include_usage, then the usage chunk and
// [DONE].
func openAIStream(n int) []byte {
	var b bytes.Buffer
	for i := range n {
		fmt.Fprintf(&b, "data: {\"id\":\"chatcmpl-AzS7x\",\"object\":\"chat.completion.chunk\",\"created\":1739283100,\"model\":\"gpt-4o-mini-2024-07-18\",\"service_tier\":\"default\",\"system_fingerprint\":\"fp_72ed7ab54c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" tok%d\"},\"logprobs\":null,\"finish_reason\":null}],\"usage\":null}\n\n", i)
	}
	fmt.Fprintf(&b, "data: {\"id\":\"chatcmpl-AzS7x\",\"object\":\"chat.completion.chunk\",\"created\":1739283100,\"model\":\"gpt-4o-mini-2024-07-18\",\"choices\":[],\"usage\":{\"prompt_tokens\":120,\"completion_tokens\":%d,\"total_tokens\":%d}}\n\ndata: [DONE]\n\n", n, n+120)
	return b.Bytes()
}

// BenchmarkUsageScannerOpenAIStream: the scanner's CPU per streamed
// response of 2,000 tokens, written as the chunks arrive.
func BenchmarkUsageScannerOpenAIStream(b *testing.B) {
	stream := openAIStream(2000)
	chunks := bytes.SplitAfter(stream, []byte("\n\n"))
	b.SetBytes(int64(len(stream)))
	b.ReportAllocs()
	for b.Loop() {
		s := NewUsageScanner(OpenAIChat, true)
		for _, c := range chunks {
			_, _ = s.Write(c)
		}
		if u, ok := s.Usage(); !ok || u.Output != 2000 {
			b.Fatalf("Usage = %+v, %v", u, ok)
		}
	}
}

// BenchmarkUsageChunkFilterOpenAIStream: the filter's CPU over the same
// response.
func BenchmarkUsageChunkFilterOpenAIStream(b *testing.B) {
	stream := openAIStream(2000)
	chunks := bytes.SplitAfter(stream, []byte("\n\n"))
	b.SetBytes(int64(len(stream)))
	b.ReportAllocs()
	for b.Loop() {
		f := NewUsageChunkFilter(io.Discard)
		for _, c := range chunks {
			_, _ = f.Write(c)
		}
		if f.Removed() != 1 {
			b.Fatalf("removed %d", f.Removed())
		}
	}
}

// BenchmarkScanRequest16KiB: ScanRequest on a 16 KiB chat body.
func BenchmarkScanRequest16KiB(b *testing.B) {
	var msgs []string
	for len(strings.Join(msgs, ",")) < 16<<10-200 {
		msgs = append(msgs, `{"role":"user","content":"The quick brown fox jumps over the lazy dog, again and again, as foxes do."}`,
			`{"role":"assistant","content":[{"type":"text","text":"Foxes are known to jump over lazy dogs."}]}`)
	}
	body := []byte(`{"model":"gpt-4o","messages":[` + strings.Join(msgs, ",") + `],"max_tokens":512,"stream":true,"stream_options":{"include_usage":true}}`)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ScanRequest(body, OpenAIChat, false); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSetOutputCap16KiB: rewriting the cap of the same body.
func BenchmarkSetOutputCap16KiB(b *testing.B) {
	body := []byte(`{"model":"gpt-4o","messages":[` + strings.Repeat(`{"role":"user","content":"The quick brown fox jumps over the lazy dog."},`, 16<<10/72) + `{"role":"user","content":"end"}],"stream":true}`)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := SetOutputCap(body, OpenAIChat, 256, true); err != nil {
			b.Fatal(err)
		}
	}
}
