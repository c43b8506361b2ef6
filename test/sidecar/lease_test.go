package sidecar_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/redline-dev/redline/internal/keyscheme"
	"github.com/redline-dev/redline/internal/redisconn"
	"github.com/redline-dev/redline/internal/testutil/redistest"
	"github.com/redline-dev/redline/internal/testutil/sidecartest"
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
					d, err := postCheck(client, s, key)
					if err != nil || strings.HasPrefix(d.Results[0].Source, "fail") {
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

// A reload that lowers the limit while sidecars hold leases granted under the old one: those
// leases are not admitted under the new limit, so the window never admits more than the limit
// now in force.
func TestLeasesAndALowerLimitOnReload(t *testing.T) {
	for _, alg := range []string{"FixedWindow", "SlidingWindowCounter"} {
		t.Run(alg, func(t *testing.T) {
			g := NewWithT(t)
			e := newEnv(t, "web")
			e.write(t, sidecartest.DocumentAlgorithm(e.namespace, "p", "r", "web", 1000, 24*time.Hour, "x-key", "Closed", alg))
			var scs []*sidecar
			for i := range 3 {
				scs = append(scs, start(t, fmt.Sprint("reload-", i), e, shared.URL(), "127.0.0.1:1", true))
			}
			key := fmt.Sprint("reload-", time.Now().UnixNano())
			before, failed := checkFlood(scs, 8, 390, func(int) string { return key })
			g.Expect(failed).To(BeZero())
			g.Expect(before[key]).To(Equal(int64(390)), "under 1000 every request passes")
			leased := 0.0
			for _, s := range scs {
				leased += s.metric(t, "redline_sidecar_lease_decisions_total")
			}
			g.Expect(leased).To(BeNumerically(">", 0), "the sidecars admitted from leases, and hold some")

			e.write(t, sidecartest.DocumentAlgorithm(e.namespace, "p", "r", "web", 400, 24*time.Hour, "x-key", "Closed", alg))
			for _, s := range scs {
				g.Eventually(func() int64 { return limitInForce(s, "p", "r") }).WithTimeout(20 * time.Second).Should(Equal(int64(400)))
			}
			after, failed := checkFlood(scs, 64, 2000, func(int) string { return key })
			g.Expect(failed).To(BeZero())
			t.Logf("%s: 390 admitted under 1000, then %d under 400", alg, after[key])
			g.Expect(before[key]+after[key]).To(BeNumerically("<=", 400), "no window admits more than the limit in force")
		})
	}
}

// Redis killed while sidecars hold leases: they admit what they hold (counted already), then
// the failure mode (Closed) refuses; when Redis is back, the shared counter decides again.
func TestLeasesWhileRedisIsKilled(t *testing.T) {
	g := NewWithT(t)
	srv, err := redistest.Start()
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { _ = srv.Close() })
	e := newEnv(t, "web")
	e.write(t, sidecartest.DocumentAlgorithm(e.namespace, "p", "r", "web", 1000, 24*time.Hour, "x-key", "Closed", "FixedWindow"))
	var scs []*sidecar
	for i := range 3 {
		scs = append(scs, start(t, fmt.Sprint("kill-", i), e, srv.URL(), "127.0.0.1:1", true, "--lease-horizon=30s"))
	}
	key := fmt.Sprint("kill-", time.Now().UnixNano())
	warm, failed := checkFlood(scs, 8, 300, func(int) string { return key })
	g.Expect(failed).To(BeZero())
	g.Expect(warm[key]).To(Equal(int64(300)))
	counted, err := redisCounter(srv.URL(), keyscheme.Key(e.namespace, "p", "r", key)+":swc")
	g.Expect(err).NotTo(HaveOccurred())

	g.Expect(srv.Stop()).To(Succeed())
	down, refused := checkFloodSources(scs, 8, 2000, key)
	t.Logf("Redis down: %d admitted from leases held (%d units were counted), %d refused by the failure mode", down, counted-300, refused)
	g.Expect(300+down).To(BeNumerically("<=", counted), "only units counted in Redis before it died are admitted")
	g.Expect(refused).To(BeNumerically(">", 0), "then the failure mode refuses")

	g.Expect(srv.Start()).To(Succeed())
	g.Eventually(func() int64 {
		admitted, _ := checkFlood(scs, 1, 3, func(int) string { return key })
		return admitted[key]
	}).WithTimeout(30*time.Second).WithPolling(200*time.Millisecond).Should(BeNumerically(">", 0), "Redis decides again once it is back")
}

// redisCounter reads the current window's count of a FixedWindow or SlidingWindowCounter.
func redisCounter(url, stateKey string) (int64, error) {
	c, err := redisconn.NewClient(url, redisconn.Options{})
	if err != nil {
		return 0, err
	}
	defer c.Close()
	return c.HGet(context.Background(), stateKey, "c").Int64()
}

// checkFloodSources sends total checks on key and counts admissions and failure-mode refusals.
func checkFloodSources(scs []*sidecar, callers, total int, key string) (admitted, failClosed int64) {
	var a, f, next atomic.Int64
	var wg sync.WaitGroup
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: callers}}
	defer client.CloseIdleConnections()
	for _, s := range scs {
		for range callers {
			wg.Go(func() {
				for next.Add(1) <= int64(total) {
					d, err := postCheck(client, s, key)
					if err != nil {
						continue
					}
					switch {
					case d.Allowed:
						a.Add(1)
					case d.Results[0].Source == "failclosed":
						f.Add(1)
					}
				}
			})
		}
	}
	wg.Wait()
	return a.Load(), f.Load()
}

// --lease-keys bounds the lease table, and so the sidecar's memory for leases: with more hot
// keys than it holds, the rest ask Redis per decision and every request is still decided.
func TestLeaseKeysBoundTheLeaseTable(t *testing.T) {
	g := NewWithT(t)
	e := newEnv(t, "web")
	e.write(t, sidecartest.DocumentAlgorithm(e.namespace, "p", "r", "web", 1_000_000, 24*time.Hour, "x-key", "Closed", "FixedWindow"))
	s := start(t, "lease-keys", e, shared.URL(), "127.0.0.1:1", true, "--lease-keys=8")
	prefix := fmt.Sprint("k-", time.Now().UnixNano(), "-")
	admitted, failed := checkFlood([]*sidecar{s}, 16, 1000, func(i int) string { return fmt.Sprint(prefix, i%100) })
	g.Expect(failed).To(BeZero())
	var sum int64
	for _, a := range admitted {
		sum += a
	}
	g.Expect(sum).To(Equal(int64(1000)), "under the limit every request passes")
	keys := s.metric(t, "redline_sidecar_lease_keys")
	t.Logf("100 hot keys, --lease-keys=8: %.0f keys in the lease table", keys)
	g.Expect(keys).To(And(BeNumerically(">", 0), BeNumerically("<=", 8)))
}
