package limiter_test

import (
	"context"
	"maps"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/redline-dev/redline/internal/limiter"
)

// restoreRecorder is a limiter on a redis-server of its own, with what its OnRestore heard,
// by policy. Each case has its own: a restoration starts a re-assertion of every share, which
// would restore what a later flush took from an earlier case's keys.
func restoreRecorder(t *testing.T) (*limiter.Limiter, func(context.Context) error, func() map[string]int64) {
	t.Helper()
	srv := startOwnRedis(t)
	c := newClient(t, srv.URL())
	var mu sync.Mutex
	told := map[string]int64{}
	l := newLimiter(t, c, limiter.TestOptions{ReplicaID: limiter.NewReplicaID(), LeaseHorizon: -1,
		OnRestore: func(policy string, units int64) {
			mu.Lock()
			defer mu.Unlock()
			told[policy] += units
		}})
	flush := func(ctx context.Context) error { return c.FlushAll(ctx).Err() }
	return l, flush, func() map[string]int64 {
		mu.Lock()
		defer mu.Unlock()
		return maps.Clone(told)
	}
}

// What this replica's shares restore after Redis lost its counts is told to OnRestore by the
// Policy of the limit the units were granted under, a decision's and a hold's settle alike:
// the sidecar labels its restoration metrics with it, without reading keys back.
func TestOnRestoreNamesThePolicy(t *testing.T) {
	ctx := context.Background()
	t.Run("decision", func(t *testing.T) {
		g := NewWithT(t)
		l, flush, told := restoreRecorder(t)
		lim := limiter.Limit{Algorithm: limiter.FixedWindow, Requests: 100, Window: longWindow, Policy: "checkout"}
		key := uniqueKey(t)
		for range 3 {
			res, err := l.Allow(ctx, key, lim, 1)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(res.Allowed).To(BeTrue())
		}
		g.Expect(flush(ctx)).To(Succeed())
		res, err := l.Allow(ctx, key, lim, 1)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(res.Allowed).To(BeTrue())
		g.Expect(told()).To(Equal(map[string]int64{"checkout": 3}))
	})
	t.Run("settle", func(t *testing.T) {
		g := NewWithT(t)
		l, flush, told := restoreRecorder(t)
		lim := holdLimit(limiter.FixedWindow, 100)
		lim.Policy = "llm"
		_, h, err := l.Reserve(ctx, uniqueKey(t), lim, 1, 50, time.Minute)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(flush(ctx)).To(Succeed())
		_, err = l.Settle(ctx, h, 20)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(told()).To(Equal(map[string]int64{"llm": 50}))
	})
}
