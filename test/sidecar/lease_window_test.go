package sidecar_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/redline-dev/redline/internal/policydoc"
	"github.com/redline-dev/redline/internal/sidecar/checkapi"
	"github.com/redline-dev/redline/internal/testutil/sidecartest"
)

// postCheck asks s's decision API for one unit of key under rule p/r: a 200 with one result,
// or an error.
func postCheck(client *http.Client, s *sidecar, key string) (checkapi.Response, error) {
	body := `{"policy":"p","rule":"r","key":["` + key + `"]}`
	resp, err := client.Post(s.check+checkapi.Path, "application/json", bytes.NewBufferString(body))
	if err != nil {
		return checkapi.Response{}, err
	}
	defer resp.Body.Close()
	var d checkapi.Response
	if err := json.NewDecoder(resp.Body).Decode(&d); err != nil {
		return d, err
	}
	if resp.StatusCode != http.StatusOK || len(d.Results) != 1 {
		return d, fmt.Errorf("status %d with %d results", resp.StatusCode, len(d.Results))
	}
	return d, nil
}

// checkOne asks s for one unit of key and returns the decision.
func checkOne(t *testing.T, s *sidecar, key string) checkapi.Result {
	t.Helper()
	d, err := postCheck(httpClient, s, key)
	if err != nil {
		t.Fatalf("checking %s: %v", key, err)
	}
	return d.Results[0]
}

// A sidecar process paused (SIGSTOP) while it holds a lease, and resumed in the next window:
// the lease ended with the window its units were counted in, so its first decision asks Redis.
func TestPausedSidecarsLeaseEndsWithItsWindow(t *testing.T) {
	for _, alg := range []string{"FixedWindow", "SlidingWindowCounter"} {
		t.Run(alg, func(t *testing.T) {
			g := NewWithT(t)
			e := newEnv(t, "web")
			const w = 2 * time.Second
			// 2000 per window: leases of 100 units at most (a twentieth of the limit).
			e.write(t, sidecartest.DocumentAlgorithm(e.namespace, "p", "r", "web", 2000, w, "x-key", "Closed", alg))
			s := start(t, "paused", e, shared.URL(), "127.0.0.1:1", true, "--lease-horizon=30s")
			g.Eventually(func() float64 { return s.metric(t, `redline_sidecar_policy_replicas{policy="p"}`) }).
				WithTimeout(20 * time.Second).Should(BeNumerically("==", 1))
			key := fmt.Sprint("paused-", time.Now().UnixNano())
			// Decide one at a time until a fresh lease is granted (a Redis decision after lease
			// decisions), early in a window: the sidecar then holds its unspent units.
			next := time.Now().Truncate(w).Add(w + 10*time.Millisecond)
			time.Sleep(time.Until(next))
			leased := false
			for i := 0; ; i++ {
				g.Expect(i).To(BeNumerically("<", 1000), "a lease was granted")
				r := checkOne(t, s, key)
				g.Expect(r.Allowed).To(BeTrue())
				if r.Source == "lease" {
					leased = true
				} else if leased && r.Source == "redis" {
					break
				}
			}
			g.Expect(time.Since(next)).To(BeNumerically("<", w/2), "the lease was granted early in its window")
			g.Expect(s.Signal(syscall.SIGSTOP)).To(Succeed())
			time.Sleep(time.Until(next.Add(w + 100*time.Millisecond)))
			g.Expect(s.Signal(syscall.SIGCONT)).To(Succeed())
			r := checkOne(t, s, key)
			t.Logf("%s: first decision after a pause across the boundary came from %s", alg, r.Source)
			g.Expect(r.Source).To(Equal("redis"), "the lease ended with its window")
		})
	}
}

// floodUntil has callers goroutines per sidecar ask for key until stop is closed, and returns
// the admissions and the decisions that failed or came from a failure mode, with the first few
// of them told (an error, or the failure mode's source and the sidecar that answered).
func floodUntil(scs []*sidecar, callers int, key string, admitted *atomic.Int64, stop <-chan struct{}) (failed int64, told []string) {
	var f atomic.Int64
	var mu sync.Mutex
	tell := func(s *sidecar, d checkapi.Response, err error) {
		mu.Lock()
		defer mu.Unlock()
		if len(told) < 5 {
			if err != nil {
				told = append(told, fmt.Sprintf("%s: %v", s.name, err))
			} else {
				told = append(told, fmt.Sprintf("%s: %+v", s.name, d.Results[0]))
			}
		}
	}
	var wg sync.WaitGroup
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: callers}}
	defer client.CloseIdleConnections()
	for _, s := range scs {
		for range callers {
			wg.Go(func() {
				for {
					select {
					case <-stop:
						return
					default:
					}
					d, err := postCheck(client, s, key)
					if err != nil || strings.HasPrefix(d.Results[0].Source, "fail") {
						f.Add(1)
						tell(s, d, err)
						continue
					}
					if d.Allowed {
						admitted.Add(1)
					}
				}
			})
		}
	}
	wg.Wait()
	return f.Load(), told
}

// A reload under load, 5 sidecars x 32 callers on one key: lowered from 1,000 to 300 once 400
// were admitted, nothing more is admitted once the new limit is in force everywhere (a grant
// asked under 1,000 is not admitted under 300); with the algorithm changed between FixedWindow
// and SlidingWindowCounter after 400 of 1,000, the window admits the limit, counted once.
func TestReloadUnderLoadAcrossSidecars(t *testing.T) {
	cases := []struct {
		name               string
		fromAlg, toAlg     string
		from, to, reloadAt int64
	}{
		{"lowered/FixedWindow", "FixedWindow", "FixedWindow", 1000, 300, 400},
		{"lowered/SlidingWindowCounter", "SlidingWindowCounter", "SlidingWindowCounter", 1000, 300, 400},
		{"FixedWindow to SlidingWindowCounter", "FixedWindow", "SlidingWindowCounter", 1000, 1000, 400},
		{"SlidingWindowCounter to FixedWindow", "SlidingWindowCounter", "FixedWindow", 1000, 1000, 400},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			e := newEnv(t, "web")
			e.write(t, sidecartest.DocumentAlgorithm(e.namespace, "p", "r", "web", tc.from, 24*time.Hour, "x-key", "Closed", tc.fromAlg))
			var scs []*sidecar
			for i := range 5 {
				scs = append(scs, start(t, fmt.Sprint("reload-load-", i), e, shared.URL(), "127.0.0.1:1", true))
			}
			for _, s := range scs {
				g.Eventually(func() float64 { return s.metric(t, `redline_sidecar_policy_replicas{policy="p"}`) }).
					WithTimeout(20 * time.Second).Should(BeNumerically("==", 5))
			}
			key := fmt.Sprint("reload-load-", time.Now().UnixNano())
			var admitted atomic.Int64
			stop := make(chan struct{})
			var failed int64
			var told []string
			var wg sync.WaitGroup
			wg.Go(func() { failed, told = floodUntil(scs, 32, key, &admitted, stop) })
			g.Eventually(admitted.Load).WithTimeout(30 * time.Second).WithPolling(time.Millisecond).Should(BeNumerically(">=", tc.reloadAt))
			doc := sidecartest.DocumentAlgorithm(e.namespace, "p", "r", "web", tc.to, 24*time.Hour, "x-key", "Closed", tc.toAlg)
			parsed, err := policydoc.Parse(doc)
			g.Expect(err).NotTo(HaveOccurred())
			e.write(t, doc)
			at := admitted.Load()
			inForce := fmt.Sprintf(`redline_sidecar_config_info{hash=%q,namespace=%q}`, parsed.Hash, e.namespace)
			for _, s := range scs {
				g.Eventually(func() float64 { return s.metric(t, inForce) }).WithTimeout(20 * time.Second).Should(Equal(1.0))
			}
			everywhere := admitted.Load()
			time.Sleep(3 * time.Second)
			close(stop)
			wg.Wait()
			t.Logf("%s: reload at %d admitted, in force everywhere at %d; %d admitted in all (limit in force %d), %d failed",
				tc.name, at, everywhere, admitted.Load(), tc.to, failed)
			g.Expect(failed).To(BeZero(), "the first failures: %q", told)
			for _, s := range scs {
				// Redis lost nothing: a share restored is a lease's return taken for a loss. The
				// series appears with the first restoration (-1: absent).
				restored := s.metric(t, `redline_sidecar_restored_units_total{policy="p"}`)
				g.Expect(max(restored, 0)).To(BeZero(), "%s restored units Redis never lost", s.name)
			}
			if tc.to < tc.reloadAt {
				g.Expect(admitted.Load()).To(Equal(everywhere), "past the new limit, nothing more is admitted")
			} else {
				g.Expect(admitted.Load()).To(BeNumerically("<=", tc.to), "the window admits no more than the limit in force")
				g.Expect(admitted.Load()).To(BeNumerically(">=", tc.to*95/100))
			}
		})
	}
}
