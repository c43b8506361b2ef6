// Command sidecarbench measures the sidecar binary against the budgets and prints a
// table: added proxy latency at a paced request rate over a direct call to the upstream,
// /v1/check decisions per second, and the sidecar's RSS idle and under load.
//
//	go build -o /tmp/sidecar ./cmd/sidecar && go run ./hack/sidecarbench -sidecar /tmp/sidecar
//
// It starts its own redis-server (redis-server on PATH), upstream and sidecar on loopback.
package main

import (
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/redline-dev/redline/internal/compiled"
	"github.com/redline-dev/redline/internal/sidecar/sidecartest"
	"github.com/redline-dev/redline/internal/testutil/redistest"
)

func main() {
	bin := flag.String("sidecar", "/tmp/sidecar", "sidecar binary")
	rate := flag.Int("rate", 2000, "paced proxy requests per second (half direct, half proxied)")
	dur := flag.Duration("duration", 5*time.Second, "length of each measurement")
	conc := flag.Int("concurrency", 16, "concurrent /v1/check clients")
	flag.Parse()
	if err := run(*bin, *rate, *dur, *conc); err != nil {
		log.Fatal(err)
	}
}

func run(bin string, rate int, dur time.Duration, conc int) error {
	srv, err := redistest.Start()
	if err != nil {
		return fmt.Errorf("starting redis-server: %w", err)
	}
	defer srv.Close()
	up := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })}
	upLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	go func() { _ = up.Serve(upLn) }()
	defer up.Close()

	dir, err := os.MkdirTemp("", "sidecarbench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	cfg, info := filepath.Join(dir, "policies"), filepath.Join(dir, "podinfo")
	if err := sidecartest.WriteAtomic(cfg, map[string][]byte{compiled.DataKey: sidecartest.DocumentAlgorithm("bench", "p", "r", "bench", 1_000_000_000, time.Minute, "x-key", "LocalFallback", "SlidingWindowCounter")}); err != nil {
		return err
	}
	if err := sidecartest.WriteAtomic(info, map[string][]byte{"labels": []byte("app=\"bench\"\n")}); err != nil {
		return err
	}
	port := func() string { p, _ := redistest.FreePort(); return "127.0.0.1:" + strconv.Itoa(p) }
	listen, admin := port(), port()
	cmd := exec.Command(bin, "--listen="+listen, "--upstream="+upLn.Addr().String(), "--admin-listen="+admin,
		"--grpc-listen="+port(), "--config-dir="+cfg, "--pod-labels="+filepath.Join(info, "labels"))
	cmd.Env = append(os.Environ(), "REDLINE_REDIS_URL="+srv.URL(), "POD_NAME=bench")
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting sidecar: %w", err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 512, MaxIdleConns: 1024}}
	for deadline := time.Now().Add(10 * time.Second); ; {
		if resp, err := client.Get("http://" + admin + "/readyz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				break
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("sidecar not ready")
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(time.Second)
	idle := rss(cmd.Process.Pid)

	get := func(url string, key int) (time.Duration, bool) {
		req, _ := http.NewRequest(http.MethodGet, url, nil)
		req.Header.Set("X-Key", strconv.Itoa(key))
		start := time.Now()
		resp, err := client.Do(req)
		if err != nil {
			return 0, false
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return time.Since(start), resp.StatusCode == 200
	}
	for i := range 500 {
		get("http://"+upLn.Addr().String()+"/", i)
		get("http://"+listen+"/", i)
	}
	var mu sync.Mutex
	var direct, proxied []time.Duration
	var failed atomic.Int64
	var wg sync.WaitGroup
	n := int(dur.Seconds() * float64(rate))
	start := time.Now()
	var peak float64
	for i := range n {
		if d := time.Until(start.Add(time.Duration(i) * time.Second / time.Duration(rate))); d > 0 {
			time.Sleep(d)
		}
		if i%rate == 0 {
			peak = max(peak, rss(cmd.Process.Pid))
		}
		wg.Go(func() {
			url, dst := "http://"+upLn.Addr().String()+"/", &direct
			if i%2 == 1 {
				url, dst = "http://"+listen+"/", &proxied
			}
			d, ok := get(url, i%1000)
			if !ok {
				failed.Add(1)
				return
			}
			mu.Lock()
			*dst = append(*dst, d)
			mu.Unlock()
		})
	}
	wg.Wait()
	achieved := float64(n) / time.Since(start).Seconds()
	proxyRSS := max(peak, rss(cmd.Process.Pid))

	var decisions, notOK atomic.Int64
	stop := make(chan struct{})
	checkURL := "http://" + admin + "/v1/check"
	for w := range conc {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				body := `{"policy":"p","rule":"r","key":["k` + strconv.Itoa(w*100000+i%10000) + `"]}`
				resp, err := client.Post(checkURL, "application/json", strings.NewReader(body))
				if err != nil {
					notOK.Add(1)
					continue
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if !strings.HasPrefix(string(b), `{"allowed":true`) {
					notOK.Add(1)
				}
				decisions.Add(1)
			}
		})
	}
	cstart := time.Now()
	time.Sleep(dur / 2)
	checkRSS := rss(cmd.Process.Pid)
	time.Sleep(dur / 2)
	close(stop)
	wg.Wait()
	perSec := float64(decisions.Load()) / time.Since(cstart).Seconds()

	dp50, dp99 := pct(direct, .5), pct(direct, .99)
	pp50, pp99 := pct(proxied, .5), pct(proxied, .99)
	load, _ := os.ReadFile("/proc/loadavg")
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "measure\tvalue\tbudget\n")
	fmt.Fprintf(tw, "paced rate achieved (direct+proxied)\t%.0f req/s (%d failed)\t%d\n", achieved, failed.Load(), rate)
	fmt.Fprintf(tw, "direct p50 / p99\t%s / %s\t\n", dp50, dp99)
	fmt.Fprintf(tw, "proxied p50 / p99\t%s / %s\t\n", pp50, pp99)
	fmt.Fprintf(tw, "added p50 / p99\t%s / %s\tp99 < 1ms\n", pp50-dp50, pp99-dp99)
	fmt.Fprintf(tw, "/v1/check decisions/s (%d clients)\t%.0f (%d not allowed)\t>= 20000\n", conc, perSec, notOK.Load())
	fmt.Fprintf(tw, "RSS idle\t%.1f MiB\t< 15 MiB\n", idle)
	fmt.Fprintf(tw, "RSS under proxy load / check load\t%.1f / %.1f MiB\t< 30 MiB\n", proxyRSS, checkRSS)
	fmt.Fprintf(tw, "load average\t%s\t\n", strings.TrimSpace(string(load)))
	return tw.Flush()
}

func pct(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	slices.Sort(d)
	return d[min(len(d)-1, int(float64(len(d))*p))].Round(time.Microsecond)
}

// rss is VmRSS of a process in MiB.
func rss(pid int) float64 {
	data, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	for line := range strings.SplitSeq(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			v, _ := strconv.ParseFloat(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 64)
			return v / 1024
		}
	}
	return -1
}
