package limiter_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/redline-dev/redline/internal/fleet"
	"github.com/redline-dev/redline/internal/limiter"
	"github.com/redline-dev/redline/internal/limiter/scripts"
	"github.com/redline-dev/redline/internal/redisconn"
	"github.com/redline-dev/redline/internal/testutil/redistest"
)

// Refused traffic past the limit costs no Redis call until the retry-after has passed.
func TestPrecheckRefusesWithoutRedis(t *testing.T) {
	g := NewWithT(t)
	c := newClient(t, shared.URL())
	hook := &evalCounter{}
	c.AddHook(hook)
	_, err := scripts.Load(context.Background(), c) // as the manager does
	g.Expect(err).NotTo(HaveOccurred())
	l := newLimiter(t, c, limiter.TestOptions{})
	key := uniqueKey(t)
	lim := exactLimit(limiter.FixedWindow, 5)

	admitted := 0
	for range 105 {
		r, err := l.Allow(context.Background(), key, lim, 1)
		g.Expect(err).NotTo(HaveOccurred())
		if r.Allowed {
			admitted++
			continue
		}
		g.Expect(r.RetryAfter).To(BeNumerically(">", 0))
	}
	g.Expect(admitted).To(Equal(5))
	g.Expect(hook.n.Load()).To(Equal(int64(6)), "5 admissions and the first refusal reach Redis, the other 99 refusals do not")
	g.Expect(l.Stats().PrecheckRefusals).To(Equal(uint64(99)))

	// A refusal for a large cost says nothing about a smaller one.
	key2 := uniqueKey(t)
	lim2 := exactLimit(limiter.FixedWindow, 10)
	r, _ := l.Allow(context.Background(), key2, lim2, 8)
	g.Expect(r.Allowed).To(BeTrue())
	r, _ = l.Allow(context.Background(), key2, lim2, 5)
	g.Expect(r.Allowed).To(BeFalse())
	g.Expect(r.Source).To(Equal(limiter.SourceRedis))
	r, _ = l.Allow(context.Background(), key2, lim2, 2)
	g.Expect(r.Allowed).To(BeTrue(), "cost 2 still fits after cost 5 was refused")
	g.Expect(r.Source).To(Equal(limiter.SourceRedis))
}

// The pre-check holds at most PrecheckSize keys, so a flood of distinct keys cannot grow it.
func TestPrecheckIsBounded(t *testing.T) {
	g := NewWithT(t)
	c := newClient(t, shared.URL())
	hook := &evalCounter{}
	c.AddHook(hook)
	_, err := scripts.Load(context.Background(), c)
	g.Expect(err).NotTo(HaveOccurred())
	l := newLimiter(t, c, limiter.TestOptions{PrecheckSize: 10})
	lim := exactLimit(limiter.TokenBucket, 1)
	keys := make([]string, 50)
	for i := range keys {
		keys[i] = uniqueKey(t)
		_, _ = l.Allow(context.Background(), keys[i], lim, 1) // admitted
		_, _ = l.Allow(context.Background(), keys[i], lim, 1) // refused, remembered
	}
	before := hook.n.Load()
	local := 0
	for _, key := range slices.Backward(keys) { // newest first, before misses evict them
		r, _ := l.Allow(context.Background(), key, lim, 1)
		g.Expect(r.Allowed).To(BeFalse())
		if r.Source == limiter.SourcePrecheck {
			local++
		}
	}
	g.Expect(local).To(Equal(10), "only the 10 most recent refusals are remembered")
	g.Expect(hook.n.Load() - before).To(Equal(int64(40)))
}

func TestShadowModeCountsButAdmits(t *testing.T) {
	g := NewWithT(t)
	l := direct(t)
	key := uniqueKey(t)
	lim := exactLimit(limiter.SlidingWindowCounter, 3)
	lim.Shadow = true
	over := 0
	for range 10 {
		r, err := l.Allow(context.Background(), key, lim, 1)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(r.Allowed).To(BeTrue())
		if r.OverLimit {
			over++
		}
	}
	g.Expect(over).To(Equal(7))
}

// Redis killed mid-run: the breaker opens within a bounded number of decisions, each failure
// mode decides as specified, and when Redis is back the shared counter decides again.
func TestRedisDown(t *testing.T) {
	g := NewWithT(t)
	srv, err := redistest.Start()
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { _ = srv.Close() })

	fast := redisconn.Options{
		DialTimeout: 200 * time.Millisecond, ReadTimeout: 500 * time.Millisecond,
		WriteTimeout: 500 * time.Millisecond, PoolTimeout: 500 * time.Millisecond,
	}
	const replicas, failures = 4, 3
	var ls []*limiter.Limiter
	var live int64
	for i := range replicas {
		c, err := redisconn.NewClient(srv.URL(), fast)
		g.Expect(err).NotTo(HaveOccurred())
		t.Cleanup(func() { _ = c.Close() })
		l := newLimiter(t, c, limiter.TestOptions{
			BreakerFailures: failures,
			BreakerOpenFor:  300 * time.Millisecond,
		})
		ls = append(ls, l)
		// Each replica announces itself as the sidecar does; the last announcement sees them all.
		counts, err := fleet.Announce(context.Background(), c, "shop", fmt.Sprint("pod-", i), "cfg", time.Minute, []string{"checkout"})
		g.Expect(err).NotTo(HaveOccurred())
		live = counts[0]
	}
	g.Expect(live).To(Equal(int64(replicas)))
	l := ls[0]

	lim := func(alg limiter.Algorithm, mode limiter.FailureMode) limiter.Limit {
		li := exactLimit(alg, 100)
		li.FailureMode = mode
		li.Replicas = live // what the sidecar passes for the policy's group
		return li
	}
	r, err := l.Allow(context.Background(), uniqueKey(t), lim(limiter.FixedWindow, limiter.FailureModeOpen), 1)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(r.Source).To(Equal(limiter.SourceRedis))

	g.Expect(srv.Stop()).To(Succeed())

	attempts := 0
	for {
		r, err := l.Allow(context.Background(), uniqueKey(t), lim(limiter.FixedWindow, limiter.FailureModeOpen), 1)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(r.Allowed).To(BeTrue())
		g.Expect(r.Source).To(Equal(limiter.SourceFailOpen))
		g.Expect(r.Err).To(HaveOccurred())
		if errors.Is(r.Err, limiter.ErrCircuitOpen) {
			break
		}
		attempts++
		g.Expect(attempts).To(BeNumerically("<=", failures), "the breaker must open after %d failed calls", failures)
	}
	g.Expect(l.Stats().BreakerOpen).To(BeTrue())
	g.Expect(l.Stats().Shards).To(Equal([]limiter.ShardState{{Name: "all", Open: true}}), "a standalone Redis is one shard")

	r, _ = l.Allow(context.Background(), uniqueKey(t), lim(limiter.TokenBucket, limiter.FailureModeClosed), 1)
	g.Expect(r.Allowed).To(BeFalse())
	g.Expect(r.Source).To(Equal(limiter.SourceFailClosed))
	g.Expect(r.RetryAfter).To(BeNumerically(">", 0))

	shadow := lim(limiter.TokenBucket, limiter.FailureModeClosed)
	shadow.Shadow = true
	r, _ = l.Allow(context.Background(), uniqueKey(t), shadow, 1)
	g.Expect(r.Allowed).To(BeTrue(), "shadow mode admits even when failing closed")
	g.Expect(r.OverLimit).To(BeTrue())

	for _, alg := range limiter.Algorithms {
		key := uniqueKey(t)
		admitted := 0
		for range 200 {
			r, _ := l.Allow(context.Background(), key, lim(alg, limiter.FailureModeLocalFallback), 1)
			g.Expect(r.Source).To(Equal(limiter.SourceFallback))
			if r.Allowed {
				admitted++
			}
		}
		g.Expect(admitted).To(BeNumerically("~", 100/replicas, 1), "%s: local fallback admits limit / live replicas", alg)
	}

	g.Expect(srv.Start()).To(Succeed())
	key := uniqueKey(t)
	g.Eventually(func() limiter.Source {
		r, _ := l.Allow(context.Background(), key, lim(limiter.FixedWindow, limiter.FailureModeOpen), 1)
		return r.Source
	}).WithTimeout(10*time.Second).WithPolling(50*time.Millisecond).Should(Equal(limiter.SourceRedis), "the breaker closes once Redis answers")
	for _, o := range ls[1:] {
		g.Eventually(func() limiter.Source {
			r, _ := o.Allow(context.Background(), key, lim(limiter.FixedWindow, limiter.FailureModeOpen), 1)
			return r.Source
		}).WithTimeout(10 * time.Second).WithPolling(50 * time.Millisecond).Should(Equal(limiter.SourceRedis))
	}
	got := hammer(t, ls, []string{uniqueKey(t)}, lim(limiter.SlidingWindowLog, limiter.FailureModeClosed), 16, 10)
	g.Expect(got[0]).To(Equal(int64(100)), "shared counting resumes after the restart")
	g.Expect(keysWithoutTTL(srv.URL())).To(BeEmpty())
}

// Redis frozen (SIGSTOP): decisions time out on the hot-path read timeout instead of hanging,
// the breaker opens after a bounded number of them, and Redis's return closes it again.
func TestRedisSlow(t *testing.T) {
	g := NewWithT(t)
	srv, err := redistest.Start()
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { _ = srv.Close() })
	c, err := redisconn.NewClient(srv.URL(), redisconn.Options{ReadTimeout: 100 * time.Millisecond})
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { _ = c.Close() })
	const failures = 3
	l := newLimiter(t, c, limiter.TestOptions{BreakerFailures: failures, BreakerOpenFor: 200 * time.Millisecond})
	lim := exactLimit(limiter.TokenBucket, 10)
	lim.FailureMode = limiter.FailureModeClosed
	r, err := l.Allow(context.Background(), uniqueKey(t), lim, 1)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(r.Source).To(Equal(limiter.SourceRedis))

	g.Expect(srv.Pause()).To(Succeed())
	resumed := false
	t.Cleanup(func() {
		if !resumed {
			_ = srv.Resume()
		}
	})
	timeouts := 0
	for {
		r, err := l.Allow(context.Background(), uniqueKey(t), lim, 1)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(r.Allowed).To(BeFalse())
		g.Expect(r.Source).To(Equal(limiter.SourceFailClosed))
		if errors.Is(r.Err, limiter.ErrCircuitOpen) {
			break
		}
		var nerr interface{ Timeout() bool }
		g.Expect(errors.As(r.Err, &nerr) && nerr.Timeout()).To(BeTrue(), "a frozen Redis shows as a timeout, got %v", r.Err)
		timeouts++
		g.Expect(timeouts).To(BeNumerically("<=", failures))
	}

	g.Expect(srv.Resume()).To(Succeed())
	resumed = true
	g.Eventually(func() limiter.Source {
		r, _ := l.Allow(context.Background(), uniqueKey(t), lim, 1)
		return r.Source
	}).WithTimeout(10 * time.Second).WithPolling(50 * time.Millisecond).Should(Equal(limiter.SourceRedis))
}

// Limit.Replicas divides the local fallback by the limit's own group, not the limiter's count.
func TestFallbackUsesLimitReplicas(t *testing.T) {
	g := NewWithT(t)
	srv, err := redistest.Start()
	g.Expect(err).NotTo(HaveOccurred())
	c, err := redisconn.NewClient(srv.URL(), redisconn.Options{DialTimeout: 200 * time.Millisecond})
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { _ = c.Close() })
	g.Expect(srv.Close()).To(Succeed())

	l := newLimiter(t, c, limiter.TestOptions{BreakerFailures: 1})
	lim := exactLimit(limiter.FixedWindow, 100)
	lim.FailureMode = limiter.FailureModeLocalFallback
	lim.Replicas = 5
	key := uniqueKey(t)
	admitted := 0
	for range 200 {
		r, err := l.Allow(context.Background(), key, lim, 1)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(r.Source).To(Equal(limiter.SourceFallback))
		if r.Allowed {
			admitted++
		}
	}
	g.Expect(admitted).To(BeNumerically("~", 100/5, 1))
}

// Options.FallbackReplicas divides a limit whose replicas are not known yet (no heartbeat
// heard, as in a replica started during an outage); replicas once known win.
func TestFallbackReplicasUntilReplicasAreKnown(t *testing.T) {
	g := NewWithT(t)
	srv, err := redistest.Start()
	g.Expect(err).NotTo(HaveOccurred())
	c, err := redisconn.NewClient(srv.URL(), redisconn.Options{DialTimeout: 200 * time.Millisecond})
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { _ = c.Close() })
	g.Expect(srv.Close()).To(Succeed())

	l := newLimiter(t, c, limiter.TestOptions{BreakerFailures: 1, FallbackReplicas: 4})
	admitted := func(replicas int64) int {
		lim := exactLimit(limiter.FixedWindow, 100)
		lim.FailureMode = limiter.FailureModeLocalFallback
		lim.Replicas = replicas
		key, n := uniqueKey(t)+strconv.FormatInt(replicas, 10), 0
		for range 200 {
			r, err := l.Allow(context.Background(), key, lim, 1)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(r.Source).To(Equal(limiter.SourceFallback))
			if r.Allowed {
				n++
			}
		}
		return n
	}
	g.Expect(admitted(0)).To(Equal(100/4), "no replicas heard: the workload's count")
	g.Expect(admitted(2)).To(Equal(100/2), "replicas heard win")
}
