package meter

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/redline-dev/redline/internal/testutil/fakemodel"
	"github.com/redline-dev/redline/internal/tokens"
)

const usageChunk = "data: {\"id\":\"x\",\"choices\":[],\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":2,\"total_tokens\":3}}\n\n"

// hugeStream is an OpenAI chat stream whose first event is one data line of n bytes, then the
// usage chunk and [DONE]. It is produced as read, from one small buffer: the test's own
// allocations do not hide the meter's.
type hugeStream struct {
	n, off int
	tail   string
}

var xs = bytes.Repeat([]byte("x"), 32<<10)

func newHugeStream(n int) *hugeStream {
	return &hugeStream{n: n, tail: "\n\n" + usageChunk + "data: [DONE]\n\n"}
}

func (h *hugeStream) Read(p []byte) (int, error) {
	const head = "data: "
	switch {
	case h.off < len(head):
		n := copy(p, head[h.off:])
		h.off += n
		return n, nil
	case h.off < len(head)+h.n:
		n := copy(p[:min(len(p), len(head)+h.n-h.off)], xs)
		h.off += n
		return n, nil
	}
	i := h.off - len(head) - h.n
	if i >= len(h.tail) {
		return 0, io.EOF
	}
	n := copy(p, h.tail[i:])
	h.off += n
	return n, nil
}

func (h *hugeStream) Close() error { return nil }

// TestHostileHugeEventMemory: a 10 MB single-line event streams through the meter, with and
// without the chunk filter, allocating a bounded amount (the scanner and the filter hold at
// most one event of tokens.MaxEventBytes), and the usage after it is still found.
func TestHostileHugeEventMemory(t *testing.T) {
	const size = 10 << 20
	for _, strip := range []bool{false, true} {
		t.Run(fmt.Sprintf("strip=%v", strip), func(t *testing.T) {
			var got Outcome
			res := &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {"text/event-stream"}},
				Body: newHugeStream(size)}
			Wrap(res, Options{Kind: tokens.OpenAIChat, StripUsage: strip, OnEnd: func(o Outcome) { got = o }})
			buf := make([]byte, 32<<10)
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			n, err := io.CopyBuffer(struct{ io.Writer }{io.Discard}, res.Body, buf)
			runtime.ReadMemStats(&after)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("allocated %d", after.TotalAlloc-before.TotalAlloc)
			if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 1<<20 {
				t.Errorf("allocated %d bytes metering a %d-byte stream; want under 1 MiB", alloc, n)
			}
			want := int64(len("data: ")+size) + int64(len(newHugeStream(0).tail))
			if strip {
				want -= int64(len(usageChunk))
			}
			if n != want {
				t.Errorf("passed %d bytes, want %d", n, want)
			}
			if !got.Found || got.Usage.Cost() != 3 || !got.Complete {
				t.Errorf("outcome %+v, want the usage after the huge event", got)
			}
		})
	}
}

// TestHostileHugeEventThroughProxy: the same event through the real proxy reaches the client
// whole, and only the usage chunk is removed.
func TestHostileHugeEventThroughProxy(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.Copy(w, newHugeStream(10<<20))
	}))
	t.Cleanup(up.Close)
	h := newHarness(t, up.URL)
	c := fakemodel.Call{Kind: tokens.OpenAIChat, Stream: true}
	_, got, id, err := h.do(c, "")
	if err != nil {
		t.Fatal(err)
	}
	want, _ := io.ReadAll(newHugeStream(10 << 20))
	want = withoutUsageChunk(want)
	if !bytes.Equal(got, want) {
		t.Errorf("the client got %d bytes, want %d", len(got), len(want))
	}
	if o := h.outcome(id); !o.Found || o.Usage.Cost() != 3 {
		t.Errorf("outcome %+v", o)
	}
}

// TestHostileCounts: counts a response claims in its body, header or trailer cannot wrap or go
// negative: a non-integer or negative one is no count, a huge one is clamped to MaxTokens.
func TestHostileCounts(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		q := r.URL.Query()
		if v := q.Get("header"); v != "" {
			w.Header().Set("Redline-Cost", v)
		}
		if q.Get("trailer") != "" {
			w.Header().Set("Trailer", "Redline-Cost")
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		_, _ = io.WriteString(w, `{"choices":[],"usage":{"prompt_tokens":`+q.Get("body")+`,"completion_tokens":0}}`)
		if v := q.Get("trailer"); v != "" {
			w.Header().Set("Redline-Cost", v)
		}
	}))
	t.Cleanup(up.Close)
	huge := "1" + strings.Repeat("0", 30)
	for _, tc := range []struct {
		name                  string
		body, header, trailer string
		found, clamped        bool
		cost                  int64
	}{
		{"body 1e30", "1e30", "", "", false, false, 0},
		{"body -5", "-5", "", "", false, false, 0},
		{"body 10^30", huge, "", "", true, true, tokens.MaxTokens},
		{"header 1e30 is absent", "4", "1e30", "", true, false, 4},
		{"header -5 is absent", "4", "-5", "", true, false, 4},
		{"header 10^30 clamped", "4", huge, "", true, true, tokens.MaxTokens},
		{"header with spaces", "4", " 12\t", "", true, false, 12},
		{"trailer 10^30 clamped", "4", "7", huge, true, true, tokens.MaxTokens},
		{"trailer junk falls back to the header", "4", "7", "0x10", true, false, 7},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, up.URL)
			c := fakemodel.Call{Kind: tokens.OpenAIChat}
			req, id := h.request(t.Context(), c, "")
			q := req.URL.Query()
			q.Set("body", tc.body)
			q.Set("header", tc.header)
			q.Set("trailer", tc.trailer)
			req.URL.RawQuery = q.Encode()
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, res.Body)
			_ = res.Body.Close()
			o := h.outcome(id)
			if o.Found != tc.found || o.Usage.Clamped != tc.clamped || o.Usage.Cost() != tc.cost {
				t.Errorf("outcome %+v (cost %d), want found %v clamped %v cost %d", o, o.Usage.Cost(), tc.found, tc.clamped, tc.cost)
			}
			if res.Header.Get("Redline-Cost") != "" || res.Trailer.Get("Redline-Cost") != "" {
				t.Errorf("the client saw the cost: header %v trailer %v", res.Header, res.Trailer)
			}
		})
	}
}

// TestHostileTrailers: trailers past the transport's bound (its 4 KiB read buffer) fail the
// read, which the meter reports as an incomplete response; many cost values under it count
// as the largest valid one, and the client sees every other trailer but none of them.
func TestHostileTrailers(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		n, _ := strconv.Atoi(r.URL.Query().Get("spam"))
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		_ = http.NewResponseController(w).Flush()
		_, _ = io.WriteString(w, `{}`)
		for i := range n {
			w.Header().Add(http.TrailerPrefix+"Redline-Cost", []string{"5", "-9", "1e9", strconv.Itoa(100 + i)}[i%4])
			w.Header().Set(http.TrailerPrefix+"X-Spam-"+strconv.Itoa(i), strings.Repeat("s", 40))
		}
	}))
	t.Cleanup(up.Close)
	for _, tc := range []struct {
		spam     int
		complete bool
		cost     int64
	}{{40, true, 139}, {400, false, 0}} {
		t.Run(strconv.Itoa(tc.spam), func(t *testing.T) {
			h := newHarness(t, up.URL)
			req, id := h.request(t.Context(), fakemodel.Call{Kind: tokens.OpenAIChat}, "")
			req.URL.RawQuery = "spam=" + strconv.Itoa(tc.spam)
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			_, rerr := io.Copy(io.Discard, res.Body)
			_ = res.Body.Close()
			o := h.outcome(id)
			if o.Complete != tc.complete || (tc.complete && (o.Usage.Cost() != tc.cost || !o.FromHeader)) || (!tc.complete && o.Err == nil) {
				t.Errorf("outcome %+v, want complete %v cost %d", o, tc.complete, tc.cost)
			}
			if !tc.complete {
				return
			}
			if rerr != nil || res.Trailer.Get("Redline-Cost") != "" || res.Trailer.Get("X-Spam-3") == "" {
				t.Errorf("read error %v, trailers %v", rerr, res.Trailer)
			}
		})
	}
}

func TestParseCost(t *testing.T) {
	for _, tc := range []struct {
		vals        []string
		n           int64
		clamped, ok bool
	}{
		{nil, 0, false, false},
		{[]string{""}, 0, false, false},
		{[]string{"0"}, 0, false, true},
		{[]string{"42"}, 42, false, true},
		{[]string{" 42 "}, 42, false, true},
		{[]string{"0000000000000000000000042"}, 42, false, true},
		{[]string{"-5"}, 0, false, false},
		{[]string{"+5"}, 0, false, false},
		{[]string{"1e30"}, 0, false, false},
		{[]string{"1.5"}, 0, false, false},
		{[]string{"3, 4"}, 0, false, false},
		{[]string{"0x10"}, 0, false, false},
		{[]string{"1000000000000"}, tokens.MaxTokens, false, true},
		{[]string{"1000000000001"}, tokens.MaxTokens, true, true},
		{[]string{"9223372036854775808"}, tokens.MaxTokens, true, true},
		{[]string{strings.Repeat("9", 4096)}, tokens.MaxTokens, true, true},
		{[]string{"3", "bad", "9", "-100"}, 9, false, true},
	} {
		c := parseCost(tc.vals)
		if c.n != tc.n || c.clamped != tc.clamped || c.ok != tc.ok {
			t.Errorf("parseCost(%.40q) = %+v, want n %d clamped %v ok %v", tc.vals, c, tc.n, tc.clamped, tc.ok)
		}
	}
}
