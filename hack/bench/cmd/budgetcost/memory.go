package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redline-dev/redline/internal/keyscheme"
	"github.com/redline-dev/redline/internal/limiter"
	"github.com/redline-dev/redline/internal/testutil/fakemodel"
	"github.com/redline-dev/redline/internal/testutil/redistest"
)

// redisHoldRow is what Redis holds for a key's open holds.
type redisHoldRow struct {
	holds int
	// zsetBytes is MEMORY USAGE of the key's hold records (every member counted: SAMPLES 0).
	zsetBytes int64
	// usedMemory is how much INFO memory's used_memory grew from before the first hold.
	usedMemory int64
}

// holdCounts are the open holds at which Redis is measured. A zset is a listpack up to 128
// members and a skiplist beyond, so a hold's bytes step up once, then stay.
var holdCounts = []int{1000, 10000}

// measureRedisHolds reserves holds on one key through the limiter, as the sidecar does, on a
// redis-server of its own (so that nothing else moves used_memory), and reads what they take
// at each of holdCounts open holds. The holds are not settled: the server ends with them.
func measureRedisHolds(ctx context.Context) ([]redisHoldRow, error) {
	srv, err := redistest.Start()
	if err != nil {
		return nil, fmt.Errorf("starting redis-server: %w", err)
	}
	defer func() { _ = srv.Close() }()
	rc := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer func() { _ = rc.Close() }()
	l, err := limiter.New(rc, limiter.Options{ReplicaID: limiter.NewReplicaID()}) // its table of 65536 holds outgrows holdCounts
	if err != nil {
		return nil, fmt.Errorf("starting the limiter: %w", err)
	}
	defer l.Close()
	key := keyscheme.Key(namespace, "memory", "tokens", "k")
	// A window of 50 years: every hold stays open until the server ends.
	lim := limiter.Limit{Algorithm: limiter.FixedWindow, Requests: 1 << 40, Window: 50 * 365 * 24 * time.Hour, FailureMode: limiter.FailureModeClosed}
	used0, err := usedMemory(ctx, rc)
	if err != nil {
		return nil, err
	}
	var rows []redisHoldRow
	open := 0
	for _, n := range holdCounts {
		if err := reserveHolds(ctx, l, key, lim, n-open); err != nil {
			return nil, err
		}
		open = n
		hk, err := holdKeys(ctx, rc, key+"*:h")
		if err != nil {
			return nil, err
		}
		if len(hk) != 1 {
			return nil, fmt.Errorf("%d hold keys for one key: %v", len(hk), hk)
		}
		if c, err := rc.ZCard(ctx, hk[0]).Result(); err != nil || c != int64(n) {
			return nil, fmt.Errorf("ZCARD %s = %d, %v; want the %d holds open", hk[0], c, err, n)
		}
		zb, err := rc.MemoryUsage(ctx, hk[0], 0).Result()
		if err != nil {
			return nil, fmt.Errorf("MEMORY USAGE %s: %w", hk[0], err)
		}
		used, err := usedMemory(ctx, rc)
		if err != nil {
			return nil, err
		}
		rows = append(rows, redisHoldRow{holds: n, zsetBytes: zb, usedMemory: used - used0})
	}
	return rows, nil
}

// reserveHolds takes n holds of 1 to 4096 units (each gets 4096) on key from 8 callers.
func reserveHolds(ctx context.Context, l *limiter.Limiter, key string, lim limiter.Limit, n int) error {
	var next atomic.Int64
	errs := make([]error, 8)
	var wg sync.WaitGroup
	for w := range errs {
		wg.Go(func() {
			for next.Add(1) <= int64(n) && ctx.Err() == nil {
				_, h, err := l.Reserve(ctx, key, lim, 1, 4096, time.Hour)
				if err == nil && (h == nil || h.Degraded) {
					err = fmt.Errorf("no hold in Redis: %+v", h)
				}
				if err != nil {
					errs[w] = fmt.Errorf("reserving: %w", err)
					return
				}
			}
		})
	}
	wg.Wait()
	return errors.Join(append(errs, ctx.Err())...)
}

// holdKeys lists the keys matching pattern (a few: SCAN in one go is bounded by them).
func holdKeys(ctx context.Context, rc *redis.Client, pattern string) ([]string, error) {
	var out []string
	iter := rc.Scan(ctx, 0, pattern, 1000).Iterator()
	for iter.Next(ctx) {
		out = append(out, iter.Val())
	}
	if err := iter.Err(); err != nil {
		return nil, fmt.Errorf("SCAN %s: %w", pattern, err)
	}
	return out, nil
}

func usedMemory(ctx context.Context, rc *redis.Client) (int64, error) {
	info, err := rc.Info(ctx, "memory").Result()
	if err != nil {
		return 0, fmt.Errorf("INFO memory: %w", err)
	}
	for line := range strings.SplitSeq(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "used_memory:"); ok {
			return strconv.ParseInt(v, 10, 64)
		}
	}
	return 0, errors.New("INFO memory has no used_memory")
}

// heapSample is a sidecar's Go heap at rest and with the slow streams in flight.
type heapSample struct {
	streams                    int
	restHeap, flightHeap       float64 // HeapAlloc after a GC, bytes
	restGoroutines, flightGoro float64
	// holdsInRedis and holdBytes are the budget's hold records open in Redis in flight, and
	// MEMORY USAGE of their keys.
	holdsInRedis int64
	holdBytes    int64
}

func (h heapSample) perStream() float64 { return (h.flightHeap - h.restHeap) / float64(h.streams) }

// measureHeap opens o.inflight slow streams through sidecar p (the fake sends a token every
// 100 ms: the hold stays open for the whole measurement), waits until each has its first event,
// and reads the sidecar's heap after a GC, against the same at rest before them.
func measureHeap(ctx context.Context, o options, b *bench, p int) (heapSample, error) {
	s := b.sidecars[p]
	out := heapSample{streams: o.inflight}
	var err error
	if out.restHeap, out.restGoroutines, err = liveHeap(ctx, s.Admin); err != nil {
		return out, err
	}
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1}}
	defer hc.CloseIdleConnections()
	body := streamCall.Body()
	url := "http://" + s.Proxy + streamCall.Path()
	ready := make(chan error, o.inflight)
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }() // every stream's goroutine has ended on return
	for i := range o.inflight {
		wg.Go(func() { slowStream(sctx, hc, url, body, int64(i), ready) })
	}
	deadline := time.After(30 * time.Second)
	for range o.inflight {
		select {
		case err := <-ready:
			if err != nil {
				return out, fmt.Errorf("opening the slow streams: %w", err)
			}
		case <-deadline:
			return out, fmt.Errorf("the %d slow streams not all open within 30s", o.inflight)
		}
	}
	if out.flightHeap, out.flightGoro, err = liveHeap(ctx, s.Admin); err != nil {
		return out, err
	}
	if p == pathBudget {
		hk, err := holdKeys(ctx, b.rc, "rl:{"+namespace+"/"+policies[p].Name+"/*:h")
		if err != nil {
			return out, err
		}
		for _, k := range hk {
			n, err := b.rc.ZCard(ctx, k).Result()
			if err != nil {
				return out, fmt.Errorf("ZCARD %s: %w", k, err)
			}
			m, err := b.rc.MemoryUsage(ctx, k, 0).Result()
			if err != nil {
				return out, fmt.Errorf("MEMORY USAGE %s: %w", k, err)
			}
			out.holdsInRedis += n
			out.holdBytes += m
		}
		// Fewer than the streams only when the day's window ended during the run (its holds go
		// back with it), which the table shows; none means the budget path did not hold.
		if out.holdsInRedis == 0 {
			return out, fmt.Errorf("no hold open in Redis for %d streams in flight", o.inflight)
		}
	}
	// The next round starts from rest: the streams ended, their holds settled. A sidecar slow
	// to get there is not a failure; the next round's rest reading then says so.
	cancel()
	wg.Wait()
	_ = waitFor(ctx, 10*time.Second, func() (bool, error) {
		_, g, err := liveHeap(ctx, s.Admin)
		return g <= out.restGoroutines+4, err
	})
	return out, nil
}

// slowStream opens a stream whose tokens come every 100 ms, reports on ready once its first
// event arrived (or it failed), and reads it until ctx ends.
func slowStream(ctx context.Context, hc *http.Client, url string, body []byte, i int64, ready chan<- error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		ready <- err
		return
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(keyHeader, "k"+strconv.FormatInt(i%keys, 10))
	req.Header.Set(fakemodel.KnobHeader, "delay=100ms")
	resp, err := hc.Do(req)
	if err != nil {
		ready <- err
		return
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		ready <- fmt.Errorf("status %d", resp.StatusCode)
		return
	}
	br := bufio.NewReader(resp.Body)
	if _, err := br.ReadString('\n'); err != nil {
		ready <- fmt.Errorf("reading the first event: %w", err)
		return
	}
	ready <- nil
	_, _ = io.Copy(io.Discard, br) // until ctx cancels the request
}

// liveHeap forces a GC in the sidecar (pprof's heap handler with gc=1) and then reads its
// HeapAlloc and goroutines from /metrics: the live heap, garbage left out. The least of three
// readings, so that a scrape's own allocations weigh as little as they can.
func liveHeap(ctx context.Context, admin string) (heap, goroutines float64, err error) {
	heap = -1
	for range 3 {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+admin+"/debug/pprof/heap?gc=1", nil)
		if err != nil {
			return 0, 0, fmt.Errorf("building the heap request: %w", err)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, 0, fmt.Errorf("forcing a GC: %w", err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return 0, 0, fmt.Errorf("forcing a GC: status %d", resp.StatusCode)
		}
		h, err := scrapeSum(ctx, admin, "go_memstats_heap_alloc_bytes", "")
		if err != nil {
			return 0, 0, err
		}
		if heap < 0 || h < heap {
			heap = h
		}
		if goroutines, err = scrapeSum(ctx, admin, "go_goroutines", ""); err != nil {
			return 0, 0, err
		}
	}
	if heap <= 0 {
		return 0, 0, errors.New("the sidecar reports no go_memstats_heap_alloc_bytes")
	}
	return heap, goroutines, nil
}
