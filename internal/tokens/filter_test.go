package tokens

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

func filterAll(t *testing.T, in []byte, n int) ([]byte, int) {
	t.Helper()
	var out bytes.Buffer
	f := NewUsageChunkFilter(&out)
	if n <= 0 {
		n = len(in) + 1
	}
	for b := in; len(b) > 0; {
		k := min(n, len(b))
		if w, err := f.Write(b[:k]); w != k || err != nil {
			t.Fatalf("Write = %d, %v", w, err)
		}
		b = b[k:]
	}
	if err := f.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	return out.Bytes(), f.Removed()
}

func TestUsageChunkFilter(t *testing.T) {
	stream := readTestdata(t, "openai-chat-stream.sse")
	usageEvent := "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1694268190,\"model\":\"gpt-4o-mini\",\"system_fingerprint\":\"fp_44709d6fcb\",\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":12,\"total_tokens\":21,\"completion_tokens_details\":{\"reasoning_tokens\":0}}}\n\n"
	if !bytes.Contains(stream, []byte(usageEvent)) {
		t.Fatal("testdata stream lacks its usage event")
	}
	want := bytes.Replace(stream, []byte(usageEvent), nil, 1)
	for _, crlf := range []string{"\n", "\r\n", "\r"} {
		in := []byte(strings.ReplaceAll(string(stream), "\n", crlf))
		wantHere := []byte(strings.ReplaceAll(string(want), "\n", crlf))
		for _, n := range []int{0, 1, 2, 5, 100} {
			got, removed := filterAll(t, in, n)
			if !bytes.Equal(got, wantHere) || removed != 1 {
				t.Errorf("terminator %q, chunks of %d: removed %d, got\n%q\nwant\n%q", crlf, n, removed, got, wantHere)
			}
			if !bytes.HasSuffix(got, []byte("data: [DONE]"+crlf+crlf)) {
				t.Errorf("terminator %q, chunks of %d: [DONE] not passed through", crlf, n)
			}
		}
	}
}

func TestUsageChunkFilterPassesEverythingElse(t *testing.T) {
	for _, in := range []string{
		// a chunk with choices and usage is the client's own
		"data: {\"choices\":[{\"delta\":{}}],\"usage\":{\"prompt_tokens\":1}}\n\n",
		// usage null
		"data: {\"choices\":[],\"usage\":null}\n\n",
		// comments and other fields, a blank line run
		": keep-alive\n\n\n\nid: 1\nevent: x\ndata: {\"choices\":[]}\n\n",
		// text that merely mentions usage
		"data: {\"choices\":[{\"delta\":{\"content\":\"\\\"usage\\\":{}\"}}]}\n\n",
		// not JSON, invalid UTF-8
		"data: \xff\xfe \"usage\n\n",
		// an unterminated last event
		"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":1}}\n",
		// an event over the bound, though usage-only in shape
		"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":1},\"pad\":\"" + strings.Repeat("x", MaxEventBytes) + "\"}\n\ndata: [DONE]\n\n",
		"",
	} {
		for _, n := range []int{0, 1, 3, 4096} {
			got, removed := filterAll(t, []byte(in), n)
			if string(got) != in || removed != 0 {
				t.Errorf("chunks of %d: %.80q came out as %.80q, %d removed", n, in, got, removed)
			}
		}
	}
}

type failWriter struct{}

func (failWriter) Write([]byte) (int, error) { return 0, errors.New("client gone") }

func TestUsageChunkFilterReportsWriteErrors(t *testing.T) {
	f := NewUsageChunkFilter(failWriter{})
	if _, err := f.Write([]byte("data: {\"choices\":[{}]}\n\n")); err == nil {
		t.Error("Write over a failing writer returned no error")
	}
}

func TestUsageChunkFilterHoldsAtMostOneEvent(t *testing.T) {
	var out bytes.Buffer
	f := NewUsageChunkFilter(&out)
	line := "data: " + strings.Repeat("x", 4*MaxEventBytes)
	if _, err := f.Write([]byte(line)); err != nil {
		t.Fatal(err)
	}
	if cap(f.held) > MaxEventBytes {
		t.Errorf("filter holds %d bytes of an event written in one piece, want at most %d", cap(f.held), MaxEventBytes)
	}
	if out.Len() != len(line) {
		t.Errorf("filter passed %d of an oversized event's %d bytes on at once", out.Len(), len(line))
	}
}
