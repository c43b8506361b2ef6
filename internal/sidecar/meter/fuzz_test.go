package meter

import (
	"bytes"
	"io"
	"net/http"
	"strconv"
	"testing"

	"github.com/redline-dev/redline/internal/tokens"
)

// FuzzParseCost: no value panics, none reads outside [0, MaxTokens], and a plain number that
// fits reads as itself.
func FuzzParseCost(f *testing.F) {
	for _, s := range []string{"0", "42", " 7\t", "-5", "1e30", "99999999999999999999", "0x1", "", "00012"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		c := parseCost([]string{s})
		if c.n < 0 || c.n > tokens.MaxTokens || (!c.ok && (c.n != 0 || c.clamped)) {
			t.Fatalf("parseCost(%q) = %+v", s, c)
		}
		if n, err := strconv.ParseUint(s, 10, 64); err == nil && s[0] != '+' && n <= uint64(tokens.MaxTokens) &&
			(!c.ok || c.n != int64(n) || c.clamped) {
			t.Fatalf("parseCost(%q) = %+v, want %d", s, c, n)
		}
	})
}

// splitReader returns its bytes in reads of the sizes given by a seed, cycling.
type splitReader struct {
	b     []byte
	sizes []byte
	i     int
}

func (r *splitReader) Read(p []byte) (int, error) {
	if len(r.b) == 0 {
		return 0, io.EOF
	}
	n := 1
	if len(r.sizes) > 0 {
		n = int(r.sizes[r.i%len(r.sizes)]) + 1
		r.i++
	}
	n = copy(p[:min(n, len(p))], r.b)
	r.b = r.b[n:]
	return n, nil
}

func (r *splitReader) Close() error { return nil }

// FuzzMeter: whatever an event stream holds and however it is split into reads, the meter
// passes it through unchanged (or, removing the chunk, exactly as the filter does on the whole
// stream at once), reports once, and reports the usage the scanner finds in the whole stream.
func FuzzMeter(f *testing.F) {
	f.Add([]byte("data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}],\"usage\":null}\n\n"+usageChunk+"data: [DONE]\n\n"), []byte{0, 3, 17})
	f.Add([]byte("data: {\"choices\":[],\"usage\":{\"prompt_tokens\":1}}\r\n\r\ndata: x\r"), []byte{1})
	f.Add([]byte(": comment\n\ndata: {\"choices\":[],\n\n"), []byte{})
	f.Fuzz(func(t *testing.T, stream, sizes []byte) {
		for _, strip := range []bool{false, true} {
			var outs []Outcome
			res := &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {"text/event-stream"}},
				Body: &splitReader{b: stream, sizes: sizes}}
			Wrap(res, Options{Kind: tokens.OpenAIChat, StripUsage: strip, OnEnd: func(o Outcome) { outs = append(outs, o) }})
			got, err := io.ReadAll(res.Body)
			_ = res.Body.Close()
			if err != nil {
				t.Fatal(err)
			}
			want := stream
			if strip {
				var buf bytes.Buffer
				fl := tokens.NewUsageChunkFilter(&buf)
				_, _ = fl.Write(stream)
				_ = fl.Close()
				want = buf.Bytes()
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("strip %v: got %q, want %q", strip, got, want)
			}
			s := tokens.NewUsageScanner(tokens.OpenAIChat, true)
			_, _ = s.Write(stream)
			u, ok := s.Usage()
			if len(outs) != 1 || !outs[0].Complete || outs[0].Found != ok || outs[0].Usage != u {
				t.Fatalf("outcomes %+v, want one with %+v, %v", outs, u, ok)
			}
		}
	})
}
