package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redline-dev/redline/internal/testutil/fakemodel"
	"github.com/redline-dev/redline/internal/testutil/sidecarproc"
	"github.com/redline-dev/redline/internal/tokens"
)

// cpuSample is one run of the CPU section on one sidecar.
type cpuSample struct {
	responses   int64
	perResponse time.Duration
	perSec      float64
	// settled and returned are the budget's holds settled with a usage over the run, and the
	// units they gave back (hold less use): the settle really ran, with the stream's usage.
	settled, returned float64
}

// streamCall is the request of the CPU section: an OpenAI chat stream that did not ask for its
// usage (the budget's sidecar asks on its behalf, and strips the usage chunk), with a cap
// above what the fake sends.
var streamCall = fakemodel.Call{Kind: tokens.OpenAIChat, Stream: true, Cap: outputCap}

const warmUp = 50

// measureCPU runs o.responses streamed responses through sidecar p from o.concurrency clients
// and divides the sidecar's CPU time over them by their count.
func measureCPU(ctx context.Context, o options, b *bench, p int) (cpuSample, error) {
	s := b.sidecars[p]
	hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: o.concurrency}}
	defer hc.CloseIdleConnections()
	body := streamCall.Body()
	url := "http://" + s.Proxy + streamCall.Path()
	fn := func(ctx context.Context, i int64) error { return streamOnce(ctx, hc, url, body, i, o.tokens) }
	for i := range int64(warmUp) {
		if err := fn(ctx, i); err != nil {
			return cpuSample{}, fmt.Errorf("warm-up: %w", err)
		}
	}
	settled0, returned0, err := settles(ctx, s, p)
	if err != nil {
		return cpuSample{}, err
	}
	served0 := b.model.Served()
	cpu0, err := sidecarproc.CPUTime(s.Pid())
	if err != nil {
		return cpuSample{}, fmt.Errorf("reading the sidecar's CPU time: %w", err)
	}
	n, elapsed, err := closedLoop(ctx, o.concurrency, o.responses, o.cellTime, fn)
	if err != nil {
		return cpuSample{}, err
	}
	// The settles run beside the responses' ends; their CPU is the budget's. Wait for them
	// before reading the CPU time, so that it is counted.
	var settled, returned float64
	if p == pathBudget {
		err = waitFor(ctx, 10*time.Second, func() (bool, error) {
			s1, r1, err := settles(ctx, s, p)
			settled, returned = s1-settled0, r1-returned0
			return settled >= float64(n), err
		})
		if err != nil {
			return cpuSample{}, fmt.Errorf("%.0f of %d holds settled with a usage: %w", settled, n, err)
		}
	}
	cpu1, err := sidecarproc.CPUTime(s.Pid())
	if err != nil {
		return cpuSample{}, fmt.Errorf("reading the sidecar's CPU time: %w", err)
	}
	if got, want := b.model.Served().Output-served0.Output, n*o.tokens; got != want {
		return cpuSample{}, fmt.Errorf("the application served %d output tokens for %d responses of %d", got, n, o.tokens)
	}
	return cpuSample{responses: n, perResponse: (cpu1 - cpu0) / time.Duration(n), perSec: float64(n) / elapsed.Seconds(),
		settled: settled, returned: returned}, nil
}

// settles reads a budget sidecar's holds settled with a usage (Redis reached), and the units
// they gave back.
func settles(ctx context.Context, s *sidecarproc.Sidecar, p int) (settled, returned float64, err error) {
	if p != pathBudget {
		return 0, 0, nil
	}
	// Settled, or expired: a run across midnight UTC sees its day's window end, and the holds
	// of the window go back before their settle, which then charges the usage in full.
	all, err := scrapeSum(ctx, s.Admin, "redline_sidecar_hold_settles_total", "")
	if err != nil {
		return 0, 0, err
	}
	failed, err := scrapeSum(ctx, s.Admin, "redline_sidecar_hold_settles_total", `result="failed"`)
	if err != nil {
		return 0, 0, err
	}
	settled = all - failed
	returned, err = scrapeSum(ctx, s.Admin, "redline_sidecar_hold_returned_units_total", "")
	return settled, returned, err
}

// done is the OpenAI chat stream's last event.
var done = []byte("data: [DONE]\n\n")

// streamOnce sends the i-th streamed request to url and reads its response whole: it must be a
// 200 that ends as the API's streams end, without a usage chunk (the client did not ask).
func streamOnce(ctx context.Context, hc *http.Client, url string, body []byte, i, outTokens int64) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("building request: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(keyHeader, "k"+strconv.FormatInt(i%keys, 10))
	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("POST %s: %w", url, err)
	}
	got, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	_ = resp.Body.Close()
	if err != nil {
		return fmt.Errorf("reading the stream: %w", err)
	}
	switch {
	case resp.StatusCode != http.StatusOK:
		return fmt.Errorf("status %d: %.300s", resp.StatusCode, got)
	case !bytes.HasSuffix(got, done):
		return fmt.Errorf("a stream that does not end with [DONE]: ...%.300s", got[max(0, len(got)-300):])
	case bytes.Contains(got, []byte(`"prompt_tokens"`)):
		return fmt.Errorf("the client got a usage chunk it did not ask for")
	case int64(bytes.Count(got, []byte("\n\n"))) < outTokens:
		return fmt.Errorf("%d events for %d tokens", bytes.Count(got, []byte("\n\n")), outTokens)
	}
	return nil
}

// closedLoop runs fn from conc goroutines until maxOps calls have returned or maxTime has
// passed; at maxTime no new call starts, and those under way finish, so that the work counted
// is whole responses. A failure ends the run with it: a response that is not whole means the
// path measured is not the one meant.
func closedLoop(ctx context.Context, conc int, maxOps int64, maxTime time.Duration, fn func(context.Context, int64) error) (int64, time.Duration, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var next, finished atomic.Int64
	var once sync.Once
	var first error
	var wg sync.WaitGroup
	start := time.Now()
	for range conc {
		wg.Go(func() {
			for ctx.Err() == nil && time.Since(start) < maxTime {
				i := next.Add(1) - 1
				if i >= maxOps {
					return
				}
				if err := fn(ctx, warmUp+i); err != nil {
					if ctx.Err() == nil {
						once.Do(func() { first = err; cancel() })
					}
					return
				}
				finished.Add(1)
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	if first != nil {
		return 0, 0, first
	}
	if err := ctx.Err(); err != nil {
		return 0, 0, err
	}
	if finished.Load() == 0 {
		return 0, 0, fmt.Errorf("no response within %s", maxTime)
	}
	return finished.Load(), elapsed, nil
}
