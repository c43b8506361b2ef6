package sidecar_test

import (
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/redline-dev/redline/internal/testutil/redistest"
	"github.com/redline-dev/redline/internal/testutil/sidecartest"
)

// load sends requests through one sidecar until stopped and records the statuses.
type load struct {
	s        *sidecar
	mu       sync.Mutex
	statuses []int
	n        atomic.Int64
	stop     chan struct{}
	once     sync.Once
	done     chan struct{}
}

func startLoad(t *testing.T, s *sidecar, key string) *load {
	l := &load{s: s, stop: make(chan struct{}), done: make(chan struct{})}
	t.Cleanup(func() { l.halt() }) // a failed assertion must not leave it logging after the test
	go func() {
		defer close(l.done)
		for {
			select {
			case <-l.stop:
				return
			default:
			}
			req, _ := http.NewRequest(http.MethodGet, s.proxy+"/", nil)
			req.Header.Set("X-Key", key)
			code := 0
			if resp, err := httpClient.Do(req); err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				code = resp.StatusCode
			} else {
				t.Logf("request through %s failed: %v", s.name, err)
			}
			l.mu.Lock()
			l.statuses = append(l.statuses, code)
			l.mu.Unlock()
			l.n.Add(1)
			time.Sleep(2 * time.Millisecond)
		}
	}()
	return l
}

func (l *load) waitFor(g Gomega, n int64) {
	target := l.n.Load() + n
	g.Eventually(l.n.Load).WithTimeout(30*time.Second).WithPolling(10*time.Millisecond).
		Should(BeNumerically(">=", target), "%s answers %d more requests", l.s.name, n)
}

func (l *load) halt() []int {
	l.once.Do(func() { close(l.stop) })
	<-l.done
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.statuses
}

// Redis is killed while requests flow: each failure mode answers as documented, the proxy never
// answers 5xx, and shared counting resumes when Redis is back.
func TestRedisKilledDuringLoad(t *testing.T) {
	g := NewWithT(t)
	srv, err := redistest.Start()
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { _ = srv.Close() })
	e := newEnv(t, "web")
	e.write(t, sidecartest.Document(e.namespace, "p", "r", "web", 100000, time.Minute, "x-key", "LocalFallback"))
	up := newUpstream(t)
	modes := []string{"Open", "Closed", "LocalFallback"}
	loads := map[string]*load{}
	for _, m := range modes {
		s := start(t, "pod-"+m, e, srv.URL(), up.addr(), true, "--failure-mode="+m, "--redis-timeout=250ms")
		loads[m] = startLoad(t, s, fmt.Sprint("key-", m))
	}
	for _, m := range modes {
		loads[m].waitFor(g, 20)
	}
	before := map[string]int{}
	for _, m := range modes {
		loads[m].mu.Lock()
		before[m] = len(loads[m].statuses)
		loads[m].mu.Unlock()
	}

	g.Expect(srv.Stop()).To(Succeed())
	for _, m := range modes {
		loads[m].waitFor(g, 60)
	}
	for _, m := range modes {
		s := loads[m].s
		g.Eventually(func() float64 { return s.metric(t, "redline_sidecar_breaker_open") }).
			WithTimeout(10*time.Second).WithPolling(20*time.Millisecond).Should(Equal(1.0), "%s: breaker opens", m)
	}
	g.Expect(loads["LocalFallback"].s.metric(t, "redline_sidecar_fallback_active")).To(Equal(1.0))
	g.Expect(loads["Open"].s.metric(t, "redline_sidecar_fallback_active")).To(Equal(0.0))
	loads["Closed"].waitFor(g, 10)

	g.Expect(srv.Start()).To(Succeed())
	// Closed admits again once the breaker lets a probe through and Redis answers.
	closed := loads["Closed"]
	g.Eventually(func() int {
		closed.mu.Lock()
		defer closed.mu.Unlock()
		return closed.statuses[len(closed.statuses)-1]
	}).WithTimeout(20*time.Second).WithPolling(20*time.Millisecond).Should(Equal(http.StatusOK), "shared counting resumes")

	for _, m := range modes {
		all := loads[m].halt()
		counts := map[int]int{}
		for _, c := range all {
			counts[c]++
		}
		t.Logf("%s: statuses %v (before the kill: %d)", m, counts, before[m])
		for c := range counts {
			g.Expect(c).To(BeNumerically("<", 500), "%s: no 5xx from the proxy (and no transport errors)", m)
			g.Expect(c).NotTo(BeZero(), "%s: every request answered", m)
		}
		for _, c := range all[:before[m]] {
			g.Expect(c).To(Equal(http.StatusOK), "%s: admitted while Redis is up", m)
		}
		switch m {
		case "Open", "LocalFallback":
			g.Expect(counts).To(Equal(map[int]int{http.StatusOK: len(all)}), "%s admits throughout", m)
		case "Closed":
			g.Expect(counts[http.StatusTooManyRequests]).To(BeNumerically(">=", 60), "Closed refuses while Redis is down")
		}
	}
}
