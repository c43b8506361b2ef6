package meter

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/redline-dev/redline/internal/testutil/fakemodel"
	"github.com/redline-dev/redline/internal/tokens"
)

// TestMeterEveryShape: through a real ReverseProxy in front of the fake, for every API shape,
// streamed and not, and every place the cost can be reported: the usage found is what the
// upstream served, the client's body is byte for byte the upstream's (less the usage chunk
// the sidecar asked for), and the cost header and trailer never reach the client.
func TestMeterEveryShape(t *testing.T) {
	for _, mode := range []string{"body", "header", "trailer", "undeclared-trailer"} {
		for _, tc := range []struct{ name, knobs string }{
			{"capped", "length=20"}, {"cap ignored", "length=20;ignore-cap"},
		} {
			for _, c := range fakemodel.Calls(7) {
				t.Run(mode+"/"+tc.name+"/"+c.Name(), func(t *testing.T) {
					fake, upstream := fakemodel.Start(t, fakemodel.Config{})
					h := newHarness(t, upstream)
					knobs := tc.knobs + ";cost=" + mode
					res, got, id, err := h.do(c, knobs)
					if err != nil || res.StatusCode != http.StatusOK {
						t.Fatalf("response %v, error %v", res, err)
					}
					o := h.outcome(id)
					served := fake.Served()
					if !o.Complete || o.Err != nil || !o.Found || o.FromHeader != (mode != "body") {
						t.Errorf("outcome %+v, want complete, found, from header %v", o, mode != "body")
					}
					if o.Usage.Cost() != served.Total() {
						t.Errorf("cost %d, the upstream served %+v", o.Usage.Cost(), served)
					}
					if mode == "body" && (o.Usage.Input != served.Input || o.Usage.Output != served.Output) {
						t.Errorf("usage %+v, the upstream served %+v", o.Usage, served)
					}
					if v, ok := res.Header[fakemodel.DefaultCostHeader]; ok {
						t.Errorf("the client saw the cost header %q", v)
					}
					if v, ok := res.Trailer[fakemodel.DefaultCostHeader]; ok {
						t.Errorf("the client saw the cost trailer %q (trailers %v)", v, res.Trailer)
					}
					forwarded, strip := sidecarBody(c.Body(), c.Kind, c.Stream)
					want := direct(t, upstream, c, forwarded, knobs)
					if strip {
						want = withoutUsageChunk(want)
					}
					if !bytes.Equal(got, want) {
						t.Errorf("the client got\n%s\nthe upstream sent (less the chunk asked for)\n%s", got, want)
					}
					if cl := res.ContentLength; cl >= 0 && cl != int64(len(got)) {
						t.Errorf("Content-Length %d, body %d bytes", cl, len(got))
					}
				})
			}
		}
	}
}

// TestMeterFixedLengthStream: an event stream with a Content-Length whose usage chunk is
// removed reaches the client whole and well framed (chunked, the length dropped).
func TestMeterFixedLengthStream(t *testing.T) {
	fake, upstream := fakemodel.Start(t, fakemodel.Config{Length: 12})
	h := newHarness(t, upstream)
	c := fakemodel.Call{Kind: tokens.OpenAIChat, Stream: true}
	res, got, id, err := h.do(c, "fixed-length")
	if err != nil {
		t.Fatal(err)
	}
	if res.StatusCode != http.StatusOK {
		t.Fatalf("status %d", res.StatusCode)
	}
	o := h.outcome(id)
	if !o.Complete || o.Usage.Cost() != fake.Served().Total() {
		t.Errorf("outcome %+v, served %+v", o, fake.Served())
	}
	if res.ContentLength != -1 || len(res.TransferEncoding) != 1 {
		t.Errorf("Content-Length %d, Transfer-Encoding %v: want chunked", res.ContentLength, res.TransferEncoding)
	}
	forwarded, _ := sidecarBody(c.Body(), c.Kind, c.Stream)
	want := withoutUsageChunk(direct(t, upstream, c, forwarded, "fixed-length"))
	if !bytes.Equal(got, want) || bytes.Contains(got, []byte(`"choices":[]`)) {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
}

// TestMeterUpstreamFailures: a cut connection ends the meter with the read error and what the
// stream said before the cut (Gemini reports its usage in every chunk); an error event is a
// complete body. Either way, once.
func TestMeterUpstreamFailures(t *testing.T) {
	for _, c := range fakemodel.Calls(0) {
		t.Run("cut/"+c.Name(), func(t *testing.T) {
			fake, upstream := fakemodel.Start(t, fakemodel.Config{Length: 10})
			h := newHarness(t, upstream)
			_, _, id, err := h.do(c, "fail=cut:3")
			if err == nil {
				t.Error("the client read a cut response to its end")
			}
			o := h.outcome(id)
			if o.Complete || o.Err == nil || errors.Is(o.Err, ErrClientAbort) {
				t.Errorf("outcome %+v, want an upstream error", o)
			}
			if c.Kind == tokens.Gemini && c.Stream && !c.GeminiArray &&
				(!o.Found || o.Usage.Output != 3 || o.Usage.Cost() != fake.Served().Total()) {
				t.Errorf("usage %+v, %v; served %+v", o.Usage, o.Found, fake.Served())
			}
		})
		t.Run("error event/"+c.Name(), func(t *testing.T) {
			_, upstream := fakemodel.Start(t, fakemodel.Config{Length: 10})
			h := newHarness(t, upstream)
			_, _, id, err := h.do(c, "fail=error:3")
			if err != nil {
				t.Fatal(err)
			}
			if o := h.outcome(id); !o.Complete || o.Err != nil {
				t.Errorf("outcome %+v, want complete", o)
			}
		})
	}
}

// TestMeterClientAbort: a client that goes away mid-stream ends the meter once, with
// ErrClientAbort, whether the proxy learns it from the upstream read (the request's context)
// or from writing to the client.
func TestMeterClientAbort(t *testing.T) {
	for _, c := range fakemodel.Calls(0) {
		if !c.Stream {
			continue
		}
		t.Run(c.Name(), func(t *testing.T) {
			_, upstream := fakemodel.Start(t, fakemodel.Config{})
			h := newHarness(t, upstream)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			req, id := h.request(ctx, c, "length=100000;delay=1ms")
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := io.ReadFull(res.Body, make([]byte, 64)); err != nil {
				t.Fatal(err)
			}
			cancel()
			_ = res.Body.Close()
			o := h.outcome(id)
			if o.Complete || !errors.Is(o.Err, ErrClientAbort) {
				t.Errorf("outcome %+v, want a client abort", o)
			}
		})
	}
}

// TestMeterCloseBeforeEOF: the proxy closing the body early (its write to the client failed,
// or ModifyResponse refused the response) is a client abort; reads and closes after the end
// report nothing more.
func TestMeterCloseBeforeEOF(t *testing.T) {
	pr, pw := io.Pipe()
	var outs []Outcome
	res := &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {"text/event-stream"}}, Body: pr}
	Wrap(res, Options{Kind: tokens.Anthropic, OnEnd: func(o Outcome) { outs = append(outs, o) }})
	go func() {
		_, _ = pw.Write([]byte("event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":5,\"output_tokens\":1}}}\n\n"))
	}()
	buf := make([]byte, 4096)
	if _, err := res.Body.Read(buf); err != nil {
		t.Fatal(err)
	}
	_ = res.Body.Close()
	_ = res.Body.Close()
	_, _ = res.Body.Read(buf)
	if len(outs) != 1 || !errors.Is(outs[0].Err, ErrClientAbort) || outs[0].Complete ||
		!outs[0].Found || outs[0].Usage.Cost() != 6 {
		t.Errorf("outcomes %+v, want one client abort with the usage so far (6)", outs)
	}
}

// TestMeterConcurrent: many responses of every kind at once, some cut, some aborted by their
// clients, each ends exactly once (the harness checks) and the race detector watches Close
// against Read.
func TestMeterConcurrent(t *testing.T) {
	_, upstream := fakemodel.Start(t, fakemodel.Config{Length: 30})
	h := newHarness(t, upstream)
	knobs := []string{"", "fail=cut:5", "fail=error:5", "cost=trailer", "delay=100us"}
	var wg sync.WaitGroup
	for i := range 48 {
		calls := fakemodel.Calls(0)
		c := calls[i%len(calls)]
		k := knobs[i%len(knobs)]
		wg.Go(func() {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			req, _ := h.request(ctx, c, k)
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Error(err)
				return
			}
			defer res.Body.Close()
			if i%3 == 0 {
				_, _ = res.Body.Read(make([]byte, 16))
				cancel()
			}
			_, _ = io.Copy(io.Discard, res.Body)
		})
	}
	wg.Wait()
}

// TestMeterWithoutBody: a response with no body ends at once with what its header said.
func TestMeterWithoutBody(t *testing.T) {
	var outs []Outcome
	res := &http.Response{StatusCode: http.StatusNoContent, Header: http.Header{"Redline-Cost": {"42"}}, Body: http.NoBody}
	Wrap(res, Options{OnEnd: func(o Outcome) { outs = append(outs, o) }})
	if len(outs) != 1 || !outs[0].Complete || outs[0].Usage.Cost() != 42 || res.Header.Get("Redline-Cost") != "" {
		t.Errorf("outcomes %+v, header %v", outs, res.Header)
	}
}

// TestMeterCostHeaderName: a custom name is what is read and removed; the default is left.
func TestMeterCostHeaderName(t *testing.T) {
	var got Outcome
	res := &http.Response{StatusCode: 200, Body: io.NopCloser(strings.NewReader("{}")),
		Header: http.Header{"X-Tokens-Used": {"17"}, "Redline-Cost": {"99"}}}
	Wrap(res, Options{CostHeader: "x-tokens-used", OnEnd: func(o Outcome) { got = o }})
	_, _ = io.Copy(io.Discard, res.Body)
	_ = res.Body.Close()
	if got.Usage.Cost() != 17 || !got.FromHeader || res.Header.Get("X-Tokens-Used") != "" || res.Header.Get("Redline-Cost") != "99" {
		t.Errorf("outcome %+v, header %v", got, res.Header)
	}
}
