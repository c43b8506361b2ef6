package redisconn

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/redline-dev/redline/internal/testutil/redistest"
)

// Under a burst of slow commands a client holds at most its pool: connections never exceed
// what the controller's connection budget counts for a pod. Measured on a real redis-server.
func TestPoolIsAHardBoundUnderABurst(t *testing.T) {
	g := NewWithT(t)
	srv, err := redistest.Start()
	g.Expect(err).NotTo(HaveOccurred(), "the test needs a real redis-server")
	t.Cleanup(func() { _ = srv.Close() })
	admin, err := NewClient(srv.URL(), Options{PoolSize: 1, ReadTimeout: 2 * time.Second})
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { _ = admin.Close() })
	connected := func() int {
		info, err := admin.Info(context.Background(), "clients").Result()
		g.Expect(err).NotTo(HaveOccurred())
		for line := range strings.SplitSeq(info, "\r\n") {
			if v, ok := strings.CutPrefix(line, "connected_clients:"); ok {
				n, _ := strconv.Atoi(v)
				return n
			}
		}
		return -1
	}

	const pool = 3
	c, err := NewClient(srv.URL(), Options{PoolSize: pool, ReadTimeout: 2 * time.Second, PoolTimeout: 5 * time.Second})
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { _ = c.Close() })
	var wg sync.WaitGroup
	for range 20 {
		wg.Go(func() { _ = c.BLPop(context.Background(), 300*time.Millisecond, "nothing").Err() })
	}
	peak := 0
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	for waiting := true; waiting; {
		peak = max(peak, connected())
		select {
		case <-done:
			waiting = false
		case <-time.After(20 * time.Millisecond):
		}
	}
	t.Logf("peak connected clients during a burst of 20 blocking calls: %d (pool %d, plus this test's own)", peak, pool)
	g.Expect(peak).To(BeNumerically("<=", pool+1), "the pool plus the admin connection")
	g.Expect(peak).To(BeNumerically(">=", 2), "the burst did use the pool")
}
