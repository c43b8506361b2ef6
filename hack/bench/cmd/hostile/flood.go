package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redline-dev/redline/internal/testutil/sidecarproc"
)

// flood is what the memory flood measured.
type flood struct {
	Conns                  int
	IdleMiB, PeakMiB       float64
	Answers                map[int]int
	AtUpstream             int64
	Refusals               float64
	PlainStatuses          []int
	OtherKeyStatus         int
	BudgetBytes, LimitMiB  float64
	MemoryLimitEnvironment string
}

// injectorMemoryLimit is the container memory limit the injector gives a sidecar.
const injectorMemoryLimit = 64 << 20

// vmHWMMiB reads a process's peak resident set in MiB.
func vmHWMMiB(pid int) (float64, error) {
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for line := range strings.SplitSeq(string(status), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 64)
			return kb / 1024, err
		}
	}
	return 0, fmt.Errorf("no VmHWM in /proc/%d/status", pid)
}

// memoryFlood sends 300 token budget requests of a 1 MiB body, each withholding its last byte,
// to a sidecar at the injector's memory limit, then decides another key's requests.
func memoryFlood(ctx context.Context, dir, bin, redisURL string) (flood, error) {
	const conns, size = 300, 1 << 20
	f := flood{Conns: conns, LimitMiB: injectorMemoryLimit >> 20, MemoryLimitEnvironment: fmt.Sprintf("REDLINE_MEMORY_LIMIT=%d", injectorMemoryLimit)}
	var started atomic.Int64
	up, stopUp, err := upstreamOf(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Api-Key") == "flood" {
			started.Add(1)
		}
		if _, err := io.Copy(io.Discard, r.Body); err != nil {
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"x","object":"chat.completion","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":5,"total_tokens":10}}`)
	}))
	if err != nil {
		return f, err
	}
	defer stopUp()
	s, err := startSidecar(ctx, dir, bin, "flood", redisURL, up, f.MemoryLimitEnvironment)
	if err != nil {
		return f, err
	}
	defer func() { _ = s.Stop(5 * time.Second) }()
	if f.IdleMiB, err = vmHWMMiB(s.Pid()); err != nil {
		return f, err
	}

	b := sendSlowBodies(s.Proxy, conns, size)
	// Every request answered or at the upstream, waiting for its last byte.
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) && int64(b.answered())+started.Load() < conns {
		time.Sleep(100 * time.Millisecond)
	}
	f.PlainStatuses, f.OtherKeyStatus = victimRequests(s.Proxy)
	if f.PeakMiB, err = vmHWMMiB(s.Pid()); err != nil {
		return f, err
	}
	got, err := sidecarproc.Scrape(ctx, "http://"+s.Admin+"/metrics", "redline_sidecar_memory_budget_refusals_total", "redline_sidecar_memory_budget_bytes")
	if err != nil {
		return f, err
	}
	f.Refusals, f.BudgetBytes = got["redline_sidecar_memory_budget_refusals_total"], got["redline_sidecar_memory_budget_bytes"]
	f.Answers, f.AtUpstream = b.close(), started.Load()
	return f, nil
}

// slowBodies are connections that each send a token budget request of a body without its
// last byte, and what was answered to them.
type slowBodies struct {
	mu      sync.Mutex
	open    []net.Conn
	answers map[int]int
	wg      sync.WaitGroup
}

// sendSlowBodies opens conns connections to proxy, each sending a request of a size-byte
// body but its last byte.
func sendSlowBodies(proxy string, conns, size int) *slowBodies {
	body := []byte(`{"model":"m","max_tokens":10,"messages":[{"role":"user","content":"`)
	body = append(body, bytes.Repeat([]byte("a"), size-len(body)-len(`"}]}`))...)
	body = append(body, `"}]}`...)
	head := fmt.Sprintf("POST /v1/chat/completions HTTP/1.1\r\nHost: app\r\nX-Api-Key: flood\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", size)
	b := &slowBodies{answers: map[int]int{}}
	for range conns {
		b.wg.Go(func() {
			c, err := net.Dial("tcp", proxy)
			if err != nil {
				return
			}
			b.mu.Lock()
			b.open = append(b.open, c)
			b.mu.Unlock()
			if _, err := io.WriteString(c, head); err == nil {
				_, _ = c.Write(body[:size-1]) // the last byte withheld
			}
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
			b.mu.Lock()
			b.answers[resp.StatusCode]++
			b.mu.Unlock()
		})
	}
	return b
}

// answered is how many requests were answered so far.
func (b *slowBodies) answered() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := 0
	for _, v := range b.answers {
		n += v
	}
	return n
}

// close closes every connection and returns the answers by status.
func (b *slowBodies) close() map[int]int {
	b.mu.Lock()
	for _, c := range b.open {
		_ = c.Close()
	}
	answers := b.answers
	b.mu.Unlock()
	b.wg.Wait()
	return answers
}

// victimRequests sends another key's requests through proxy during the flood: four plain
// ones, then a small token budget request, and returns their statuses (0: no answer).
func victimRequests(proxy string) (plain []int, budget int) {
	client := &http.Client{Timeout: 30 * time.Second}
	for range 4 {
		req, _ := http.NewRequest(http.MethodGet, "http://"+proxy+"/plain", nil)
		req.Header.Set("X-Key", "victim")
		status := 0
		if resp, err := client.Do(req); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
			status = resp.StatusCode
		}
		plain = append(plain, status)
	}
	req, _ := http.NewRequest(http.MethodPost, "http://"+proxy+"/v1/chat/completions",
		strings.NewReader(`{"model":"m","max_tokens":10,"messages":[{"role":"user","content":"hi"}]}`))
	req.Header.Set("X-Api-Key", "victim")
	if resp, err := client.Do(req); err == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		budget = resp.StatusCode
	}
	return plain, budget
}
