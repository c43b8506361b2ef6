package sidecar_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redline-dev/redline/internal/keyscheme"
	"github.com/redline-dev/redline/internal/limiter"
	"github.com/redline-dev/redline/internal/redisconn"
	"github.com/redline-dev/redline/internal/sidecar/checkapi"
	"github.com/redline-dev/redline/internal/testutil/redistest/redisclient"
	"github.com/redline-dev/redline/internal/testutil/sidecarproc"
	"github.com/redline-dev/redline/internal/testutil/sidecartest"
)

// Benchmarks of the built binary against the shared redis-server. Run with, e.g.:
//
//	go test ./test/sidecar -run '^$' -bench . -benchtime 6000x
//
// They report the budgets of the sidecar issue as metrics: added latency at a paced request
// rate, decisions per second of /v1/check, and the sidecar process's RSS idle and under load.
//
// REDLINE_SIDECAR_BASELINE names another sidecar binary (say, main's) for ProxyAddedLatency to
// run side by side with this one, on the same schedule and the same machine noise:
//
//	mkdir /tmp/main && git archive main | tar -x -C /tmp/main
//	(cd /tmp/main && CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o /tmp/sidecar-main ./cmd/sidecar)
//	REDLINE_SIDECAR_BASELINE=/tmp/sidecar-main go test ./test/sidecar -run '^$' -bench ProxyAdded/GET -benchtime 10000x

func benchSidecar(b *testing.B) (*sidecar, *upstream) {
	s, _, up := benchSidecars(b, "")
	return s, up
}

// benchSidecars starts this build's sidecar and, if baselineBin is not empty, a second one from
// that binary, both in front of one upstream.
func benchSidecars(b *testing.B, baselineBin string) (s, baseline *sidecar, up *upstream) {
	e := newEnv(b, "bench")
	e.write(b, sidecartest.DocumentAlgorithm(e.namespace, "p", "r", "bench", 1_000_000_000, time.Minute, "x-key", "LocalFallback", "SlidingWindowCounter"))
	up = newUpstream(b)
	s = start(b, "pod-bench", e, shared.URL(), up.addr(), true, "--log-level=info")
	if baselineBin != "" {
		baseline = startBinary(b, baselineBin, "pod-bench-baseline", e, shared.URL(), up.addr(), true, "--log-level=info")
	}
	return s, baseline, up
}

// rssKiB reads VmRSS of a process.
func rssKiB(pid int) float64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return -1
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			v, _ := strconv.ParseFloat(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 64)
			return v
		}
	}
	return -1
}

// cpuTime is a process's user+system CPU time (0 if /proc cannot say).
func cpuTime(pid int) time.Duration {
	d, _ := sidecarproc.CPUTime(pid)
	return d
}

// machineBusy reads /proc/stat's busy and total CPU ticks over all cores.
func machineBusy() (busy, total int64) {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0
	}
	line, _, _ := strings.Cut(string(data), "\n")
	for i, v := range strings.Fields(line)[1:] {
		n, _ := strconv.ParseInt(v, 10, 64)
		total += n
		if i != 3 && i != 4 { // idle and iowait
			busy += n
		}
	}
	return busy, total
}

func percentile(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	slices.Sort(d)
	return d[min(len(d)-1, int(float64(len(d))*p))]
}

// BenchmarkProxyAddedLatency sends 2000 requests/s through the sidecar and, interleaved on
// the same schedule, 500/s straight to the upstream and 500/s decisions of the limiter engine
// in this process against the same Redis (what the sidecar's decision costs without HTTP). All
// three see the same machine noise. It reports p50 and p99 of each, the proxy's added latency
// (proxy minus direct) and the sidecar's RSS. GET has no body; POST carries 1 KiB of JSON;
// POST-chunked streams its body without a length. With REDLINE_SIDECAR_BASELINE set, every
// tick also sends the same request through the baseline sidecar, reported as baseline-*.
func BenchmarkProxyAddedLatency(b *testing.B) {
	s, baseline, up := benchSidecars(b, os.Getenv("REDLINE_SIDECAR_BASELINE"))
	client := redisclient.New(b, shared.URL(), redisconn.Options{})
	// The probe measures the Redis decision a request waits for when it has no lease.
	engine, err := limiter.New(client, limiter.Options{LeaseHorizon: -1})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(engine.Close)
	payload := strings.Repeat("x", 1000)
	for _, tc := range []struct {
		name string
		body func() io.Reader
	}{
		{"GET", nil},
		{"POST", func() io.Reader { return strings.NewReader(`{"p":"` + payload + `"}`) }},
		{"POST-chunked", func() io.Reader { return io.MultiReader(strings.NewReader(`{"p":"`), strings.NewReader(payload+`"}`)) }},
	} {
		b.Run(tc.name, func(b *testing.B) { benchAddedLatency(b, s, baseline, up, engine, tc.body) })
	}
}

func benchAddedLatency(b *testing.B, s, baseline *sidecar, up *upstream, engine *limiter.Limiter, body func() io.Reader) {
	const rate = 2000 // proxied requests per second; direct and engine probes each a quarter of it
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256, MaxIdleConns: 512}}
	get := func(url string, key int) (time.Duration, bool) {
		method, reqBody := http.MethodGet, io.Reader(nil)
		if body != nil {
			method, reqBody = http.MethodPost, body()
		}
		req, _ := http.NewRequest(method, url, reqBody)
		req.Header.Set("X-Key", strconv.Itoa(key))
		start := time.Now()
		resp, err := client.Do(req)
		if err != nil {
			return 0, false
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return time.Since(start), resp.StatusCode == http.StatusOK
	}
	lim := limiter.Limit{Requests: 1_000_000_000, Window: time.Minute, Algorithm: limiter.SlidingWindowCounter, FailureMode: limiter.FailureModeOpen}
	decide := func(key int) (time.Duration, bool) {
		start := time.Now()
		res, err := engine.Allow(context.Background(), keyscheme.Key("bench", "p", "r", strconv.Itoa(key)), lim, 1)
		return time.Since(start), err == nil && res.Allowed && res.Source == limiter.SourceRedis
	}
	// Warm connections and the limiter: every key of the run twice through the proxy, so that
	// it holds a lease on each (a key's first decision asks Redis for one unit, its second for
	// a lease), as a sidecar in front of a steady application does.
	for i := range 200 {
		get(up.URL+"/", i)
		decide(i)
	}
	for i := range 2 * 1000 {
		get(s.proxy+"/", i%1000)
		if baseline != nil {
			get(baseline.proxy+"/", i%1000)
		}
	}
	warm := rssKiB(s.Pid()) // after the warm-up requests; make bench reads the idle RSS after start
	cpu0 := cpuTime(s.Pid())
	var baseWarm float64
	var baseCPU0 time.Duration
	if baseline != nil {
		baseWarm, baseCPU0 = rssKiB(baseline.Pid()), cpuTime(baseline.Pid())
	}
	busy0, total0 := machineBusy()
	var mu sync.Mutex
	var direct, proxied, decided, based []time.Duration
	var failed atomic.Int64
	var wg sync.WaitGroup
	record := func(dst *[]time.Duration, d time.Duration, ok bool) {
		if !ok {
			failed.Add(1)
			return
		}
		mu.Lock()
		*dst = append(*dst, d)
		mu.Unlock()
	}
	interval := time.Second / rate
	b.ResetTimer()
	start := time.Now()
	for i := range b.N {
		if d := time.Until(start.Add(time.Duration(i) * interval)); d > 0 {
			time.Sleep(d)
		}
		key := i % 1000
		wg.Go(func() { d, ok := get(s.proxy+"/", key); record(&proxied, d, ok) })
		if baseline != nil {
			wg.Go(func() { d, ok := get(baseline.proxy+"/", key); record(&based, d, ok) })
		}
		switch i % 4 {
		case 0:
			wg.Go(func() { d, ok := get(up.URL+"/", key); record(&direct, d, ok) })
		case 2:
			wg.Go(func() { d, ok := decide(key); record(&decided, d, ok) })
		}
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	load := rssKiB(s.Pid())
	sidecarCPU := cpuTime(s.Pid()) - cpu0
	busy1, total1 := machineBusy()
	dp50, dp99 := percentile(direct, 0.5), percentile(direct, 0.99)
	pp50, pp99 := percentile(proxied, 0.5), percentile(proxied, 0.99)
	ep50, ep99 := percentile(decided, 0.5), percentile(decided, 0.99)
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "proxied-req/s")
	b.ReportMetric(float64(dp50.Microseconds()), "direct-p50-µs")
	b.ReportMetric(float64(dp99.Microseconds()), "direct-p99-µs")
	b.ReportMetric(float64(pp50.Microseconds()), "proxy-p50-µs")
	b.ReportMetric(float64(pp99.Microseconds()), "proxy-p99-µs")
	b.ReportMetric(float64(ep50.Microseconds()), "engine-p50-µs")
	b.ReportMetric(float64(ep99.Microseconds()), "engine-p99-µs")
	b.ReportMetric(float64((pp50 - dp50).Microseconds()), "added-p50-µs")
	b.ReportMetric(float64((pp99 - dp99).Microseconds()), "added-p99-µs")
	b.ReportMetric(warm/1024, "rss-warm-MiB")
	b.ReportMetric(load/1024, "rss-load-MiB")
	b.ReportMetric(float64(sidecarCPU.Microseconds())/float64(b.N), "sidecar-cpu-µs/req")
	if total1 > total0 {
		b.ReportMetric(100*float64(busy1-busy0)/float64(total1-total0), "machine-busy-%")
	}
	if baseline != nil {
		bp50, bp99 := percentile(based, 0.5), percentile(based, 0.99)
		baseCPU := cpuTime(baseline.Pid()) - baseCPU0
		b.ReportMetric(float64(bp50.Microseconds()), "baseline-proxy-p50-µs")
		b.ReportMetric(float64(bp99.Microseconds()), "baseline-proxy-p99-µs")
		b.ReportMetric(float64((bp50 - dp50).Microseconds()), "baseline-added-p50-µs")
		b.ReportMetric(float64((bp99 - dp99).Microseconds()), "baseline-added-p99-µs")
		b.ReportMetric(baseWarm/1024, "baseline-rss-warm-MiB")
		b.ReportMetric(rssKiB(baseline.Pid())/1024, "baseline-rss-load-MiB")
		b.ReportMetric(float64(baseCPU.Microseconds())/float64(b.N), "baseline-cpu-µs/req")
	}
	b.ReportMetric(float64(failed.Load()), "failed")
	b.ReportMetric(0, "ns/op")
}

// BenchmarkCheckAPI measures /v1/check decisions per second with keep-alive clients, each
// decision a Redis script run (distinct keys, a limit never reached).
func BenchmarkCheckAPI(b *testing.B) {
	s, _ := benchSidecar(b)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256, MaxIdleConns: 512}}
	url := s.check + checkapi.Path
	var seq atomic.Int64
	var refused, failed atomic.Int64
	b.SetParallelism(16)
	b.ResetTimer()
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			body := `{"policy":"p","rule":"r","key":["k` + strconv.FormatInt(seq.Add(1)%10000, 10) + `"]}`
			resp, err := client.Post(url, "application/json", strings.NewReader(body))
			if err != nil {
				failed.Add(1)
				continue
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK || !strings.HasPrefix(string(b), `{"allowed":true`) {
				refused.Add(1)
			}
		}
	})
	elapsed := time.Since(start)
	b.StopTimer()
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "decisions/s")
	b.ReportMetric(rssKiB(s.Pid())/1024, "rss-load-MiB")
	b.ReportMetric(float64(refused.Load()+failed.Load()), "not-allowed")
}
