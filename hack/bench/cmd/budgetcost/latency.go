package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/redline-dev/redline/internal/sidecar/meter"
	"github.com/redline-dev/redline/internal/testutil/fakemodel"
	"github.com/redline-dev/redline/internal/tokens"
)

// bodySizes are the request bodies of the latency sections: a chat turn and a long context.
var bodySizes = []int{2 << 10, 200 << 10}

// block is how many requests one path or reader gets in a row before the next takes over:
// short enough that a burst of load on the machine falls on every path alike.
const block = 25

// latencyCell is one body size through one path, end to end.
type latencyCell struct {
	size, bodyBytes int
	path            string
	took            []time.Duration
}

// latencyCall is the non-streamed request of a body of about size bytes (the prompt fills it),
// capped at 16 output tokens: the response is short, so that the time is the request's.
func latencyCall(size int) (fakemodel.Call, []byte) {
	c := fakemodel.Call{Kind: tokens.OpenAIChat, Cap: 16, Prompt: "x"}
	overhead := len(c.Body()) - 1
	c.Prompt = strings.Repeat("lorem ", size/6+1)[:max(1, size-overhead)]
	return c, c.Body()
}

// measureLatency sends one request at a time, non-streamed, with each body size straight to
// the application and through each sidecar, in alternating blocks, and times each from its
// send to the last byte of its response.
func measureLatency(ctx context.Context, o options, b *bench) ([]latencyCell, error) {
	targets := []struct{ name, addr string }{
		{"application, no sidecar", b.upstream},
		{"sidecar, request count", b.sidecars[pathPlain].Proxy},
		{"sidecar, token budget", b.sidecars[pathBudget].Proxy},
	}
	var cells []latencyCell
	for _, size := range bodySizes {
		call, body := latencyCall(size)
		clients := make([]*http.Client, len(targets))
		row := make([]latencyCell, len(targets))
		for i, t := range targets {
			clients[i] = &http.Client{Timeout: 30 * time.Second}
			defer clients[i].CloseIdleConnections()
			row[i] = latencyCell{size: size, bodyBytes: len(body), path: t.name}
			for j := range 20 { // a connection, and the key's first hold or lease
				if _, err := timedRequest(ctx, clients[i], "http://"+t.addr+call.Path(), body, int64(j)); err != nil {
					return nil, fmt.Errorf("warm-up, %s, %d bytes: %w", t.name, len(body), err)
				}
			}
		}
		for r := 0; len(row[0].took) < o.latencyReqs; r++ {
			for k := range targets {
				i := (k + r) % len(targets) // which path goes first turns every round
				for range min(block, o.latencyReqs-len(row[i].took)) {
					d, err := timedRequest(ctx, clients[i], "http://"+targets[i].addr+call.Path(), body, int64(len(row[i].took)))
					if err != nil {
						return nil, fmt.Errorf("%s, %d bytes: %w", targets[i].name, len(body), err)
					}
					row[i].took = append(row[i].took, d)
				}
			}
		}
		cells = append(cells, row...)
	}
	return cells, nil
}

// timedRequest posts body to url and reads the response whole, which must be a 200.
func timedRequest(ctx context.Context, hc *http.Client, url string, body []byte, i int64) (time.Duration, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return 0, fmt.Errorf("building request: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(keyHeader, fmt.Sprintf("k%d", i%keys))
	start := time.Now()
	resp, err := hc.Do(req)
	if err != nil {
		return 0, fmt.Errorf("POST %s: %w", url, err)
	}
	got, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	_ = resp.Body.Close()
	took := time.Since(start)
	if err != nil {
		return 0, fmt.Errorf("reading the response: %w", err)
	}
	if resp.StatusCode != http.StatusOK || !bytes.Contains(got, []byte(`"completion_tokens":16`)) {
		return 0, fmt.Errorf("status %d: %.300s", resp.StatusCode, got)
	}
	return took, nil
}

// readBodyCell is one body size read by one reader inside a handler.
type readBodyCell struct {
	size   int
	reader string
	took   []time.Duration
}

// Readers of the in-process section.
const (
	readerReadBody = "meter.ReadBody"
	readerReadAll  = "io.ReadAll"
)

// measureReadBody times the read of a request body inside a handler of this process over
// loopback, as the sidecar's budget path reads it (meter.ReadBody: its goroutine, its timer
// and its bound) and as a plain io.ReadAll would, n times per size and reader in alternating
// blocks; the client writes the body as it is sent, so the read includes its transfer.
func measureReadBody(ctx context.Context, n int) ([]readBodyCell, error) {
	var mu sync.Mutex
	var took time.Duration
	var readErr error
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		var body []byte
		var err error
		if r.Header.Get("X-Reader") == readerReadBody {
			body, err = meter.ReadBody(r, tokens.MaxRequestBytes, time.Second)
		} else {
			body, err = io.ReadAll(r.Body)
		}
		d := time.Since(start)
		if err == nil && int64(len(body)) != r.ContentLength {
			err = fmt.Errorf("read %d bytes of %d", len(body), r.ContentLength)
		}
		mu.Lock()
		took, readErr = d, err
		mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	})
	addr, stop, err := serve(h)
	if err != nil {
		return nil, err
	}
	defer stop()
	hc := &http.Client{Timeout: 10 * time.Second}
	defer hc.CloseIdleConnections()
	var cells []readBodyCell
	for _, size := range bodySizes {
		body := bytes.Repeat([]byte("x"), size)
		row := []readBodyCell{{size: size, reader: readerReadAll}, {size: size, reader: readerReadBody}}
		for r := 0; len(row[0].took) < n+warmUp; r++ {
			for k := range row {
				c := &row[(k+r)%len(row)]
				for range min(block, n+warmUp-len(c.took)) {
					req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/", bytes.NewReader(body))
					if err != nil {
						return nil, fmt.Errorf("building request: %w", err)
					}
					req.Header.Set("X-Reader", c.reader)
					resp, err := hc.Do(req)
					if err != nil {
						return nil, fmt.Errorf("POST: %w", err)
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					_ = resp.Body.Close()
					mu.Lock()
					d, rerr := took, readErr
					mu.Unlock()
					if rerr != nil {
						return nil, fmt.Errorf("%s of %d bytes: %w", c.reader, size, rerr)
					}
					c.took = append(c.took, d)
				}
			}
		}
		for i := range row {
			row[i].took = row[i].took[warmUp:]
		}
		cells = append(cells, row...)
	}
	return cells, nil
}
