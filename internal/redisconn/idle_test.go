package redisconn

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"github.com/redis/go-redis/v9"

	"github.com/redline-dev/redline/internal/testutil/redistest"
)

// clientsNamed counts the connections Redis holds for clients named name (CLIENT LIST).
func clientsNamed(g Gomega, admin redis.UniversalClient, name string) int {
	list, err := admin.ClientList(context.Background()).Result()
	g.Expect(err).NotTo(HaveOccurred())
	n := 0
	for line := range strings.SplitSeq(list, "\n") {
		if strings.Contains(line, " name="+name+" ") {
			n++
		}
	}
	return n
}

// burst runs n blocking calls at once, so that the client opens as many connections as its
// pool lets it.
func burst(g Gomega, c redis.UniversalClient, n int) {
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for range n {
		wg.Go(func() { errs <- c.Do(context.Background(), "blpop", "nothing", "0.2").Err() })
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		g.Expect(err).To(MatchError(redis.Nil), "a blocking call times out empty, it does not fail")
	}
}

// A client opens connections only when a call needs one, keeps at most MaxIdleConns after a
// burst, and closes the idle ones after ConnMaxIdleTime, whether it is quiet or keeps reusing
// one connection (a sidecar's heartbeat); calls after that still succeed. Counted by Redis.
func TestIdleConnectionsClose(t *testing.T) {
	srv, err := redistest.Start()
	NewWithT(t).Expect(err).NotTo(HaveOccurred(), "the test needs a real redis-server")
	t.Cleanup(func() { _ = srv.Close() })
	admin, err := NewClient(srv.URL(), Options{PoolSize: 1, ReadTimeout: 2 * time.Second, ClientName: "admin"})
	NewWithT(t).Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { _ = admin.Close() })

	const pool, maxIdle, idleTime = 8, 3, 300 * time.Millisecond
	for _, tc := range []struct {
		name  string
		every time.Duration // a call this often during the idle period; 0: none
		rest  int           // connections held at rest
	}{
		{name: "quiet", rest: 0},
		{name: "heartbeat", every: 50 * time.Millisecond, rest: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			name := "idle-" + tc.name
			stats := &ConnStats{}
			c, err := NewClient(srv.URL(), Options{
				PoolSize: pool, MaxIdleConns: maxIdle, ConnMaxIdleTime: idleTime, ClientName: name, Stats: stats,
				ReadTimeout: 2 * time.Second, PoolTimeout: 5 * time.Second,
			})
			g.Expect(err).NotTo(HaveOccurred())
			t.Cleanup(func() { _ = c.Close() })

			g.Consistently(func(g Gomega) int { return clientsNamed(g, admin, name) }).
				WithTimeout(200*time.Millisecond).Should(BeZero(), "no connection before the first call")

			burst(g, c, 20)
			g.Expect(stats.Dialed()).To(BeNumerically(">=", pool), "the burst used the whole pool")
			openAfter := stats.Open()
			g.Expect(openAfter).To(BeNumerically("<=", maxIdle), "the client keeps at most max idle")
			// Redis sees a socket the client closed once its event loop reads the close: on a
			// loaded machine, a moment after the burst.
			var after int
			g.Eventually(func(g Gomega) int { after = clientsNamed(g, admin, name); return after }).
				WithTimeout(5 * time.Second).Should(BeNumerically("<=", maxIdle))
			t.Logf("%s: after a burst of 20 on a pool of %d: %d connections (max idle %d)", tc.name, pool, after, maxIdle)

			stop := make(chan struct{})
			var wg sync.WaitGroup
			var pingErr error
			if tc.every > 0 {
				wg.Go(func() {
					for {
						select {
						case <-stop:
							return
						case <-time.After(tc.every):
							if err := c.Ping(context.Background()).Err(); err != nil && pingErr == nil {
								pingErr = err
							}
						}
					}
				})
			}
			g.Eventually(func(g Gomega) int { return clientsNamed(g, admin, name) }).
				WithTimeout(5*time.Second).WithPolling(50*time.Millisecond).Should(Equal(tc.rest), "idle connections closed")
			g.Consistently(func(g Gomega) int { return clientsNamed(g, admin, name) }).
				WithTimeout(2*idleTime).WithPolling(50*time.Millisecond).Should(Equal(tc.rest), "and stay closed")
			close(stop)
			wg.Wait()
			g.Expect(pingErr).NotTo(HaveOccurred(), "a call on the connection kept is never cut")
			t.Logf("%s: sockets open %d, dialed %d, reaped %d; go-redis pool %+v", tc.name, stats.Open(), stats.Dialed(), stats.Reaped(), *c.PoolStats())
			g.Expect(stats.Open()).To(BeNumerically("==", tc.rest))
			if tc.every == 0 {
				// go-redis looks at an idle connection only when a call takes it: these were
				// closed by the reaper or by nothing. At least those open after the burst (on a
				// starved machine the reaper may have closed some before they were counted), and
				// never more than the pool kept idle.
				g.Expect(stats.Reaped()).To(And(BeNumerically(">=", openAfter), BeNumerically("<=", maxIdle)))
			}

			// The pool still holds the closed ones; calls skip them.
			for range 5 {
				g.Expect(c.Ping(context.Background()).Err()).To(Succeed())
			}
			burst(g, c, 20)
		})
	}
}
