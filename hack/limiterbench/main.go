// Command limiterbench compares three ways of deciding a shared rate limit against one Redis and
// prints a table: the naive two-call INCR-then-EXPIRE, one unbatched EVALSHA per decision, and
// the limiter engine (batched pipelines, pre-check). It also runs redis-benchmark -P 16 with the
// same script as the ceiling of the machine.
//
//	go run ./hack/limiterbench [-url redis://127.0.0.1:6379] [-duration 2s] [-callers 1,16,256]
//
// Without -url it starts its own redis-server on a free loopback port.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redline-dev/redline/internal/limiter"
	"github.com/redline-dev/redline/internal/testutil/redistest"
)

const keyCount = 1024

// limit admits everything, so every decision runs the script's write path.
var limit = limiter.Limit{Algorithm: limiter.FixedWindow, Requests: 1 << 40, Window: time.Hour}

type roundTrips struct{ n atomic.Int64 }

func (h *roundTrips) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *roundTrips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { h.n.Add(1); return next(ctx, cmd) }
}
func (h *roundTrips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error { h.n.Add(1); return next(ctx, cmds) }
}

type decideFunc func(ctx context.Context, key string) error

type mode struct {
	name  string
	setup func(c redis.UniversalClient) (decideFunc, func(), error)
}

var modes = []mode{
	{"naive INCR+EXPIRE", func(c redis.UniversalClient) (decideFunc, func(), error) {
		return func(ctx context.Context, key string) error {
			if err := c.Incr(ctx, key+":naive").Err(); err != nil {
				return err
			}
			return c.Expire(ctx, key+":naive", time.Hour).Err()
		}, func() {}, nil
	}},
	{"EVALSHA unbatched", func(c redis.UniversalClient) (decideFunc, func(), error) {
		sha := limiter.ScriptSHAs()[limiter.FixedWindow]
		return func(ctx context.Context, key string) error {
			return c.EvalSha(ctx, sha, []string{key + ":fw"}, limit.Requests, limit.Window.Milliseconds(), 1).Err()
		}, func() {}, nil
	}},
	{"limiter engine", func(c redis.UniversalClient) (decideFunc, func(), error) {
		l, err := limiter.New(c, engineOptions)
		if err != nil {
			return nil, nil, err
		}
		return func(ctx context.Context, key string) error {
			r, err := l.Allow(ctx, key, limit, 1)
			if err == nil && r.Source != limiter.SourceRedis {
				err = fmt.Errorf("decision from %s: %w", r.Source, r.Err)
			}
			return err
		}, l.Close, nil
	}},
}

// engineOptions are the engine's settings, from flags.
var engineOptions limiter.Options

type row struct {
	mode            string
	callers         int
	perSec          float64
	p50, p99        time.Duration
	trips, allocsPD float64
}

func main() {
	url := flag.String("url", "", "Redis URL (default: start a redis-server)")
	duration := flag.Duration("duration", 2*time.Second, "how long each cell runs")
	callersFlag := flag.String("callers", "1,16,256", "comma-separated concurrent callers")
	flag.IntVar(&engineOptions.Flushers, "flushers", 0, "engine pipelines in flight (0: the default)")
	flag.IntVar(&engineOptions.MaxBatch, "max-batch", 0, "engine decisions per pipeline (0: the default)")
	flag.Parse()
	if err := run(*url, *duration, *callersFlag); err != nil {
		fmt.Fprintln(os.Stderr, "limiterbench:", err)
		os.Exit(1)
	}
}

func run(url string, duration time.Duration, callersFlag string) error {
	var callers []int
	for f := range strings.SplitSeq(callersFlag, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return fmt.Errorf("bad -callers entry %q", f)
		}
		callers = append(callers, n)
	}
	port := ""
	if url == "" {
		srv, err := redistest.Start()
		if err != nil {
			return err
		}
		defer srv.Close()
		url, port = srv.URL(), strconv.Itoa(srv.Port)
	}
	keys := make([]string, keyCount)
	for i := range keys {
		keys[i] = limiter.Key("bench", "policy", "rule", strconv.Itoa(i))
	}
	var rows []row
	for _, m := range modes {
		for _, n := range callers {
			r, err := cell(url, m, n, keys, duration)
			if err != nil {
				return fmt.Errorf("%s with %d callers: %w", m.name, n, err)
			}
			rows = append(rows, r)
		}
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "mode\tcallers\tdecisions/s\tp50\tp99\tround trips/decision\tallocs/decision\t\n")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%d\t%.0f\t%s\t%s\t%.3f\t%.1f\t\n", r.mode, r.callers, r.perSec,
			r.p50.Round(time.Microsecond), r.p99.Round(time.Microsecond), r.trips, r.allocsPD)
	}
	_ = tw.Flush()
	for _, n := range callers {
		var unbatched, engine float64
		for _, r := range rows {
			if r.callers == n && r.mode == "EVALSHA unbatched" {
				unbatched = r.perSec
			}
			if r.callers == n && r.mode == "limiter engine" {
				engine = r.perSec
			}
		}
		fmt.Printf("engine / unbatched EVALSHA at %d callers: %.2fx\n", n, engine/unbatched)
	}
	if port != "" {
		ceiling, err := redisBenchmark(port)
		if err != nil {
			fmt.Println("redis-benchmark ceiling: not measured:", err)
			return nil
		}
		fmt.Printf("redis-benchmark -P 16 EVALSHA (same script, 50 clients): %.0f requests/s\n", ceiling)
		for _, r := range rows {
			if r.mode == "limiter engine" && r.callers == slices.Max(callers) {
				fmt.Printf("engine at %d callers reaches %.0f%% of that ceiling\n", r.callers, 100*r.perSec/ceiling)
			}
		}
	}
	return nil
}

func cell(url string, m mode, callers int, keys []string, duration time.Duration) (row, error) {
	c, err := limiter.NewClient(url, limiter.ClientOptions{PoolSize: 64, ReadTimeout: 5 * time.Second,
		WriteTimeout: 5 * time.Second, PoolTimeout: 5 * time.Second})
	if err != nil {
		return row{}, err
	}
	defer c.Close()
	ctx := context.Background()
	if _, err := limiter.LoadScripts(ctx, c); err != nil {
		return row{}, err
	}
	decide, closeFn, err := m.setup(c)
	if err != nil {
		return row{}, err
	}
	defer closeFn()
	// Warm the pool and the scripts before measuring.
	for i := range 2 * callers {
		if err := decide(ctx, keys[i%len(keys)]); err != nil {
			return row{}, err
		}
	}
	trips := &roundTrips{}
	c.AddHook(trips)

	lat := make([][]time.Duration, callers)
	for i := range lat {
		lat[i] = make([]time.Duration, 0, 1<<16)
	}
	var stop atomic.Bool
	var failed atomic.Value
	var next atomic.Int64
	var wg sync.WaitGroup
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	start := time.Now()
	for g := range callers {
		wg.Go(func() {
			for !stop.Load() {
				k := keys[next.Add(1)%int64(len(keys))]
				t0 := time.Now()
				if err := decide(ctx, k); err != nil {
					failed.Store(err)
					return
				}
				lat[g] = append(lat[g], time.Since(t0))
			}
		})
	}
	time.Sleep(duration)
	stop.Store(true)
	wg.Wait()
	elapsed := time.Since(start)
	runtime.ReadMemStats(&after)
	if err, _ := failed.Load().(error); err != nil {
		return row{}, err
	}
	var all []time.Duration
	for _, l := range lat {
		all = append(all, l...)
	}
	slices.Sort(all)
	n := float64(len(all))
	return row{
		mode: m.name, callers: callers, perSec: n / elapsed.Seconds(),
		p50: all[len(all)/2], p99: all[len(all)*99/100],
		trips:    float64(trips.n.Load()) / n,
		allocsPD: float64(after.Mallocs-before.Mallocs) / n,
	}, nil
}

var rpsRE = regexp.MustCompile(`([0-9.]+) requests per second`)

// redisBenchmark runs redis-benchmark with 16-deep pipelines and the fixed-window script over
// 1024 random keys, the most this machine's Redis can decide.
func redisBenchmark(port string) (float64, error) {
	bin, err := exec.LookPath("redis-benchmark")
	if err != nil {
		return 0, fmt.Errorf("redis-benchmark not on PATH: %w", err)
	}
	sha := limiter.ScriptSHAs()[limiter.FixedWindow]
	out, err := exec.Command(bin, "-p", port, "-P", "16", "-c", "50", "-n", "400000", "-r", strconv.Itoa(keyCount), "-q",
		"EVALSHA", sha, "1", "rl:{bench/ceiling/rule/__rand_int__}:fw",
		strconv.FormatInt(limit.Requests, 10), strconv.FormatInt(limit.Window.Milliseconds(), 10), "1").CombinedOutput()
	if err != nil {
		return 0, fmt.Errorf("redis-benchmark: %w\n%s", err, out)
	}
	m := rpsRE.FindAllSubmatch(out, -1)
	if len(m) == 0 {
		return 0, fmt.Errorf("no requests per second in redis-benchmark output:\n%s", out)
	}
	return strconv.ParseFloat(string(m[len(m)-1][1]), 64)
}
