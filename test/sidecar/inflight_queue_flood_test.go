package sidecar_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	. "github.com/onsi/gomega"
)

// The worst queue a tenant may write (10,000 waiters a key for 10 minutes) and a flood of 1,000
// clients, each on a key whose one slot a long request holds, against a sidecar at the
// injector's memory limit: the waiters hold at most half the proxy's connections (the rest are
// refused at once with 429, their connections left idle, so they can be closed for new ones),
// a request of another key is still served meanwhile, and the sidecar's peak RSS stays under
// the limit. Without the bound the waiters held every connection the proxy may open, and a
// request of any other key waited to be accepted until the flood's queue timeouts.
func TestQueueFloodLeavesRoomForOtherKeys(t *testing.T) {
	g := NewWithT(t)
	e := newEnv(t, "web")
	e.write(t, queueDocument(e.namespace, 1, 10_000, 10*time.Minute))
	up := newGauge(t)
	s := startWithEnv(t, "queued", e, up.Listener.Addr().String(), []string{fmt.Sprintf("REDLINE_MEMORY_LIMIT=%d", memoryLimit)})
	ctx := ctxTimeout(t, 5*time.Minute)
	const keys, flood = 20, 1000
	for i := range keys {
		resp, err := get(ctx, s.proxy+"/hold", fmt.Sprint("held-", i))
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(resp.StatusCode).To(Equal(http.StatusOK))
		_, err = bufio.NewReader(resp.Body).ReadString('\n')
		g.Expect(err).NotTo(HaveOccurred())
		t.Cleanup(func() { resp.Body.Close() })
	}

	var (
		mu      sync.Mutex
		open    []net.Conn
		refused atomic.Int64
		wg      sync.WaitGroup
	)
	t.Cleanup(func() {
		mu.Lock()
		for _, c := range open {
			_ = c.Close()
		}
		mu.Unlock()
		up.release()
		wg.Wait()
	})
	for i := range flood {
		wg.Go(func() {
			c, err := net.Dial("tcp", hostPort(s.proxy))
			if err != nil {
				return // the machine's own bound on connections: the flood is big enough
			}
			mu.Lock()
			open = append(open, c)
			mu.Unlock()
			if _, err := fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: app\r\nX-Key: held-%d\r\n\r\n", i%keys); err != nil {
				return
			}
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				return // closed by the test, or for a newer connection
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			if resp.StatusCode == http.StatusTooManyRequests {
				refused.Add(1)
			}
			// The connection stays open, idle: as a keep-alive client's would.
		})
	}
	queued := func() float64 { return s.metric(t, `redline_sidecar_in_flight_queued{policy="p",rule="slots"}`) }
	g.Eventually(refused.Load, 2*time.Minute, 50*time.Millisecond).Should(BeNumerically(">", flood/2),
		"waiters beyond the queue's share of the connections are refused at once")
	g.Expect(queued()).To(BeNumerically(">", 0), "the queue holds some")

	// Another key is still served while the flood waits.
	resp, err := get(ctx, s.proxy+"/", "free")
	g.Expect(err).NotTo(HaveOccurred())
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	g.Expect(resp.StatusCode).To(Equal(http.StatusOK))

	// At 64 MiB the proxy sizes itself for 315 connections: half the limit at its
	// --max-header-bytes (64 KiB) plus 40 KiB each.
	const maxConns = 315
	q := queued()
	t.Logf("%v waiting, %d refused at once, the proxy's bound %v connections, peak RSS %.1f MiB", q, refused.Load(), maxConns, vmHWMMiB(t, s.Pid()))
	g.Expect(q).To(BeNumerically("<=", maxConns/2), "the waiters hold at most half the proxy's connections")
	g.Expect(vmHWMMiB(t, s.Pid())).To(BeNumerically("<", memoryLimit>>20), "the sidecar's peak RSS stays under the container's limit")
}
