package redisconn

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"github.com/redis/go-redis/v9"

	"github.com/redline-dev/redline/internal/testutil/redistest"
)

// Under a burst of slow commands a client holds at most its pool: connections never exceed
// what the controller's connection budget counts for a pod. Measured on a real redis-server.
func TestPoolIsAHardBoundUnderABurst(t *testing.T) {
	g := NewWithT(t)
	srv, err := redistest.Start()
	g.Expect(err).NotTo(HaveOccurred(), "the test needs a real redis-server")
	t.Cleanup(func() { _ = srv.Close() })
	connected := serverStat(t, srv.URL(), "clients", "connected_clients")

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

// A client under bursty concurrent load keeps the connections it dialed: returning one to the
// pool while others are idle never closes it only to dial another for the next burst. Counted
// by the server (total_connections_received), so a redial cannot hide.
func TestPoolKeepsItsConnectionsUnderLoad(t *testing.T) {
	g := NewWithT(t)
	srv, err := redistest.Start()
	g.Expect(err).NotTo(HaveOccurred(), "the test needs a real redis-server")
	t.Cleanup(func() { _ = srv.Close() })
	received := serverStat(t, srv.URL(), "stats", "total_connections_received")

	const pool, bursts = 8, 40
	c, err := NewClient(srv.URL(), Options{PoolSize: pool, ReadTimeout: 2 * time.Second, PoolTimeout: 5 * time.Second})
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { _ = c.Close() })
	before := received()
	// Each burst holds all of the pool at once (a blocking call of 10ms each), then returns
	// all of it: the pool is wholly idle between bursts.
	for range bursts {
		var wg sync.WaitGroup
		for range pool {
			wg.Go(func() {
				// go-redis's BLPop rounds its timeout up to a second; Redis takes a fraction.
				if err := c.Do(context.Background(), "BLPOP", "nothing", "0.01").Err(); err != nil && err != redis.Nil {
					t.Errorf("BLPOP: %v", err)
				}
			})
		}
		wg.Wait()
	}
	dialed := received() - before
	t.Logf("%d bursts of %d calls on a pool of %d: %d connections dialed", bursts, pool, pool, dialed)
	g.Expect(dialed).To(BeNumerically("<=", pool), "a connection returned to the pool stays open for the next burst")
}

// serverStat returns a reader of one INFO field of the server at url, over a connection of its
// own (which the server counts).
func serverStat(t *testing.T, url, section, field string) func() int {
	t.Helper()
	admin, err := NewClient(url, Options{PoolSize: 1, ReadTimeout: 2 * time.Second})
	if err != nil {
		t.Fatalf("admin client: %v", err)
	}
	t.Cleanup(func() { _ = admin.Close() })
	return func() int {
		info, err := admin.Info(context.Background(), section).Result()
		if err != nil {
			t.Fatalf("INFO %s: %v", section, err)
		}
		for line := range strings.SplitSeq(info, "\r\n") {
			if v, ok := strings.CutPrefix(line, field+":"); ok {
				n, _ := strconv.Atoi(v)
				return n
			}
		}
		t.Fatalf("INFO %s has no %s", section, field)
		return -1
	}
}
