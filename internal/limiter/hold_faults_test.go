package limiter_test

import (
	"context"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/redline-dev/redline/internal/limiter"
	"github.com/redline-dev/redline/internal/redisconn"
	"github.com/redline-dev/redline/internal/testutil/redistest"
)

// startOwnRedis starts a redis-server for one test, which may flush or stop it.
func startOwnRedis(t *testing.T) *redistest.Server {
	t.Helper()
	srv, err := redistest.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	return srv
}

// Redis down: Reserve follows the failure mode. Open holds what was wanted, Closed refuses,
// LocalFallback holds what the local window affords, and settling such a hold gives the local
// window back what was not used.
func TestHoldFailureModes(t *testing.T) {
	g := NewWithT(t)
	srv := startOwnRedis(t)
	c, err := redisconn.NewClient(srv.URL(), redisconn.Options{DialTimeout: 200 * time.Millisecond,
		ReadTimeout: 500 * time.Millisecond, WriteTimeout: 500 * time.Millisecond, PoolTimeout: 500 * time.Millisecond})
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { _ = c.Close() })
	l := newLimiter(t, c, limiter.TestOptions{ReplicaID: limiter.NewReplicaID(), BreakerFailures: 2})
	ctx, key := context.Background(), uniqueKey(t)
	lim := func(m limiter.FailureMode) limiter.Limit {
		li := holdLimit(limiter.FixedWindow, 100)
		li.FailureMode = m
		return li
	}
	_, h, err := l.Reserve(ctx, key, lim(limiter.FailureModeClosed), 1, 10, time.Minute)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(h.Degraded).To(BeFalse())
	g.Expect(srv.Stop()).To(Succeed())

	_, err = l.Settle(ctx, h, 1)
	g.Expect(err).To(HaveOccurred(), "a settle Redis cannot answer fails; the hold stays counted")

	r, h, err := l.Reserve(ctx, key, lim(limiter.FailureModeOpen), 1, 60, time.Minute)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(r.Source).To(Equal(limiter.SourceFailOpen))
	g.Expect(h.Degraded).To(BeTrue())
	g.Expect(h.Units).To(Equal(int64(60)))
	g.Expect(l.Settle(ctx, h, 80)).To(Equal(limiter.Settled{}), "failing open counted nothing")

	r, h, err = l.Reserve(ctx, key, lim(limiter.FailureModeClosed), 1, 10, time.Minute)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(r.Allowed).To(BeFalse())
	g.Expect(r.Source).To(Equal(limiter.SourceFailClosed))
	g.Expect(h).To(BeNil())

	fb := lim(limiter.FailureModeLocalFallback)
	r, h, err = l.Reserve(ctx, key, fb, 10, 80, time.Minute)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(r.Source).To(Equal(limiter.SourceFallback))
	g.Expect(h.Units).To(Equal(int64(80)))
	_, none, err := l.Reserve(ctx, key, fb, 30, 50, time.Minute)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(none).To(BeNil(), "20 left locally, 30 needed")
	g.Expect(l.Settle(ctx, h, 10)).To(Equal(limiter.Settled{Returned: 70}))
	_, h, err = l.Reserve(ctx, key, fb, 30, 100, time.Minute)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(h.Units).To(Equal(int64(90)))
	g.Expect(l.Settle(ctx, h, 95)).To(Equal(limiter.Settled{Debt: 5}))
	_, none, err = l.Reserve(ctx, key, fb, 1, 1, time.Minute)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(none).To(BeNil(), "the local window is 5 past its share")
}
