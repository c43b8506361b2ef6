package limiter_test

import (
	"bytes"
	"context"
	"errors"
	"runtime/pprof"
	"strings"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"github.com/redis/go-redis/v9"

	"github.com/redline-dev/redline/internal/limiter"
	"github.com/redline-dev/redline/internal/redisconn"
)

// goroutinesIn counts the goroutines with frame (a function name) on their stack now.
func goroutinesIn(frame string) int {
	var buf bytes.Buffer
	_ = pprof.Lookup("goroutine").WriteTo(&buf, 2)
	n := 0
	for g := range strings.SplitSeq(buf.String(), "\n\n") {
		if strings.Contains(g, frame) {
			n++
		}
	}
	return n
}

// waitsInRedis counts the connections blocked in a WAIT on admin's server now.
func waitsInRedis(admin *redis.Client) int {
	list, err := admin.ClientList(context.Background()).Result()
	if err != nil {
		return 0
	}
	return strings.Count(list, "cmd=wait ")
}

// poolClient is a client of url with 16 connections: a quarter of them, 4, may wait at once.
func poolClient(t *testing.T, url string) redis.UniversalClient {
	t.Helper()
	opts := testClientOptions
	opts.PoolSize, opts.PoolTimeout, opts.ReadTimeout = 16, 5*time.Second, 5*time.Second
	c, err := redisconn.NewClient(url, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

const (
	poolWaits = 4 // poolClient's quarter
	slots     = 4 // the limiter's pipeline slots: its flushers, or callers deciding inline
)

// A flood of durable decisions runs on at most as many goroutines as waits may be in flight:
// with the master stopped every pipeline hangs, and the decisions queue up behind the bounded
// ones instead of each batch leaving on a goroutine of its own. Pipelines in flight are counted
// (never timed): the waiting ones, plus one per flusher.
func TestDurableFloodRunsOnBoundedGoroutines(t *testing.T) {
	g := NewWithT(t)
	master := startServer(t) // no replica: a WAIT holds its connection for its whole timeout
	c := poolClient(t, master.URL())
	exactWindow(t, c, durableLimit.Window, 30*time.Minute)
	l := newLimiter(t, c, limiter.TestOptions{})
	durable := durableLimit
	durable.Durability = limiter.Durability{Mode: limiter.DurabilityReplica, Timeout: time.Second}
	if r, err := l.Allow(context.Background(), uniqueKey(t), durable, 1); err != nil || r.Source != limiter.SourceRedis {
		t.Fatalf("warm-up: %+v, %v", r, err)
	}
	if err := master.Pause(); err != nil {
		t.Fatal(err)
	}
	resumed := false
	defer func() {
		if !resumed {
			_ = master.Resume()
		}
	}()

	const callers = 48
	var wg sync.WaitGroup
	for range callers {
		wg.Go(func() { _, _ = l.Allow(context.Background(), uniqueKey(t), durable, 1) })
	}
	peak := 0
	sample := func() int {
		n := goroutinesIn("limiter.(*Limiter).pipeline(")
		peak = max(peak, n)
		return n
	}
	// Every caller is inside the limiter, and the pipelines that can leave have left and hang.
	g.Eventually(func() int { sample(); return goroutinesIn("limiter.(*Limiter).Allow(") }, time.Minute, 5*time.Millisecond).
		Should(Equal(callers))
	g.Eventually(sample, time.Minute, 5*time.Millisecond).Should(BeNumerically(">=", slots+1), "the pipelines hang on the stopped master")
	for range 20 {
		sample()
	}
	if err := master.Resume(); err != nil {
		t.Fatal(err)
	}
	resumed = true
	wg.Wait()
	g.Expect(peak).To(BeNumerically("<=", poolWaits+slots), "pipelines in flight at most")
	t.Logf("%d durable callers, master stopped: at most %d pipelines in flight", callers, peak)
}

// Close waits for the durable pipelines in flight: none of them uses the client after Close
// returns, their callers get Redis's answer, and decisions after Close are refused.
func TestCloseWaitsForDurablePipelines(t *testing.T) {
	g := NewWithT(t)
	master := startServer(t) // no replica: each WAIT waits its whole timeout
	c := poolClient(t, master.URL())
	exactWindow(t, c, durableLimit.Window, 30*time.Minute)
	l, err := limiter.NewWith(c, limiter.TestOptions{LeaseHorizon: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	durable := durableLimit
	durable.Durability = limiter.Durability{Mode: limiter.DurabilityReplica, Timeout: 2 * time.Second}
	admin := master.Client("")
	defer admin.Close()

	const callers = 3
	results := make(chan limiter.Result, callers)
	for range callers {
		go func() {
			r, err := l.Allow(context.Background(), uniqueKey(t), durable, 1)
			if err != nil {
				t.Errorf("durable decision in flight at Close: %v", err)
			}
			results <- r
		}()
	}
	g.Eventually(func() int { return waitsInRedis(admin) }, time.Minute, 5*time.Millisecond).Should(BeNumerically(">=", 1))
	l.Close()
	g.Expect(goroutinesIn("limiter.(*Limiter).execDurable(")).To(BeZero(), "no durable pipeline outlives Close")
	answered := 0
	for range callers {
		r := <-results
		if r.Source == limiter.SourceRedis {
			g.Expect(r.Allowed).To(BeTrue())
			answered++
		}
	}
	g.Expect(answered).To(BeNumerically(">=", 1), "a grant waiting at Close is Redis's answer, not a failure mode's")
	_, err = l.Allow(context.Background(), uniqueKey(t), durable, 1)
	g.Expect(errors.Is(err, limiter.ErrClosed)).To(BeTrue(), "a durable decision after Close: %v", err)
}

// A stopped replica slows only the rules that wait for it: with a durable rule flooded and
// every one of its waits timing out, each decision of a plain rule still comes from Redis,
// never from its failure mode. Counted, not timed.
func TestStalledReplicaLeavesPlainRulesOnRedis(t *testing.T) {
	g := NewWithT(t)
	master, replica := startPair(t)
	if err := replica.Pause(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = replica.Resume() }()
	c := poolClient(t, master.URL())
	exactWindow(t, c, durableLimit.Window, 30*time.Minute)
	l := newLimiter(t, c, limiter.TestOptions{})
	durable := durableLimit
	durable.Durability = limiter.Durability{Mode: limiter.DurabilityReplica, Timeout: time.Second}
	plain := durableLimit
	plain.FailureMode = limiter.FailureModeClosed
	admin := master.Client("")
	defer admin.Close()

	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 32 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := l.Allow(context.Background(), uniqueKey(t), durable, 1); err != nil {
					t.Errorf("durable decision: %v", err)
					return
				}
			}
		})
	}
	g.Eventually(func() int { return waitsInRedis(admin) }, time.Minute, 5*time.Millisecond).Should(BeNumerically(">=", 1))
	const decisions = 300
	bySource := map[limiter.Source]int{}
	for range decisions {
		r, err := l.Allow(context.Background(), uniqueKey(t), plain, 1)
		g.Expect(err).NotTo(HaveOccurred())
		bySource[r.Source]++
	}
	close(stop)
	wg.Wait()
	st := l.Stats()
	g.Expect(bySource[limiter.SourceRedis]).To(Equal(decisions), "plain decisions by source: %v", bySource)
	g.Expect(st.Unacked.Timeout).To(BeNumerically(">", 0), "the durable rule's waits timed out on the stopped replica")
	g.Expect(st.AckedGrants).To(BeZero())
	t.Logf("plain decisions by source %v; durable: %d timed out, %d busy", bySource, st.Unacked.Timeout, st.Unacked.Busy)
}
