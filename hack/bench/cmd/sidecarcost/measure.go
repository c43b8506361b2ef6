package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/redline-dev/redline/hack/bench/internal/machine"
	"github.com/redline-dev/redline/internal/sidecar/rls"
	"github.com/redline-dev/redline/internal/testutil/redistest"
	"github.com/redline-dev/redline/internal/testutil/sidecarproc"
)

// measure runs cell c once on version v: a fresh redis-server with v's scripts, a fresh sidecar.
// With profile set, the sidecar serves pprof, a CPU profile of the load is written there and
// a heap profile after it beside it (.heap.pprof).
func measure(ctx context.Context, o options, v *version, c cell, f sidecarproc.Files, upstream, logs, profile string) (sample, error) {
	srv, err := redistest.Start()
	if err != nil {
		return sample{}, fmt.Errorf("starting redis-server: %w", err)
	}
	defer func() { _ = srv.Close() }()
	rc := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer func() { _ = rc.Close() }()
	for _, s := range v.scripts {
		if err := rc.ScriptLoad(ctx, s.Source).Err(); err != nil {
			return sample{}, fmt.Errorf("SCRIPT LOAD %s: %w", s.Name, err)
		}
	}
	var extra []string
	if !c.leases {
		extra = append(extra, "--lease-horizon=0")
	}
	if profile != "" {
		extra = append(extra, "--pprof")
	}
	sc, err := startSidecar(ctx, v.bin, logs, v.name, f, srv.URL(), upstream, extra)
	if err != nil {
		return sample{}, err
	}
	defer func() { _ = sc.Stop(3 * time.Second) }()
	fn, closeFn, err := faceOp(sc, c)
	if err != nil {
		return sample{}, err
	}
	defer closeFn()
	for i := range 200 { // connections, scripts, first leases
		if err := fn(ctx, int64(i)); err != nil {
			return sample{}, fmt.Errorf("warm-up: %w", err)
		}
	}
	before, err := read(ctx, sc, rc)
	if err != nil {
		return sample{}, err
	}
	stopRSS := samplePeak(sc.Pid())
	profiled := make(chan error, 1)
	if profile != "" {
		go func() { profiled <- fetchProfile(ctx, sc.Admin, o.pprofSeconds, profile) }()
	} else {
		profiled <- nil
	}
	ops, elapsed, err := closedLoop(ctx, o.concurrency, o.ops, o.cellTime, fn)
	peak := stopRSS()
	if perr := <-profiled; err == nil && perr != nil {
		err = perr
	}
	if err == nil && profile != "" {
		err = fetchHeap(ctx, sc.Admin, strings.TrimSuffix(profile, ".pprof")+".heap.pprof")
	}
	if err != nil {
		return sample{}, err
	}
	after, err := read(ctx, sc, rc)
	if err != nil {
		return sample{}, err
	}
	hwm, err := statusMiB(sc.Pid(), "VmHWM:")
	if err != nil {
		return sample{}, err
	}
	n := float64(ops)
	return sample{cpuPerDecision: (after.cpu - before.cpu) / time.Duration(ops), redisPerDecision: (after.redis - before.redis) / time.Duration(ops),
		rssPeakMiB: peak, hwmMiB: hwm, perSec: n / elapsed.Seconds(), degraded: after.degraded - before.degraded,
		allocs: (after.mallocs - before.mallocs) / n, allocBytes: (after.allocBytes - before.allocBytes) / n,
		gcsPer1k: (after.gcs - before.gcs) * 1000 / n, nextGCMiB: after.nextGC / (1 << 20)}, nil
}

// reading is what is read before and after a load: the sidecar's counters and CPU time, and
// the redis-server's CPU time.
type reading struct {
	counters
	cpu, redis time.Duration
}

func read(ctx context.Context, sc *sidecar, rc *redis.Client) (reading, error) {
	c, err := sc.counters(ctx)
	if err != nil {
		return reading{}, err
	}
	cpu, err := sidecarproc.CPUTime(sc.Pid())
	if err != nil {
		return reading{}, fmt.Errorf("reading the sidecar's CPU time: %w", err)
	}
	red, err := machine.RedisCPU(ctx, rc)
	if err != nil {
		return reading{}, err
	}
	return reading{counters: c, cpu: cpu, redis: red}, nil
}

func leasesWord(on bool) string {
	if on {
		return "leases-on"
	}
	return "leases-off"
}

// keyOf names the i-th request's key among n.
func keyOf(i int64, n int) string {
	if n == 1 {
		return "hot"
	}
	return "k" + strconv.FormatInt(i%int64(n), 10)
}

// faceOp returns one decision through c's face against sidecar s; every answer must admit.
func faceOp(s *sidecar, c cell) (func(context.Context, int64) error, func(), error) {
	rule := rules[c.algorithm]
	if c.face == faceRLS {
		conn, err := grpc.NewClient(s.GRPC, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return nil, nil, fmt.Errorf("dialing the RLS face: %w", err)
		}
		client := rlsv3.NewRateLimitServiceClient(conn)
		return func(ctx context.Context, i int64) error {
			resp, err := client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "bench",
				Descriptors: []*ratelimitv3.RateLimitDescriptor{{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{
					{Key: rls.EntryPolicy, Value: policy}, {Key: rls.EntryRule, Value: rule}, {Key: keyHeader, Value: keyOf(i, c.keys)},
				}}}})
			if err != nil {
				return fmt.Errorf("ShouldRateLimit: %w", err)
			}
			if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
				return fmt.Errorf("ShouldRateLimit: %s", resp.GetOverallCode())
			}
			return nil
		}, func() { _ = conn.Close() }, nil
	}
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{MaxIdleConns: 256, MaxIdleConnsPerHost: 256}}
	url := "http://" + s.Check + "/v1/check"
	return func(ctx context.Context, i int64) error {
		body := `{"policy":"` + policy + `","rule":"` + rule + `","key":["` + keyOf(i, c.keys) + `"]}`
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
		if err != nil {
			return fmt.Errorf("building request: %w", err)
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := hc.Do(req)
		if err != nil {
			return fmt.Errorf("POST /v1/check: %w", err)
		}
		b, err := io.ReadAll(io.LimitReader(resp.Body, 4096))
		_ = resp.Body.Close()
		if err != nil {
			return fmt.Errorf("reading /v1/check: %w", err)
		}
		if resp.StatusCode != http.StatusOK || !strings.HasPrefix(string(b), `{"allowed":true`) {
			return fmt.Errorf("/v1/check: status %d: %.200s", resp.StatusCode, b)
		}
		return nil
	}, hc.CloseIdleConnections, nil
}

// closedLoop runs fn from conc goroutines until maxOps decisions have been answered or maxTime
// has passed. Any failure ends the run with it: a decision that is not an admission means the
// sidecar measured is not doing what the other one does.
func closedLoop(ctx context.Context, conc int, maxOps int64, maxTime time.Duration, fn func(context.Context, int64) error) (int64, time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, maxTime)
	defer cancel()
	var next, done atomic.Int64
	var once sync.Once
	var first error
	var wg sync.WaitGroup
	start := time.Now()
	for range conc {
		wg.Go(func() {
			for ctx.Err() == nil {
				i := next.Add(1) - 1
				if i >= maxOps {
					return
				}
				if err := fn(ctx, i); err != nil {
					if ctx.Err() == nil {
						once.Do(func() { first = err; cancel() })
					}
					return
				}
				done.Add(1)
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	if first != nil {
		return 0, 0, first
	}
	if done.Load() == 0 {
		return 0, 0, fmt.Errorf("no decision within %s", maxTime)
	}
	return done.Load(), elapsed, nil
}

// statusMiB reads a field of /proc/<pid>/status given in kB, in MiB.
func statusMiB(pid int, field string) (float64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, fmt.Errorf("reading the sidecar's status: %w", err)
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, field); ok {
			v, err := strconv.ParseFloat(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 64)
			if err != nil {
				return 0, fmt.Errorf("/proc/%d/status %s %q: %w", pid, field, rest, err)
			}
			return v / 1024, nil
		}
	}
	return 0, fmt.Errorf("/proc/%d/status has no %s", pid, field)
}

// samplePeak reads VmRSS every 50ms until the returned function is called, which returns the
// largest value seen (and a last reading, so that a short run has one).
func samplePeak(pid int) func() float64 {
	var peak float64
	var mu sync.Mutex
	read := func() {
		if v, err := statusMiB(pid, "VmRSS:"); err == nil {
			mu.Lock()
			peak = max(peak, v)
			mu.Unlock()
		}
	}
	done, finished := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(finished)
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				read()
			}
		}
	}()
	return func() float64 {
		close(done)
		<-finished
		read()
		return peak
	}
}
