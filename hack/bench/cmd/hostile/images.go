package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/redline-dev/redline/internal/testutil/fakemodel"
)

// imageCase is one image case and what it measured.
type imageCase struct {
	Images, Clients int
	Delay           time.Duration
	// BilledPerRequest is what the upstream bills one request: 765 an image and the text.
	BilledPerRequest int64
	// Served is the tokens the upstream billed on the case's key in the window; Requests the
	// requests it served.
	Served, Requests int64
	// Answers counts the sidecar's answers by status.
	Answers map[int]int64
}

// perImage is what the upstream bills an image: a 1024 x 1024 image at gpt-4o's high detail
// (85 + 170 x 4 tiles).
const perImage = 765

// imageBody is a chat request of n image_url parts and max_tokens 1.
func imageBody(n int) string {
	var b strings.Builder
	b.WriteString(`{"model":"gpt-4o","max_tokens":1,"messages":[{"role":"user","content":[{"type":"text","text":"describe these"}`)
	for i := range n {
		fmt.Fprintf(&b, `,{"type":"image_url","image_url":{"url":"https://images.invalid/%d.png"}}`, i)
	}
	b.WriteString(`]}]}`)
	return b.String()
}

func listenLoopback() (net.Listener, error) { return net.Listen("tcp", "127.0.0.1:0") }

// imageCases runs every case at once, each through a sidecar of its own to an upstream of its
// own on a key of its own, inside one minute's window of the shared Redis's clock (this
// machine's).
func imageCases(ctx context.Context, dir, bin, redisURL string, run time.Duration) ([]imageCase, error) {
	cases := []imageCase{
		{Images: 500, Clients: 12}, {Images: 500, Clients: 64, Delay: 2 * time.Second},
		{Images: 5, Clients: 12}, {Images: 5, Clients: 64, Delay: 2 * time.Second},
	}
	type running struct {
		url   string
		model *fakemodel.Server
		stop  func()
	}
	var rs []running
	defer func() {
		for _, r := range rs {
			r.stop()
		}
	}()
	for i := range cases {
		c := &cases[i]
		c.BilledPerRequest = int64(c.Images)*perImage + 10
		m := fakeModel(c.BilledPerRequest, c.Delay)
		addr, stopUp, err := upstreamOf(m)
		if err != nil {
			return nil, err
		}
		s, err := startSidecar(ctx, dir, bin, fmt.Sprintf("images-%d", i), redisURL, addr)
		if err != nil {
			stopUp()
			return nil, err
		}
		rs = append(rs, running{url: "http://" + s.Proxy, model: m, stop: func() { _ = s.Stop(5 * time.Second); stopUp() }})
	}
	// Start just after a minute turns, and stop sending well before the next.
	if run > 45*time.Second {
		run = 45 * time.Second
	}
	now := time.Now()
	start := now.Truncate(time.Minute).Add(time.Minute + 300*time.Millisecond)
	fmt.Printf("image cases: waiting %v for the next window\n", start.Sub(now).Round(time.Second))
	time.Sleep(time.Until(start))
	var wg sync.WaitGroup
	for i := range cases {
		wg.Go(func() {
			cases[i].Answers = hammer(rs[i].url, fmt.Sprintf("case-%d", i), imageBody(cases[i].Images), cases[i].Clients, start.Add(run))
		})
	}
	wg.Wait()
	for i := range cases {
		got := rs[i].model.Served()
		cases[i].Served, cases[i].Requests = got.Total(), got.Requests
	}
	return cases, nil
}

// hammer sends body from clients clients on key until end; a refused client waits 20 ms.
func hammer(base, key, body string, clients int, end time.Time) map[int]int64 {
	client := &http.Client{Timeout: time.Minute, Transport: &http.Transport{MaxIdleConnsPerHost: clients}}
	var mu sync.Mutex
	answers := map[int]int64{}
	var wg sync.WaitGroup
	for range clients {
		wg.Go(func() {
			for time.Now().Before(end) {
				req, _ := http.NewRequest(http.MethodPost, base+"/v1/chat/completions", strings.NewReader(body))
				req.Header.Set("X-API-Key", key)
				req.Header.Set("Content-Type", "application/json")
				status := 0
				resp, err := client.Do(req)
				if err == nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					_ = resp.Body.Close()
					status = resp.StatusCode
				}
				mu.Lock()
				answers[status]++
				mu.Unlock()
				if status != http.StatusOK {
					time.Sleep(20 * time.Millisecond)
				}
			}
		})
	}
	wg.Wait()
	return answers
}
