package main_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/redline-dev/redline/internal/sidecar/checkapi"
	"github.com/redline-dev/redline/internal/sidecar/sidecartest"
)

// Leases across sidecar processes: n sidecars x 64 callers ask /v1/check for twice the limit,
// on one hot key and over 1,000 keys, for each algorithm that leases. The window (24h) outlasts
// the run, so the whole run is one window: admitted <= limit always, and >= 95% of it.
func TestLeasesAcrossSidecarProcesses(t *testing.T) {
	for _, alg := range []string{"FixedWindow", "SlidingWindowCounter"} {
		for _, n := range []int{3, 10} {
			t.Run(fmt.Sprintf("%s/%d sidecars", alg, n), func(t *testing.T) {
				e := newEnv(t, "web")
				doc := sidecartest.DocumentAlgorithm(e.namespace, "p", "r", "web", 2000, 24*time.Hour, "x-key", "Closed", alg)
				e.write(t, doc)
				var scs []*sidecar
				for i := range n {
					scs = append(scs, start(t, fmt.Sprint("lease-", i), e, shared.URL(), "127.0.0.1:1", true))
				}
				// Heartbeats tell every sidecar how many share the policy, which sizes leases.
				for _, s := range scs {
					NewWithT(t).Eventually(func() float64 { return s.metric(t, `redline_sidecar_policy_replicas{policy="p"}`) }).
						WithTimeout(20 * time.Second).Should(BeNumerically("==", n))
				}

				t.Run("one hot key", func(t *testing.T) {
					g := NewWithT(t)
					key := fmt.Sprint("hot-", time.Now().UnixNano())
					admitted, failed := checkFlood(scs, 64, 4000, func(int) string { return key })
					g.Expect(failed).To(BeZero())
					t.Logf("%s, %d sidecars x 64 callers, one key: admitted %d of 2000 (4000 asked)", alg, n, admitted[key])
					g.Expect(admitted[key]).To(BeNumerically("<=", 2000))
					g.Expect(admitted[key]).To(BeNumerically(">=", 1900))
				})
				t.Run("1000 keys under the limit", func(t *testing.T) {
					// Leases never refuse what the limit admits: 8 requests on each of 1000 keys
					// of 2000 all pass. (TestLeasesOverManyKeysAcrossSidecars asks 1000 keys for
					// twice their limit.)
					g := NewWithT(t)
					prefix := fmt.Sprint("many-", time.Now().UnixNano(), "-")
					admitted, failed := checkFlood(scs, 64, 8000, func(i int) string { return fmt.Sprint(prefix, i%1000) })
					g.Expect(failed).To(BeZero())
					var sum int64
					for _, a := range admitted {
						g.Expect(a).To(BeNumerically("<=", 2000))
						sum += a
					}
					t.Logf("%s, %d sidecars, 1000 keys under their limit: admitted %d of 8000", alg, n, sum)
					g.Expect(sum).To(Equal(int64(8000)), "under the limit every request passes")
				})
			})
		}
	}
}

// Over 1,000 keys each asked for twice its limit of 20, across sidecar processes.
func TestLeasesOverManyKeysAcrossSidecars(t *testing.T) {
	for _, alg := range []string{"FixedWindow", "SlidingWindowCounter"} {
		for _, n := range []int{3, 10} {
			t.Run(fmt.Sprintf("%s/%d sidecars", alg, n), func(t *testing.T) {
				g := NewWithT(t)
				e := newEnv(t, "web")
				e.write(t, sidecartest.DocumentAlgorithm(e.namespace, "p", "r", "web", 20, 24*time.Hour, "x-key", "Closed", alg))
				var scs []*sidecar
				for i := range n {
					scs = append(scs, start(t, fmt.Sprint("keys-", i), e, shared.URL(), "127.0.0.1:1", true))
				}
				prefix := fmt.Sprint("k-", time.Now().UnixNano(), "-")
				admitted, failed := checkFlood(scs, 64, 40000, func(i int) string { return fmt.Sprint(prefix, i%1000) })
				g.Expect(failed).To(BeZero())
				var sum int64
				for _, a := range admitted {
					g.Expect(a).To(BeNumerically("<=", 20))
					sum += a
				}
				t.Logf("%s, %d sidecars x 64 callers, 1000 keys of 20: admitted %d of 20000 (40000 asked)", alg, n, sum)
				g.Expect(sum).To(BeNumerically(">=", 19000))
				var leased float64
				for _, s := range scs {
					leased += s.metric(t, "redline_sidecar_lease_decisions_total")
				}
				t.Logf("decisions from leases: %.0f", leased)
			})
		}
	}
}

// checkFlood sends total checks round-robin over the sidecars from callers goroutines per
// sidecar, the i-th on keyOf(i), and counts admissions per key.
func checkFlood(scs []*sidecar, callers, total int, keyOf func(int) string) (map[string]int64, int64) {
	var (
		mu       sync.Mutex
		admitted = map[string]int64{}
		failed   atomic.Int64
		next     atomic.Int64
		wg       sync.WaitGroup
	)
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: callers}}
	defer client.CloseIdleConnections()
	for _, s := range scs {
		for range callers {
			wg.Go(func() {
				for {
					i := int(next.Add(1) - 1)
					if i >= total {
						return
					}
					key := keyOf(i)
					body := `{"policy":"p","rule":"r","key":["` + key + `"]}`
					resp, err := client.Post(s.check+checkapi.Path, "application/json", bytes.NewBufferString(body))
					if err != nil {
						failed.Add(1)
						continue
					}
					var d checkapi.Response
					err = json.NewDecoder(resp.Body).Decode(&d)
					resp.Body.Close()
					if err != nil || resp.StatusCode != http.StatusOK || len(d.Results) != 1 ||
						strings.HasPrefix(d.Results[0].Source, "fail") {
						failed.Add(1)
						continue
					}
					if d.Allowed {
						mu.Lock()
						admitted[key]++
						mu.Unlock()
					}
				}
			})
		}
	}
	wg.Wait()
	return admitted, failed.Load()
}
