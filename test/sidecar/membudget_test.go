package sidecar_test

import (
	"bufio"
	"bytes"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/redline-dev/redline/internal/policydoc"
	"github.com/redline-dev/redline/internal/sidecar/decide"
	"github.com/redline-dev/redline/internal/sidecar/membudget"
	"github.com/redline-dev/redline/internal/testutil/sidecartest"
)

// floodFlags are more sidecar flags for TestSlowBodyFloodStaysUnderTheMemoryLimit, to measure
// the flood against other settings: -flood-flags=--memory-budget=-1 is the sidecar without a
// memory budget (the test then fails on the peak it reports).
var floodFlags = flag.String("flood-flags", "", "more sidecar flags for the slow body flood, space-separated")

// vmHWMMiB reads a process's peak resident set (VmHWM) in MiB.
func vmHWMMiB(t testing.TB, pid int) float64 {
	t.Helper()
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(string(status), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 64)
			if err != nil {
				t.Fatalf("parsing VmHWM %q: %v", rest, err)
			}
			return kb / 1024
		}
	}
	t.Fatal("no VmHWM in /proc status")
	return 0
}

// floodOutcome is what one connection of the flood was answered, if anything.
type floodOutcome struct {
	status     int
	retryAfter string
	body       string
}

// At the injector's memory limit, 300 connections each send a token budget request of a 1 MiB
// body and withhold its last byte: the sidecar's peak RSS stays under the limit, the requests
// the memory budget has no room for are answered 503 with Retry-After (and counted), and
// meanwhile another key is still decided. Without the budget (-flood-flags=--memory-budget=-1)
// the sidecar buffered every body before any decision: 335 MiB.
func TestSlowBodyFloodStaysUnderTheMemoryLimit(t *testing.T) {
	bodyFlood(t, false)
}

// The same with whole bodies (an ingress that buffers them) to a slow model: a body's memory
// goes back once the model has read it, so nothing but the request's hold is held while the
// model answers.
func TestWholeBodiesToASlowModelStayUnderTheMemoryLimit(t *testing.T) {
	bodyFlood(t, true)
}

func bodyFlood(t *testing.T, whole bool) {
	g := NewWithT(t)
	var started, read atomic.Int64
	answer := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		started.Add(1)
		if _, err := io.Copy(io.Discard, r.Body); err != nil {
			return
		}
		if r.Header.Get("X-Api-Key") == "flood" {
			read.Add(1)
			<-answer // a slow model
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"x","object":"chat.completion","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":5,"total_tokens":10}}`)
	}))
	t.Cleanup(up.Close)
	t.Cleanup(func() { close(answer) })
	e := newEnv(t, "web")
	budget := sidecartest.BudgetRule("tokens", "x-api-key", "FixedWindow", 1_000_000_000, 1000, 1, policydoc.OnErrorZero)
	budget.Match = &policydoc.Match{PathPrefix: "/v1/chat/completions"}
	calls := policydoc.Rule{Name: "calls", Key: []policydoc.KeyPart{{Header: "x-key"}}, Algorithm: "FixedWindow",
		Requests: 3, WindowMS: time.Minute.Milliseconds(), Mode: "Enforce", Match: &policydoc.Match{PathPrefix: "/plain"}}
	e.write(t, sidecartest.DocumentRules(e.namespace, "p", "web", budget, calls))
	s := startWithEnv(t, "flooded", e, hostPort(up.URL), []string{fmt.Sprintf("REDLINE_MEMORY_LIMIT=%d", memoryLimit)}, strings.Fields(*floodFlags)...)
	pid := s.Pid()
	idle := vmHWMMiB(t, pid)
	if *floodFlags == "" {
		g.Expect(s.metric(t, "redline_sidecar_memory_budget_bytes")).To(BeNumerically("==", 57042480/100*membudget.DefaultPercent),
			"the budget is its share of Go's memory limit, 85% of the container's")
	}

	const conns, size = 300, 1 << 20
	body := []byte(`{"model":"m","max_tokens":10,"messages":[{"role":"user","content":"`)
	body = append(body, bytes.Repeat([]byte("a"), size-len(body)-len(`"}]}`))...)
	body = append(body, `"}]}`...)
	head := fmt.Sprintf("POST /v1/chat/completions HTTP/1.1\r\nHost: app\r\nX-Api-Key: flood\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", size)

	var (
		mu       sync.Mutex
		open     []net.Conn
		outcomes []floodOutcome
		wg       sync.WaitGroup
	)
	closeAll := func() {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range open {
			_ = c.Close()
		}
	}
	t.Cleanup(func() { closeAll(); wg.Wait() })
	for range conns {
		wg.Go(func() {
			c, err := net.Dial("tcp", hostPort(s.proxy))
			if err != nil {
				t.Errorf("dialing the proxy: %v", err)
				return
			}
			mu.Lock()
			open = append(open, c)
			mu.Unlock()
			// A refused request's connection is closed under the rest of its body: a write
			// error is an answer on its way, read below.
			if _, err := io.WriteString(c, head); err == nil {
				if whole {
					_, _ = c.Write(body)
				} else {
					_, _ = c.Write(body[:size-1]) // the last byte withheld
				}
			}
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				return // closed without an answer: the test ends
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			mu.Lock()
			outcomes = append(outcomes, floodOutcome{status: resp.StatusCode, retryAfter: resp.Header.Get("Retry-After"), body: string(b)})
			mu.Unlock()
		})
	}
	// Every request of the flood is either answered or at the application, waiting for its
	// last byte, or read whole and waiting for the model.
	answered := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(outcomes)
	}
	at := &started
	if whole {
		at = &read
	}
	g.Eventually(func() int64 { return int64(answered()) + at.Load() }, 2*time.Minute, 100*time.Millisecond).
		Should(BeEquivalentTo(conns), "every request of the flood answered or forwarded")
	if whole {
		g.Expect(s.metric(t, "redline_sidecar_memory_budget_in_use_bytes")).To(BeNumerically("==", read.Load()*decide.HoldBytes),
			"nothing held once the model has the bodies but the holds of the requests it answers")
	}

	// Meanwhile other keys are decided: a plain rule counts its requests, and a small token
	// budget request fits beside the flood.
	statuses := []int{}
	for range 4 {
		req, _ := http.NewRequest(http.MethodGet, s.proxy+"/plain", nil)
		req.Header.Set("X-Key", "victim")
		resp, err := httpClient.Do(req)
		g.Expect(err).NotTo(HaveOccurred())
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		statuses = append(statuses, resp.StatusCode)
	}
	g.Expect(statuses).To(Equal([]int{200, 200, 200, 429}), "the plain rule of another key is decided")
	req, _ := http.NewRequest(http.MethodPost, s.proxy+"/v1/chat/completions",
		strings.NewReader(`{"model":"m","max_tokens":10,"messages":[{"role":"user","content":"hi"}]}`))
	req.Header.Set("X-Api-Key", "victim")
	resp, err := httpClient.Do(req)
	g.Expect(err).NotTo(HaveOccurred())
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	g.Expect(resp.StatusCode).To(Equal(http.StatusOK), "a small token budget request of another key is served")

	peak := vmHWMMiB(t, pid)
	select {
	case <-s.Done():
		t.Fatalf("the sidecar died under the flood: %v", s.exitErr())
	default:
	}
	mu.Lock()
	byStatus := map[int]int{}
	full := 0
	for _, o := range outcomes {
		byStatus[o.status]++
		if o.status == http.StatusServiceUnavailable && strings.Contains(o.body, "memory_budget_full") {
			full++
			g.Expect(o.retryAfter).To(MatchRegexp(`^[1-9][0-9]*$`), "a 503 of a full memory budget says when to retry")
		}
	}
	mu.Unlock()
	t.Logf("peak RSS %.1f MiB (%.1f MiB idle, limit %d MiB); answers by status %v, %d at the application; %d refused for memory",
		peak, idle, memoryLimit>>20, byStatus, started.Load(), full)
	g.Expect(full).To(BeNumerically(">", 0), "the requests the budget has no room for are refused")
	g.Expect(s.metric(t, "redline_sidecar_memory_budget_refusals_total")).To(BeNumerically("==", full), "and counted")
	g.Expect(peak).To(BeNumerically("<", memoryLimit>>20), "the sidecar stays under its container's memory limit")
}
