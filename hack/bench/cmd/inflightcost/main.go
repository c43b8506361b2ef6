// Command inflightcost measures what an in-flight rule adds to a request beside a plain rule,
// side by side in one run: the sidecar's CPU per request (utime+stime of the process over the
// load, from /proc/<pid>/stat, divided by the requests) and the Redis commands per request
// (INFO's total_commands_processed and commandstats over the load, heartbeats and renewals
// included), through the proxy face.
//
//	go run ./cmd/inflightcost -root ../.. [-rounds 3] [-ops 10000] [-clients 16]
//
// Cells: "plain", one FixedWindow rule per X-Key whose limit is never reached, and "plain +
// inFlight", the same rule beside an in-flight rule of the same key whose limit is never reached
// either; leases off (--lease-horizon=0), so that the plain rule runs its script in Redis every
// time. Every request is admitted. Each round runs both cells (which goes first alternates), each
// on a fresh redis-server and a fresh sidecar. Every process this command starts ends on success,
// failure or Ctrl-C; every load loop is bounded in count and in time.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redline-dev/redline/internal/policydoc"
	"github.com/redline-dev/redline/internal/testutil/redistest"
	"github.com/redline-dev/redline/internal/testutil/sidecarproc"
)

const namespace = "bench"

type options struct {
	root            string
	rounds, ops     int
	clients         int
	cellTime        time.Duration
	keys            int
	inFlightLimit   int64
	requestsPerCell int64
}

type sample struct {
	ops                     int
	elapsed                 time.Duration
	cpu                     time.Duration
	commands, evalsha, zrem float64
}

func main() {
	var o options
	flag.StringVar(&o.root, "root", "../..", "the product module's root")
	flag.IntVar(&o.rounds, "rounds", 3, "rounds of both cells")
	flag.IntVar(&o.ops, "ops", 10000, "requests per cell and round")
	flag.IntVar(&o.clients, "clients", 16, "clients in a closed loop")
	flag.IntVar(&o.keys, "keys", 100, "distinct X-Key values, round robin")
	flag.DurationVar(&o.cellTime, "cell-time", 2*time.Minute, "longest a cell's load may run")
	flag.Parse()
	o.inFlightLimit, o.requestsPerCell = 100_000, 1_000_000_000
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o); err != nil {
		fmt.Fprintln(os.Stderr, "inflightcost:", err)
		os.Exit(1)
	}
}

func document(withInFlight bool, o options) ([]byte, error) {
	key := []policydoc.KeyPart{{Header: "x-key"}}
	rules := []policydoc.Rule{{Name: "fw", Key: key, Algorithm: "FixedWindow", Requests: o.requestsPerCell,
		WindowMS: time.Minute.Milliseconds(), Mode: "Enforce"}}
	if withInFlight {
		rules = append(rules, policydoc.Rule{Name: "slots", Key: key, InFlight: o.inFlightLimit, Mode: "Enforce"})
	}
	_, doc, err := policydoc.Build(namespace, []policydoc.Policy{{
		Name: "cost", Generation: 1, FailureMode: "Closed",
		Selector: policydoc.Selector{MatchLabels: map[string]string{"app": "web"}}, Rules: rules,
	}}, map[string]string{})
	return doc, err
}

func run(ctx context.Context, o options) error {
	dir, err := os.MkdirTemp("", "inflightcost-")
	if err != nil {
		return err
	}
	defer func() { _ = os.RemoveAll(dir) }()
	root, err := filepath.Abs(o.root)
	if err != nil {
		return err
	}
	bin, err := sidecarproc.Build(ctx, root, dir)
	if err != nil {
		return err
	}
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") }))
	defer up.Close()
	cells := []string{"plain", "plain + inFlight"}
	results := map[string][]sample{}
	for r := range o.rounds {
		order := cells
		if r%2 == 1 {
			order = []string{cells[1], cells[0]}
		}
		for _, c := range order {
			s, err := measure(ctx, o, bin, filepath.Join(dir, fmt.Sprintf("r%d-%d", r, len(results[c]))), c == cells[1], up.Listener.Addr().String())
			if err != nil {
				return fmt.Errorf("round %d, cell %s: %w", r, c, err)
			}
			results[c] = append(results[c], s)
		}
	}
	report(os.Stdout, o, cells, results)
	return nil
}

// measure runs one cell on a fresh redis-server and sidecar.
func measure(ctx context.Context, o options, bin, dir string, withInFlight bool, upstream string) (sample, error) {
	doc, err := document(withInFlight, o)
	if err != nil {
		return sample{}, err
	}
	files, err := sidecarproc.WriteFiles(dir, doc, "web")
	if err != nil {
		return sample{}, err
	}
	srv, err := redistest.Start()
	if err != nil {
		return sample{}, fmt.Errorf("starting redis-server: %w", err)
	}
	defer func() { _ = srv.Close() }()
	rc := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer func() { _ = rc.Close() }()
	sc, err := sidecarproc.Start(ctx, sidecarproc.Options{Bin: bin, Dir: dir, Name: "sidecar", Namespace: namespace, Files: files,
		RedisURL: srv.URL(), Upstream: upstream, Args: []string{"--lease-horizon=0", "--redis-timeout=1s"}})
	if err != nil {
		return sample{}, err
	}
	defer func() { _ = sc.Stop(3 * time.Second) }()
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: o.clients}, Timeout: 10 * time.Second}
	op := func(ctx context.Context, i int64) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+sc.Proxy+"/", nil)
		if err != nil {
			return err
		}
		req.Header.Set("X-Key", "k"+strconv.FormatInt(i%int64(o.keys), 10))
		resp, err := hc.Do(req)
		if err != nil {
			return err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("status %d", resp.StatusCode)
		}
		return nil
	}
	for i := range 200 { // connections, scripts
		if err := op(ctx, int64(i)); err != nil {
			return sample{}, fmt.Errorf("warm-up: %w", err)
		}
	}
	info0, err := commandStats(ctx, rc)
	if err != nil {
		return sample{}, err
	}
	cpu0, err := sidecarproc.CPUTime(sc.Pid())
	if err != nil {
		return sample{}, err
	}
	ops, elapsed, err := closedLoop(ctx, o, op)
	if err != nil {
		return sample{}, err
	}
	cpu1, err := sidecarproc.CPUTime(sc.Pid())
	if err != nil {
		return sample{}, err
	}
	info1, err := commandStats(ctx, rc)
	if err != nil {
		return sample{}, err
	}
	s := sample{ops: ops, elapsed: elapsed, cpu: cpu1 - cpu0,
		commands: info1["total"] - info0["total"], evalsha: info1["evalsha"] - info0["evalsha"], zrem: info1["zrem"] - info0["zrem"]}
	return s, nil
}

// commandStats reads total_commands_processed and the calls of EVALSHA and ZREM.
func commandStats(ctx context.Context, rc *redis.Client) (map[string]float64, error) {
	out := map[string]float64{}
	text, err := rc.Info(ctx, "stats", "commandstats").Result()
	if err != nil {
		return nil, fmt.Errorf("INFO: %w", err)
	}
	for line := range strings.SplitSeq(text, "\n") {
		line = strings.TrimSpace(line)
		if v, ok := strings.CutPrefix(line, "total_commands_processed:"); ok {
			out["total"], _ = strconv.ParseFloat(v, 64)
		}
		for _, cmd := range []string{"evalsha", "zrem"} {
			if rest, ok := strings.CutPrefix(line, "cmdstat_"+cmd+":calls="); ok {
				v, _, _ := strings.Cut(rest, ",")
				out[cmd], _ = strconv.ParseFloat(v, 64)
			}
		}
	}
	return out, nil
}

// closedLoop runs o.ops operations on o.clients clients, bounded by o.cellTime.
func closedLoop(ctx context.Context, o options, op func(context.Context, int64) error) (int, time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, o.cellTime)
	defer cancel()
	var next atomic.Int64
	var first error
	var once sync.Once
	var wg sync.WaitGroup
	start := time.Now()
	for range o.clients {
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= int64(o.ops) || ctx.Err() != nil {
					return
				}
				if err := op(ctx, i); err != nil {
					once.Do(func() { first = err; cancel() })
					return
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	if first != nil {
		return 0, 0, first
	}
	if n := next.Load(); n < int64(o.ops) {
		return 0, 0, errors.New("the cell ran out of time")
	}
	return o.ops, elapsed, nil
}

func report(w io.Writer, o options, cells []string, results map[string][]sample) {
	_, _ = fmt.Fprintf(w, "%d requests a cell and round, %d clients, %d keys, leases off. Redis commands count those scripts run (INFO's total_commands_processed) and heartbeats and renewals; the calls a request sends are EVALSHA and ZREM\n\n", o.ops, o.clients, o.keys)
	_, _ = fmt.Fprintln(w, "| cell | round | req/s | sidecar CPU µs/req | Redis commands/req | EVALSHA/req | ZREM/req |")
	_, _ = fmt.Fprintln(w, "| --- | --- | --- | --- | --- | --- | --- |")
	for _, c := range cells {
		for i, s := range results[c] {
			n := float64(s.ops)
			_, _ = fmt.Fprintf(w, "| %s | %d | %.0f | %.1f | %.2f | %.2f | %.2f |\n", c, i+1, n/s.elapsed.Seconds(),
				float64(s.cpu.Microseconds())/n, s.commands/n, s.evalsha/n, s.zrem/n)
		}
	}
}
