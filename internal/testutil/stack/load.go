package stack

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Upstream is a tiny application on loopback: it answers every request with 200 and counts
// them, so what reached it can be compared with what the sidecars admitted.
type Upstream struct {
	// Addr is host:port.
	Addr string
	hits atomic.Int64
	srv  *http.Server
}

// Hits is the number of requests the upstream has served.
func (u *Upstream) Hits() int64 { return u.hits.Load() }

// StartUpstream starts an Upstream; the stack stops it.
func (s *Stack) StartUpstream() (*Upstream, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("listening for the upstream: %w", err)
	}
	u := &Upstream{Addr: ln.Addr().String()}
	u.srv = &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.hits.Add(1)
		_, _ = io.Copy(io.Discard, r.Body)
		_, _ = io.WriteString(w, "hello from the upstream\n")
	})}
	go func() { _ = u.srv.Serve(ln) }()
	s.addCleanup(u.srv.Close)
	return u, nil
}

// Request describes one request of a load run.
type Request struct {
	Method, Path string
	Header       http.Header
}

// Counts are the outcomes of requests.
type Counts struct {
	Sent     int
	Admitted int // 2xx
	Limited  int // 429
	Failed   int // transport errors and any other status
}

// Tally is the result of a load run, overall and per target.
type Tally struct {
	Counts
	PerTarget []Counts
	// FirstFailure describes the first failed request, if any.
	FirstFailure string
	Elapsed      time.Duration
}

// loadClient keeps connections to the targets alive between requests and runs.
var loadClient = &http.Client{
	Timeout: 10 * time.Second,
	Transport: &http.Transport{
		MaxIdleConns: 256, MaxIdleConnsPerHost: 64, IdleConnTimeout: 30 * time.Second,
		DialContext: (&net.Dialer{Timeout: 2 * time.Second}).DialContext,
	},
}

// Send sends n requests made by req, spread round-robin over targets (base URLs such as
// Sidecar.ProxyURL: request i goes to targets[i%len(targets)]), with up to concurrency in
// flight.
func Send(ctx context.Context, targets []string, n, concurrency int, req func(i int) Request) Tally {
	t := Tally{PerTarget: make([]Counts, len(targets))}
	var mu sync.Mutex
	work := make(chan int)
	var wg sync.WaitGroup
	start := time.Now()
	for range max(concurrency, 1) {
		wg.Go(func() {
			for i := range work {
				target := i % len(targets)
				status, err := do(ctx, targets[target], req(i))
				mu.Lock()
				c := &t.PerTarget[target]
				c.Sent++
				switch {
				case err == nil && status >= 200 && status < 300:
					c.Admitted++
				case err == nil && status == http.StatusTooManyRequests:
					c.Limited++
				default:
					c.Failed++
					if t.FirstFailure == "" {
						if err != nil {
							t.FirstFailure = err.Error()
						} else {
							t.FirstFailure = fmt.Sprintf("%s: HTTP %d", targets[target], status)
						}
					}
				}
				mu.Unlock()
			}
		})
	}
	for i := range n {
		if ctx.Err() != nil {
			break
		}
		work <- i
	}
	close(work)
	wg.Wait()
	t.Elapsed = time.Since(start)
	for _, c := range t.PerTarget {
		t.Sent += c.Sent
		t.Admitted += c.Admitted
		t.Limited += c.Limited
		t.Failed += c.Failed
	}
	return t
}

func do(ctx context.Context, base string, r Request) (int, error) {
	method := r.Method
	if method == "" {
		method = http.MethodGet
	}
	req, err := http.NewRequestWithContext(ctx, method, base+r.Path, nil)
	if err != nil {
		return 0, fmt.Errorf("building request: %w", err)
	}
	maps.Copy(req.Header, r.Header)
	resp, err := loadClient.Do(req)
	if err != nil {
		return 0, fmt.Errorf("%s %s%s: %w", method, base, r.Path, err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	return resp.StatusCode, nil
}

// Metric sums the samples of the Prometheus metric name served by the sidecar's admin port
// whose labels include every pair of match.
func (sc *Sidecar) Metric(ctx context.Context, name string, match map[string]string) (float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, sc.AdminURL+"/metrics", nil)
	if err != nil {
		return 0, fmt.Errorf("building metrics request: %w", err)
	}
	resp, err := loadClient.Do(req)
	if err != nil {
		return 0, fmt.Errorf("scraping the metrics of %s: %w", sc.Pod.Name, err)
	}
	defer func() { _ = resp.Body.Close() }()
	var sum float64
	sc2 := bufio.NewScanner(resp.Body)
	sc2.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc2.Scan() {
		line := sc2.Text()
		if !strings.HasPrefix(line, name) {
			continue
		}
		rest := line[len(name):]
		labels := ""
		if strings.HasPrefix(rest, "{") {
			end := strings.Index(rest, "}")
			if end < 0 {
				continue
			}
			labels, rest = rest[1:end], rest[end+1:]
		}
		if !strings.HasPrefix(rest, " ") || !labelsMatch(labels, match) {
			continue // another metric with name as prefix, or other labels
		}
		v, err := strconv.ParseFloat(strings.Fields(rest)[0], 64)
		if err != nil {
			return 0, fmt.Errorf("parsing metric line %q: %w", line, err)
		}
		sum += v
	}
	if err := sc2.Err(); err != nil {
		return 0, fmt.Errorf("reading the metrics of %s: %w", sc.Pod.Name, err)
	}
	return sum, nil
}

// labelsMatch reports whether a Prometheus label string (a="x",b="y") has every pair of match.
func labelsMatch(labels string, match map[string]string) bool {
	for k, v := range match {
		if !strings.Contains(","+labels, ","+k+"="+strconv.Quote(v)) {
			return false
		}
	}
	return true
}
