package fakemodel

import (
	"bytes"
	"errors"
	"io"
	"mime"
	"net/http"
	"strconv"
	"testing"

	"github.com/redline-dev/redline/internal/tokens"
)

// do sends c with the knob header and returns the response, its body and the body's read error.
func do(t *testing.T, base string, c Call, knobs string) (*http.Response, []byte, error) {
	t.Helper()
	req, err := c.NewRequest(base)
	if err != nil {
		t.Fatal(err)
	}
	if knobs != "" {
		req.Header.Set(KnobHeader, knobs)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	return res, body, err
}

func scan(res *http.Response, kind tokens.Kind, body []byte) (tokens.Usage, bool) {
	mt, _, _ := mime.ParseMediaType(res.Header.Get("Content-Type"))
	s := tokens.NewUsageScanner(kind, mt == "text/event-stream")
	_, _ = s.Write(body)
	return s.Usage()
}

func prompt(c Call) int64 {
	_, stream := tokens.KindFromPath(c.Path())
	r, err := tokens.ScanRequest(c.Body(), c.Kind, stream)
	if err != nil {
		panic(err)
	}
	return r.PromptTokens
}

// TestUsageMatchesServed: in every shape, what internal/tokens reads from the body is what the
// fake counted as served, and the output stops at the request's cap unless told to ignore it.
func TestUsageMatchesServed(t *testing.T) {
	for _, tc := range []struct {
		name      string
		cap       int64
		knobs     string
		wantOut   int64
		fixedWant bool
	}{
		{"under the cap", 50, "length=20", 20, false},
		{"at the cap", 7, "length=20", 7, false},
		{"no cap", 0, "length=9", 9, false},
		{"cap ignored", 7, "length=20;ignore-cap", 20, false},
		{"fixed length", 7, "length=20;fixed-length", 7, true},
		{"input given", 7, "length=20;input=1234", 7, false},
	} {
		for _, c := range Calls(tc.cap) {
			t.Run(tc.name+"/"+c.Name(), func(t *testing.T) {
				s, base := Start(t, Config{})
				res, body, err := do(t, base, c, tc.knobs)
				if err != nil || res.StatusCode != http.StatusOK {
					t.Fatalf("status %d, read error %v: %s", res.StatusCode, err, body)
				}
				wantIn := prompt(c)
				if tc.knobs == "length=20;input=1234" {
					wantIn = 1234
				}
				got := s.Served()
				if got != (Served{Input: wantIn, Output: tc.wantOut, Requests: 1}) {
					t.Errorf("Served = %+v, want input %d output %d", got, wantIn, tc.wantOut)
				}
				u, ok := scan(res, c.Kind, body)
				if c.Kind == tokens.OpenAIChat && c.Stream && !c.IncludeUsage {
					if ok || bytes.Contains(body, []byte(`"usage"`)) {
						t.Errorf("a stream that did not ask for usage reports it: %s", body)
					}
					return
				}
				if !ok || u.Input != wantIn || u.Output != tc.wantOut || u.Cost() != wantIn+tc.wantOut {
					t.Errorf("usage read = %+v, %v; want input %d output %d\n%s", u, ok, wantIn, tc.wantOut, body)
				}
				if cl := res.Header.Get("Content-Length"); (c.Stream && tc.fixedWant) != (c.Stream && cl != "") {
					t.Errorf("Content-Length %q on a stream, fixed-length %v", cl, tc.fixedWant)
				}
			})
		}
	}
}

// TestDeterministic: the same request gives the same bytes, which the proxy tests compare.
func TestDeterministic(t *testing.T) {
	_, base := Start(t, Config{Length: 5})
	for _, c := range Calls(0) {
		_, a, _ := do(t, base, c, "")
		_, b, _ := do(t, base, c, "")
		if !bytes.Equal(a, b) || len(a) == 0 {
			t.Errorf("%s: two answers differ:\n%s\n%s", c.Name(), a, b)
		}
	}
}

func TestCostOutsideTheBody(t *testing.T) {
	for _, mode := range []string{"header", "trailer", "undeclared-trailer"} {
		for _, c := range Calls(4) {
			t.Run(mode+"/"+c.Name(), func(t *testing.T) {
				s, base := Start(t, Config{})
				res, body, err := do(t, base, c, "length=10;cost="+mode)
				if err != nil {
					t.Fatal(err)
				}
				want := strconv.FormatInt(s.Served().Total(), 10)
				var got string
				if mode == "header" {
					got = res.Header.Get(DefaultCostHeader)
				} else {
					got = res.Trailer.Get(DefaultCostHeader)
				}
				if got != want || s.Served().Output != 4 {
					t.Errorf("cost %s %q, want %q (served %+v)", mode, got, want, s.Served())
				}
				if _, ok := scan(res, c.Kind, body); ok {
					t.Errorf("the body reports usage in cost mode %s: %s", mode, body)
				}
			})
		}
	}
}

// TestFailures: a cut connection is a read error after k tokens; an error event ends the stream
// cleanly; either way the fake counted k output tokens.
func TestFailures(t *testing.T) {
	for _, c := range Calls(0) {
		t.Run("cut/"+c.Name(), func(t *testing.T) {
			s, base := Start(t, Config{Length: 10})
			_, body, err := do(t, base, c, "fail=cut:3")
			if !errors.Is(err, io.ErrUnexpectedEOF) {
				t.Errorf("read error %v, want unexpected EOF (body %q)", err, body)
			}
			if got := s.Served().Output; got != 3 {
				t.Errorf("served %d output tokens, want 3", got)
			}
		})
		t.Run("error/"+c.Name(), func(t *testing.T) {
			s, base := Start(t, Config{Length: 10})
			res, body, err := do(t, base, c, "fail=error:3")
			if err != nil {
				t.Fatal(err)
			}
			if !c.Stream && res.StatusCode != http.StatusInternalServerError {
				t.Errorf("status %d, want 500", res.StatusCode)
			}
			if !bytes.Contains(body, []byte(`error`)) {
				t.Errorf("no error event: %s", body)
			}
			if got := s.Served().Output; got != 3 {
				t.Errorf("served %d output tokens, want 3", got)
			}
		})
	}
}

func TestKnobErrors(t *testing.T) {
	_, base := Start(t, Config{})
	for _, k := range []string{"size=3", "length=-1", "fail=boom:1", "cost=nowhere", "delay=soon"} {
		res, _, _ := do(t, base, Call{Kind: tokens.Anthropic}, k)
		if res.StatusCode != http.StatusBadRequest {
			t.Errorf("%q: status %d, want 400", k, res.StatusCode)
		}
	}
}
