package meter

import (
	"bytes"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redline-dev/redline/internal/testutil/fakemodel"
	"github.com/redline-dev/redline/internal/tokens"
)

// BenchmarkReadBody: the time a request body read for sizing takes in the sidecar's handler,
// over loopback, for a 2 KB and a 200 KB body: ReadBody (its goroutine and timer) beside a
// plain io.ReadAll of the same body, p50 and p99 of the read reported per case.
func BenchmarkReadBody(b *testing.B) {
	for _, size := range []int{2 << 10, 200 << 10} {
		for _, how := range []string{"ReadBody", "ReadAll"} {
			b.Run(strconv.Itoa(size>>10)+"KB/"+how, func(b *testing.B) {
				var mu sync.Mutex
				var took []time.Duration
				ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					start := time.Now()
					var n int
					if how == "ReadBody" {
						body, err := ReadBody(r, tokens.MaxRequestBytes, time.Second)
						if err != nil {
							b.Error(err)
						}
						n = len(body)
					} else {
						body, _ := io.ReadAll(r.Body)
						n = len(body)
					}
					d := time.Since(start)
					if n != size {
						b.Errorf("read %d bytes, want %d", n, size)
					}
					mu.Lock()
					took = append(took, d)
					mu.Unlock()
				}))
				defer ts.Close()
				body := bytes.Repeat([]byte("x"), size)
				b.SetBytes(int64(size))
				b.ReportAllocs()
				for b.Loop() {
					res, err := http.Post(ts.URL, "application/json", bytes.NewReader(body))
					if err != nil {
						b.Fatal(err)
					}
					_, _ = io.Copy(io.Discard, res.Body)
					_ = res.Body.Close()
				}
				mu.Lock()
				defer mu.Unlock()
				slices.Sort(took)
				if len(took) > 0 {
					b.ReportMetric(float64(took[len(took)/2].Nanoseconds())/1e3, "p50-µs")
					b.ReportMetric(float64(took[len(took)*99/100].Nanoseconds())/1e3, "p99-µs")
				}
			})
		}
	}
}

// BenchmarkProxyStream: the CPU a streamed response costs through a ReverseProxy, plain and
// metered (and with the usage chunk removed), in one run so the difference is the meter's:
// an OpenAI chat stream of 500 tokens from the fake, one event a write, read whole by the
// client. ns/op and allocs/op include the fake and the client, the same in each case.
func BenchmarkProxyStream(b *testing.B) {
	_, upstream := fakemodel.Start(b, fakemodel.Config{Length: 500})
	target, _ := url.Parse(upstream)
	call := fakemodel.Call{Kind: tokens.OpenAIChat, Stream: true, IncludeUsage: true}
	body := call.Body()
	for _, mode := range []string{"plain", "metered", "metered-strip"} {
		b.Run(mode, func(b *testing.B) {
			var ended sync.WaitGroup
			rp := &httputil.ReverseProxy{
				Rewrite:  func(pr *httputil.ProxyRequest) { pr.SetURL(target) },
				ErrorLog: log.New(io.Discard, "", 0),
			}
			if mode != "plain" {
				rp.ModifyResponse = func(res *http.Response) error {
					ended.Add(1)
					Wrap(res, Options{Kind: tokens.OpenAIChat, StripUsage: mode == "metered-strip",
						OnEnd: func(o Outcome) {
							if !o.Found || o.Usage.Output != 500 {
								b.Errorf("outcome %+v", o)
							}
							ended.Done()
						}})
					return nil
				}
			}
			ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				fullDuplex(w)
				rp.ServeHTTP(w, r)
			}))
			defer ts.Close()
			b.ReportAllocs()
			for b.Loop() {
				res, err := http.Post(ts.URL+call.Path(), "application/json", bytes.NewReader(body))
				if err != nil {
					b.Fatal(err)
				}
				if n, err := io.Copy(io.Discard, res.Body); err != nil || n < 1000 {
					b.Errorf("client read %d, %v", n, err)
				}
				_ = res.Body.Close()
			}
			ended.Wait()
		})
	}
}

// eventReader returns one event a Read, as a stream arrives from a flushing upstream.
type eventReader struct {
	events [][]byte
	i      int
}

func (r *eventReader) Read(p []byte) (int, error) {
	if r.i == len(r.events) {
		return 0, io.EOF
	}
	n := copy(p, r.events[r.i])
	r.i++
	return n, nil
}

func (r *eventReader) Close() error { return nil }

// BenchmarkMeter: the meter's own CPU per streamed response, no network: a 2,000-token OpenAI
// chat stream read one event at a time, through nothing (plain), the meter, and the meter
// removing the usage chunk.
func BenchmarkMeter(b *testing.B) {
	stream := fakeStream(b, 2000)
	events := bytes.SplitAfter(stream, []byte("\n\n"))
	buf := make([]byte, 32<<10)
	for _, mode := range []string{"plain", "metered", "metered-strip"} {
		b.Run(mode, func(b *testing.B) {
			b.SetBytes(int64(len(stream)))
			b.ReportAllocs()
			for b.Loop() {
				res := &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {"text/event-stream"}},
					Body: &eventReader{events: events}}
				if mode != "plain" {
					Wrap(res, Options{Kind: tokens.OpenAIChat, StripUsage: mode == "metered-strip"})
				}
				_, _ = io.CopyBuffer(struct{ io.Writer }{io.Discard}, res.Body, buf)
				_ = res.Body.Close()
			}
		})
	}
}

// fakeStream is the fake's OpenAI chat stream of n tokens with its usage chunk.
func fakeStream(b *testing.B, n int64) []byte {
	_, upstream := fakemodel.Start(b, fakemodel.Config{Length: n})
	c := fakemodel.Call{Kind: tokens.OpenAIChat, Stream: true, IncludeUsage: true}
	res, err := http.Post(upstream+c.Path(), "application/json", bytes.NewReader(c.Body()))
	if err != nil {
		b.Fatal(err)
	}
	defer res.Body.Close()
	s, err := io.ReadAll(res.Body)
	if err != nil {
		b.Fatal(err)
	}
	return s
}
