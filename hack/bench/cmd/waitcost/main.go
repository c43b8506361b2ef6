// Command waitcost measures what a durability option built on WAIT would cost a decision: the
// FixedWindow script alone against the script followed by WAIT 1 <timeout> on the same connection
// (one pipeline, so a decision is answered once a replica acknowledged the window's count), on a
// real master with one replica on loopback, and the same with the replica stalled (SIGSTOP), so
// that every WAIT runs into its timeout: what a user sees while a replica lags (and once more with
// the master's hz at 100, since a timed-out WAIT is answered on the event loop's next tick). The
// stalled cells take under 20 s together, within the master's repl-timeout (60 s), so the replica
// stays attached and lagging rather than dropped.
//
//	go run ./cmd/waitcost [-concurrency 1,16,64] [-rounds 3] [-cell-time 2s] [-cell-ops 20000]
//
// Per cell (median of -rounds runs, alternating, while the replica is healthy): decisions/s, latency p50/p99 of a decision (one pipeline round trip), the master's
// CPU per decision (INFO cpu, used_cpu_sys+used_cpu_user of the whole process over the cell,
// replication included) and how many WAITs returned fewer than one replica. Every call is a grant
// of one unit with the replica's share, as a sidecar without leases sends it, on one of 1,000
// keys of a one-hour window whose limit is never reached. Both redis-servers end on success,
// failure or Ctrl-C; every load loop is bounded in count and in time.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redline-dev/redline/internal/limiter/scripts"
	"github.com/redline-dev/redline/internal/testutil/redistest"

	"github.com/redline-dev/redline/hack/bench/internal/machine"
)

const (
	keys   = 1000
	limit  = 1_000_000_000
	window = int64(time.Hour / time.Millisecond)
	// replicaID is 8 characters, as limiter.NewReplicaID.
	replicaID = "r0000001"
)

func main() {
	var conc string
	cellTime := flag.Duration("cell-time", 2*time.Second, "longest run of one cell")
	cellOps := flag.Int64("cell-ops", 20000, "most decisions of one cell")
	rounds := flag.Int("rounds", 3, "runs of each cell with the replica healthy, EVALSHA alone and with WAIT alternating")
	flag.StringVar(&conc, "concurrency", "1,16,64", "concurrent callers")
	timeout := flag.Duration("timeout", 5*time.Minute, "give up after this long")
	flag.Parse()
	var concs []int
	for f := range strings.SplitSeq(conc, ",") {
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 {
			fmt.Fprintf(os.Stderr, "waitcost: -concurrency: %q is not a positive count\n", f)
			os.Exit(2)
		}
		concs = append(concs, n)
	}
	if *rounds < 1 {
		fmt.Fprintln(os.Stderr, "waitcost: -rounds must be positive")
		os.Exit(2)
	}
	if err := run(concs, *rounds, *cellTime, *cellOps, *timeout, strings.TrimSpace("go run ./cmd/waitcost "+strings.Join(os.Args[1:], " "))); err != nil {
		fmt.Fprintln(os.Stderr, "waitcost:", err)
		os.Exit(1)
	}
}

// mode is how a decision is sent.
type mode struct {
	name    string
	wait    time.Duration // 0: no WAIT
	stalled bool          // the replica is stopped during the cell
	// hz is the master's hz during the cell (0: the default, 10). A blocked WAIT's timeout is
	// noticed by the event loop, which an otherwise idle Redis runs hz times a second.
	hz int
}

var modes = []mode{
	{name: "EVALSHA alone"},
	{name: "EVALSHA + WAIT 1 100", wait: 100 * time.Millisecond},
	{name: "EVALSHA + WAIT 1 10, replica stalled", wait: 10 * time.Millisecond, stalled: true},
	{name: "EVALSHA + WAIT 1 100, replica stalled", wait: 100 * time.Millisecond, stalled: true},
	{name: "EVALSHA + WAIT 1 10, replica stalled, hz 100", wait: 10 * time.Millisecond, stalled: true, hz: 100},
}

// result is one cell.
type result struct {
	mode        mode
	concurrency int
	ops         int64
	perSec      float64
	p50, p99    time.Duration
	cpuPerOp    time.Duration
	unacked     int64 // WAITs that returned 0 replicas
}

// measureStalled measures each stalled mode at every concurrency, with its hz set on the
// master meanwhile.
func measureStalled(ctx context.Context, c *redis.Client, stalled []mode, concs []int, measure func(mode, int) error) error {
	for _, m := range stalled {
		if m.hz != 0 {
			if err := c.ConfigSet(ctx, "hz", strconv.Itoa(m.hz)).Err(); err != nil {
				return fmt.Errorf("CONFIG SET hz: %w", err)
			}
		}
		for _, n := range concs {
			if err := measure(m, n); err != nil {
				return err
			}
		}
		if m.hz != 0 {
			if err := c.ConfigSet(ctx, "hz", "10").Err(); err != nil {
				return fmt.Errorf("CONFIG SET hz: %w", err)
			}
		}
	}
	return nil
}

func progress(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "[%s] %s\n", time.Now().UTC().Format("15:04:05"), fmt.Sprintf(format, args...))
}

func run(concs []int, rounds int, cellTime time.Duration, cellOps int64, timeout time.Duration, command string) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	load := machine.LoadAverage()
	master, err := redistest.Start()
	if err != nil {
		return fmt.Errorf("starting the master: %w", err)
	}
	defer func() { _ = master.Close() }()
	replica, err := redistest.Start("--replicaof", "127.0.0.1", strconv.Itoa(master.Port))
	if err != nil {
		return fmt.Errorf("starting the replica: %w", err)
	}
	// A stopped process still dies of SIGKILL, but resume it first so Close's wait is short.
	defer func() { _ = replica.Resume(); _ = replica.Close() }()
	maxConc := slices.Max(concs)
	c := redis.NewClient(&redis.Options{Addr: master.Addr(), PoolSize: maxConc, MinIdleConns: maxConc})
	defer func() { _ = c.Close() }()
	if err := waitInSync(ctx, c); err != nil {
		return err
	}
	s, ok := scripts.For("FixedWindow")
	if !ok {
		return errors.New("no FixedWindow script")
	}
	if err := c.ScriptLoad(ctx, s.Source).Err(); err != nil {
		return fmt.Errorf("SCRIPT LOAD: %w", err)
	}
	g := &granter{sha: s.SHA}
	results := map[cellKey][]result{}
	measure := func(m mode, n int) error {
		r, err := cell(ctx, c, g, m, n, cellTime, cellOps)
		if err != nil {
			return fmt.Errorf("%s at %d callers: %w", m.name, n, err)
		}
		progress("%-46s c=%-3d %8.0f/s p50 %-9s p99 %-9s master CPU %.1f µs/decision, WAIT unacked %d of %d",
			m.name, n, r.perSec, r.p50.Round(time.Microsecond), r.p99.Round(time.Microsecond), float64(r.cpuPerOp)/1e3, r.unacked, r.ops)
		k := cellKey{m.name, n}
		results[k] = append(results[k], r)
		return nil
	}
	// With the replica healthy, the difference is small beside the machine's noise: the two
	// alternate, which goes first swapping every round.
	var healthy, stalled []mode
	for _, m := range modes {
		if m.stalled {
			stalled = append(stalled, m)
		} else {
			healthy = append(healthy, m)
		}
	}
	for r := range rounds {
		for _, n := range concs {
			order := slices.Clone(healthy)
			if r%2 == 1 {
				slices.Reverse(order)
			}
			for _, m := range order {
				if err := measure(m, n); err != nil {
					return err
				}
			}
		}
	}
	// Stalled, every WAIT waits for its timeout: one run each is enough, and the whole stall
	// stays within the master's repl-timeout.
	progress("stalling the replica (SIGSTOP)")
	if err := replica.Pause(); err != nil {
		return fmt.Errorf("stopping the replica: %w", err)
	}
	if err := measureStalled(ctx, c, stalled, concs, measure); err != nil {
		return err
	}
	if err := replica.Resume(); err != nil {
		return fmt.Errorf("resuming the replica: %w", err)
	}
	printTable(command, load, rounds, cellTime, cellOps, concs, results)
	return nil
}

// waitInSync waits until the master has its replica online and a WAIT is acknowledged.
func waitInSync(ctx context.Context, c *redis.Client) error {
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if err := c.Set(ctx, "waitcost:probe", "1", 0).Err(); err != nil {
			return fmt.Errorf("SET on the master: %w", err)
		}
		if n, err := c.Wait(ctx, 1, 200*time.Millisecond).Result(); err == nil && n >= 1 {
			return c.Del(ctx, "waitcost:probe").Err()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for the replica: %w", ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
	return errors.New("the replica did not acknowledge a write within 20s")
}

// granter sends grants as a sidecar does: with its replica id and what it knows of its share.
type granter struct {
	sha   string
	start atomic.Int64 // the window's start (ms on Redis's clock) the shares are of
	known [keys]atomic.Int64
}

func key(k int) string { return fmt.Sprintf("rl:{bench/waitcost/per-key/%032x}:fw", k) }

// decide runs one grant on key k, followed by WAIT 1 m.wait in the same pipeline when m.wait is
// set, and says whether the WAIT saw no replica.
func (g *granter) decide(ctx context.Context, c *redis.Client, m mode, k int) (unacked bool, err error) {
	args := []any{"evalsha", g.sha, 1, key(k), limit, window, 1, 0, 1, replicaID, g.start.Load(), g.known[k].Load(), 0, 0}
	var eval *redis.Cmd
	var wait *redis.Cmd
	if m.wait == 0 {
		eval = c.Do(ctx, args...)
	} else {
		pipe := c.Pipeline()
		eval = pipe.Do(ctx, args...)
		// Pipeliner has no Wait method; Do sends it the same way.
		wait = pipe.Do(ctx, "wait", 1, m.wait.Milliseconds())
		if _, err := pipe.Exec(ctx); err != nil {
			return false, fmt.Errorf("pipeline: %w", err)
		}
	}
	n, err := eval.Int64Slice()
	if err != nil || len(n) < 6 {
		return false, fmt.Errorf("script reply %v: %w", n, err)
	}
	if n[0] != 1 {
		return false, fmt.Errorf("refused: %v", n)
	}
	start := n[4] / 1000 / window * window
	if g.start.Swap(start) != start {
		for i := range g.known {
			g.known[i].Store(0)
		}
	}
	g.known[k].Add(n[5])
	if wait != nil {
		acked, err := wait.Int64()
		if err != nil {
			return false, fmt.Errorf("WAIT reply: %w", err)
		}
		return acked < 1, nil
	}
	return false, nil
}

// cell runs m from n callers, each starting its next decision when the previous is answered,
// until cellOps decisions or cellTime.
func cell(ctx context.Context, c *redis.Client, g *granter, m mode, n int, cellTime time.Duration, cellOps int64) (result, error) {
	for i := range min(n, 64) { // every connection of the pool dialed before measuring
		if _, err := g.decide(ctx, c, mode{}, i); err != nil {
			return result{}, fmt.Errorf("warm-up: %w", err)
		}
	}
	cpu0, err := machine.RedisCPU(ctx, c)
	if err != nil {
		return result{}, err
	}
	cctx, cancel := context.WithTimeout(ctx, cellTime)
	defer cancel()
	var next, unacked atomic.Int64
	lat := make([][]time.Duration, n)
	var once sync.Once
	var first error
	var wg sync.WaitGroup
	start := time.Now()
	for w := range n {
		wg.Go(func() {
			for cctx.Err() == nil {
				i := next.Add(1) - 1
				if i >= cellOps {
					return
				}
				t0 := time.Now()
				// The decision itself gets the caller's context, not the cell's: one cut by the
				// cell's end would be a failure that is not one.
				u, err := g.decide(ctx, c, m, int(i%keys))
				if err != nil {
					once.Do(func() { first = err; cancel() })
					return
				}
				lat[w] = append(lat[w], time.Since(t0))
				if u {
					unacked.Add(1)
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	if first != nil {
		return result{}, first
	}
	cpu1, err := machine.RedisCPU(ctx, c)
	if err != nil {
		return result{}, err
	}
	all := slices.Concat(lat...)
	if len(all) == 0 {
		return result{}, fmt.Errorf("no decision within %s", cellTime)
	}
	slices.Sort(all)
	return result{mode: m, concurrency: n, ops: int64(len(all)), perSec: float64(len(all)) / elapsed.Seconds(),
		p50: all[len(all)/2], p99: all[min(len(all)-1, len(all)*99/100)],
		cpuPerOp: (cpu1 - cpu0) / time.Duration(len(all)), unacked: unacked.Load()}, nil
}

// cellKey names a cell: a mode at a number of callers.
type cellKey struct {
	mode        string
	concurrency int
}

// summary is the median of a cell's runs.
type summary struct {
	runs          int
	perSec, cpuUs float64
	p50, p99      time.Duration
	unacked, ops  int64
}

func summarize(rs []result) summary {
	med := func(f func(result) float64) float64 {
		v := make([]float64, 0, len(rs))
		for _, r := range rs {
			v = append(v, f(r))
		}
		slices.Sort(v)
		if len(v)%2 == 1 {
			return v[len(v)/2]
		}
		return (v[len(v)/2-1] + v[len(v)/2]) / 2
	}
	s := summary{runs: len(rs), perSec: med(func(r result) float64 { return r.perSec }),
		cpuUs: med(func(r result) float64 { return float64(r.cpuPerOp) / 1e3 }),
		p50:   time.Duration(med(func(r result) float64 { return float64(r.p50) })),
		p99:   time.Duration(med(func(r result) float64 { return float64(r.p99) }))}
	for _, r := range rs {
		s.unacked += r.unacked
		s.ops += r.ops
	}
	return s
}

func printTable(command, load string, rounds int, cellTime time.Duration, cellOps int64, concs []int, results map[cellKey][]result) {
	fmt.Printf("`%s`: one master and one replica (redis-server, loopback, `replicaof`), each run at most %s or %d decisions; "+
		"with the replica healthy, %d runs per cell, EVALSHA alone and with WAIT alternating; %s, %d cores; load average %s at start, %s at end.\n\n",
		command, cellTime, cellOps, rounds, runtime.Version(), runtime.NumCPU(), load, machine.LoadAverage())
	fmt.Println("A decision is the FixedWindow script's grant of one unit (with the replica's share), and with WAIT the " +
		"`WAIT 1 <timeout ms>` sent in the same pipeline, on the same connection: WAIT returns once a replica acknowledged " +
		"every write of that connection so far, or at its timeout. \"stalled\": the replica is stopped (SIGSTOP), so every WAIT " +
		"times out; a blocked WAIT's timeout is noticed when Redis's event loop next runs, which an otherwise idle Redis does hz " +
		"times a second (10 by default), so a timeout is rounded up to the next tick. Master CPU: INFO cpu's used_cpu_sys+used_cpu_user " +
		"over the run, divided by its decisions; with the replica stalled and few decisions, it is mostly the master's idle work " +
		"(serverCron) spread over them. Values are medians over the runs; \"vs alone\": decisions/s and master CPU per decision " +
		"against EVALSHA alone at the same callers.")
	fmt.Println()
	fmt.Println("| decision | callers | runs | decisions/s | vs alone | p50 | p99 | master CPU µs/decision | vs alone | WAITs that saw no replica |")
	fmt.Println("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
	for _, m := range modes {
		for _, n := range concs {
			rs := results[cellKey{m.name, n}]
			if len(rs) == 0 {
				continue
			}
			s, a := summarize(rs), summarize(results[cellKey{modes[0].name, n}])
			unacked := "–"
			if m.wait != 0 {
				unacked = fmt.Sprintf("%d of %d", s.unacked, s.ops)
			}
			fmt.Printf("| %s | %d | %d | %.0f | %.2fx | %s | %s | %.1f | %.2fx | %s |\n", m.name, n, s.runs, s.perSec, s.perSec/a.perSec,
				fmtDur(s.p50), fmtDur(s.p99), s.cpuUs, s.cpuUs/a.cpuUs, unacked)
		}
	}
}

func fmtDur(d time.Duration) string {
	if d >= time.Millisecond {
		return fmt.Sprintf("%.2f ms", float64(d)/1e6)
	}
	return fmt.Sprintf("%d µs", d.Microseconds())
}
