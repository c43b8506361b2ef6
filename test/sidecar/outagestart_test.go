package sidecar_test

import (
	"fmt"
	"io"
	"net/http"
	"strconv"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/redline-dev/redline/internal/sidecar/contract"
	"github.com/redline-dev/redline/internal/testutil/sidecartest"
)

// Pods started while Redis is down (an HPA scale-out during an outage) have heard no heartbeat
// of their replicas. Given the workload's replica count as the injector gives it (the
// variable set from the namespace's ConfigMap), LocalFallback divides the limit by it and the
// replicas together admit about the limit; without it each divides by one and admits the
// whole limit.
func TestPodsStartedDuringAnOutageShareTheLimit(t *testing.T) {
	const (
		replicas = 4
		limit    = 40
	)
	down := "redis://" + freePort(t) // nothing listens there, from the start
	up := newUpstream(t)

	admitted := func(t *testing.T, environ []string) int {
		g := NewWithT(t)
		e := newEnv(t, "web")
		e.write(t, sidecartest.Document(e.namespace, "p", "r", "web", limit, time.Hour, "x-key", contract.FailureModeLocalFallback))
		total := 0
		for i := range replicas {
			s := launch(t, binary, fmt.Sprintf("pod-%d", i), e, down, up.addr(), false, environ)
			waitForPolicy(t, g, s)
			for range limit {
				req, err := http.NewRequest(http.MethodGet, s.proxy+"/", nil)
				g.Expect(err).NotTo(HaveOccurred())
				req.Header.Set("X-Key", "client-a")
				resp, err := httpClient.Do(req)
				g.Expect(err).NotTo(HaveOccurred())
				_, _ = io.Copy(io.Discard, resp.Body)
				_ = resp.Body.Close()
				g.Expect(resp.StatusCode).To(BeElementOf(http.StatusOK, http.StatusTooManyRequests), "decided locally, never an error")
				if resp.StatusCode == http.StatusOK {
					total++
				}
			}
		}
		return total
	}

	t.Run("without the replica count each pod admits the whole limit", func(t *testing.T) {
		got := admitted(t, nil)
		t.Logf("%d pods started with Redis down, no replica count: %d admitted against a limit of %d", replicas, got, limit)
		NewWithT(t).Expect(got).To(Equal(replicas*limit), "divided by one")
	})
	t.Run("with the workload's replica count they admit the limit together", func(t *testing.T) {
		got := admitted(t, []string{contract.EnvFallbackReplicas + "=" + strconv.Itoa(replicas)})
		t.Logf("%d pods started with Redis down, %s=%d: %d admitted against a limit of %d", replicas, contract.EnvFallbackReplicas, replicas, got, limit)
		NewWithT(t).Expect(got).To(Equal(limit), "each admits its share, limit / replicas")
	})
}

// waitForPolicy waits until the sidecar has loaded the policies document: before it, every
// request is forwarded unlimited.
func waitForPolicy(t *testing.T, g Gomega, s *sidecar) {
	g.Eventually(func() float64 { return s.metric(t, "redline_sidecar_policies") }).WithTimeout(20*time.Second).WithPolling(20*time.Millisecond).Should(BeNumerically(">=", 1), "sidecar %s loads the policy", s.name)
}
