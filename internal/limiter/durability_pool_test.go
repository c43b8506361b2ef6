package limiter_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/redline-dev/redline/internal/limiter"
	"github.com/redline-dev/redline/internal/redisconn"
)

// Waits for a replica that is not there hold their connections for the whole timeout. More
// durable callers than the pool has connections must not take them all: the rules that wait
// for nothing keep deciding on Redis instead of waiting for a connection, timing out and
// tripping the breaker into their failure mode. Waits beyond a quarter of the pool go without
// their wait, counted busy.
func TestDurableWaitsLeaveThePoolToOtherRules(t *testing.T) {
	g := NewWithT(t)
	srv := startServer(t) // no replica: every WAIT 1 waits its whole timeout
	opts := testClientOptions
	opts.PoolSize, opts.PoolTimeout = 16, time.Second
	c, err := redisconn.NewClient(srv.URL(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	exactWindow(t, c, durableLimit.Window, 30*time.Minute)
	l := newLimiter(t, c, limiter.TestOptions{})
	durable := durableLimit
	durable.Durability = limiter.Durability{Mode: limiter.DurabilityReplica, Timeout: limiter.MaxDurabilityTimeout}
	plain := durableLimit
	plain.FailureMode = limiter.FailureModeClosed

	const callers = 40
	var wg sync.WaitGroup
	for range callers {
		wg.Go(func() {
			r, err := l.Allow(context.Background(), uniqueKey(t), durable, 1)
			if err != nil || !r.Allowed {
				t.Errorf("durable grant: %+v, %v", r, err)
			}
		})
	}
	admin := srv.Client("")
	defer admin.Close()
	g.Eventually(func() int { // the waits are in Redis, holding their connections
		list, err := admin.ClientList(context.Background()).Result()
		if err != nil {
			return 0
		}
		return strings.Count(list, "cmd=wait ")
	}, time.Minute, 10*time.Millisecond).Should(BeNumerically(">=", 1))
	for i := range 35 {
		r, err := l.Allow(context.Background(), uniqueKey(t), plain, 1)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(r.Source).To(Equal(limiter.SourceRedis), "plain decision %d while the waits ran: %+v", i, r)
	}
	wg.Wait()
	st := l.Stats()
	g.Expect(st.Unacked.Busy).To(BeNumerically(">", 0), "the waits beyond the bound went without one")
	g.Expect(st.Unacked.Busy+st.Unacked.Timeout).To(BeEquivalentTo(callers), "every durable grant stood, counted once")
}
