// Command waitcost measures what each durability choice of a rule costs a decision, through the
// limiter itself (leases off, so every decision is a grant in Redis): the plain rule with no
// persistence, with appendfsync everysec and with appendfsync always (CONFIG SET on the
// master), durability Replica (the limiter's WAIT 1 <timeout> after the EVALSHA, same
// pipeline), durability AppendOnlyFile (WAITAOF 1 0 <timeout>; on a Redis before 7.2 every one
// is refused as an unknown command, which the table shows), on a real master with one replica
// on loopback, and Replica once more with the replica stalled (SIGSTOP), so that every WAIT runs
// into its timeout: what a user sees while a replica lags. The stalled cells take under 20 s
// together, within the master's repl-timeout (60 s), so the replica stays attached.
//
//	go run ./cmd/waitcost [-concurrency 1,16,64] [-rounds 3] [-cell-time 2s] [-cell-ops 20000]
//
// Per cell (median of -rounds runs, alternating, while the replica is healthy): decisions/s, latency p50/p99 of a decision (one pipeline round trip), the master's
// CPU per decision (INFO cpu, used_cpu_sys+used_cpu_user of the whole process over the cell,
// replication and AOF included), this process's CPU per decision (the limiter, go-redis and the
// callers: getrusage) and how many grants went unacknowledged (the limiter's stats). Every
// call is a grant of one unit on one of 1,000 keys of a one-hour window whose limit is never
// reached. Both redis-servers end on success,
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

	"github.com/redline-dev/redline/internal/limiter"
	"github.com/redline-dev/redline/internal/testutil/redistest"

	"github.com/redline-dev/redline/hack/bench/internal/machine"
	"github.com/redline-dev/redline/internal/keyscheme"
)

const keys = 1000

func main() {
	var conc string
	cellTime := flag.Duration("cell-time", 2*time.Second, "longest run of one cell")
	cellOps := flag.Int64("cell-ops", 20000, "most decisions of one cell")
	rounds := flag.Int("rounds", 3, "runs of each cell with the replica healthy, EVALSHA alone and with WAIT alternating")
	flag.StringVar(&conc, "concurrency", "1,16,64", "concurrent callers")
	timeout := flag.Duration("timeout", 5*time.Minute, "give up after this long")
	server := flag.String("server", "redis-server", "the master's and the replica's server: redis-server, or valkey-server (which has WAITAOF, as Redis 7.2+)")
	flag.Parse()
	start := redistest.Start
	switch *server {
	case "redis-server":
	case "valkey-server":
		start = redistest.StartValkey
	default:
		fmt.Fprintf(os.Stderr, "waitcost: -server: %q is neither redis-server nor valkey-server\n", *server)
		os.Exit(2)
	}
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
	if err := run(start, concs, *rounds, *cellTime, *cellOps, *timeout, strings.TrimSpace("go run ./cmd/waitcost "+strings.Join(os.Args[1:], " "))); err != nil {
		fmt.Fprintln(os.Stderr, "waitcost:", err)
		os.Exit(1)
	}
}

// mode is a rule's durability and the master's persistence during a cell.
type mode struct {
	name       string
	durability limiter.Durability
	fsync      string // "": appendonly no; otherwise appendonly yes with this appendfsync
	stalled    bool   // the replica is stopped during the cell
}

var modes = []mode{
	{name: "plain, no persistence"},
	{name: "plain, appendfsync everysec", fsync: "everysec"},
	{name: "plain, appendfsync always", fsync: "always"},
	{name: "Replica (WAIT 1 100)", durability: limiter.Durability{Mode: limiter.DurabilityReplica, Timeout: 100 * time.Millisecond}},
	{name: "AppendOnlyFile (WAITAOF 1 0 100), everysec", durability: limiter.Durability{Mode: limiter.DurabilityAppendOnlyFile, Timeout: 100 * time.Millisecond}, fsync: "everysec"},
	{name: "Replica (WAIT 1 10), replica stalled", durability: limiter.Durability{Mode: limiter.DurabilityReplica, Timeout: 10 * time.Millisecond}, stalled: true},
}

// result is one cell.
type result struct {
	mode        mode
	concurrency int
	ops         int64
	perSec      float64
	p50, p99    time.Duration
	cpuPerOp    time.Duration // the master's
	procPerOp   time.Duration // this process's
	unacked     int64         // grants not acknowledged
}

func progress(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "[%s] %s\n", time.Now().UTC().Format("15:04:05"), fmt.Sprintf(format, args...))
}

func run(start func(...string) (*redistest.Server, error), concs []int, rounds int, cellTime time.Duration, cellOps int64, timeout time.Duration, command string) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	load := machine.LoadAverage()
	master, err := start()
	if err != nil {
		return fmt.Errorf("starting the master: %w", err)
	}
	defer func() { _ = master.Close() }()
	replica, err := start("--replicaof", "127.0.0.1", strconv.Itoa(master.Port))
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
	// Leases off: every decision is a grant in Redis, the cost a durability choice adds to.
	l, err := limiter.New(c, limiter.Options{LeaseHorizon: -1, PrecheckSize: -1})
	if err != nil {
		return fmt.Errorf("creating the limiter: %w", err)
	}
	defer l.Close()
	results := map[cellKey][]result{}
	measure := func(m mode, n int) error {
		r, err := cell(ctx, c, l, m, n, cellTime, cellOps)
		if err != nil {
			return fmt.Errorf("%s at %d callers: %w", m.name, n, err)
		}
		progress("%-46s c=%-3d %8.0f/s p50 %-9s p99 %-9s master CPU %.1f µs/decision, process %.1f µs/decision, unacked %d of %d",
			m.name, n, r.perSec, r.p50.Round(time.Microsecond), r.p99.Round(time.Microsecond), float64(r.cpuPerOp)/1e3, float64(r.procPerOp)/1e3, r.unacked, r.ops)
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
	for _, m := range stalled {
		for _, n := range concs {
			if err := measure(m, n); err != nil {
				return err
			}
		}
	}
	if err := replica.Resume(); err != nil {
		return fmt.Errorf("resuming the replica: %w", err)
	}
	printTable(command, serverVersion(ctx, c), load, rounds, cellTime, cellOps, concs, results)
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

func key(k int) string { return keyscheme.Key("bench", "waitcost", "per-key", strconv.Itoa(k)) }

// persistence sets the master's append-only file as m needs it.
func persistence(ctx context.Context, c *redis.Client, m mode) error {
	aof, fsync := "no", m.fsync
	if fsync != "" {
		aof = "yes"
	} else {
		fsync = "everysec"
	}
	if err := c.ConfigSet(ctx, "appendfsync", fsync).Err(); err != nil {
		return fmt.Errorf("CONFIG SET appendfsync: %w", err)
	}
	if err := c.ConfigSet(ctx, "appendonly", aof).Err(); err != nil {
		return fmt.Errorf("CONFIG SET appendonly: %w", err)
	}
	// Turning the file on rewrites it in the background: measure once it is done.
	for {
		info, err := c.Info(ctx, "persistence").Result()
		if err != nil {
			return fmt.Errorf("INFO persistence: %w", err)
		}
		if strings.Contains(info, "aof_rewrite_in_progress:0") && strings.Contains(info, "aof_rewrite_scheduled:0") {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// processCPU is this process's user and system CPU so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// unackedOf counts the grants answered without their acknowledgement, those sent without a
// wait because every waiting pipeline was taken (busy) included.
func unackedOf(st limiter.Stats) int64 {
	return int64(st.Unacked.Timeout + st.Unacked.Unsupported + st.Unacked.Error + st.Unacked.Busy)
}

// cell runs m from n callers, each starting its next decision when the previous is answered,
// until cellOps decisions or cellTime.
func cell(ctx context.Context, c *redis.Client, l *limiter.Limiter, m mode, n int, cellTime time.Duration, cellOps int64) (result, error) {
	if err := persistence(ctx, c, m); err != nil {
		return result{}, err
	}
	lim := limiter.Limit{Algorithm: limiter.FixedWindow, Requests: 1_000_000_000, Window: time.Hour, FailureMode: limiter.FailureModeClosed, Durability: m.durability}
	for i := range min(n, 64) { // every connection of the pool dialed before measuring
		if _, err := l.Allow(ctx, key(i), limiter.Limit{Algorithm: limiter.FixedWindow, Requests: 1_000_000_000, Window: time.Hour}, 1); err != nil {
			return result{}, fmt.Errorf("warm-up: %w", err)
		}
	}
	unacked0 := unackedOf(l.Stats())
	proc0 := processCPU()
	cpu0, err := machine.RedisCPU(ctx, c)
	if err != nil {
		return result{}, err
	}
	cctx, cancel := context.WithTimeout(ctx, cellTime)
	defer cancel()
	var next atomic.Int64
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
				r, err := l.Allow(ctx, key(int(i%keys)), lim, 1)
				if err == nil && (r.Source != limiter.SourceRedis || !r.Allowed) {
					err = fmt.Errorf("decision from %s, allowed %t: %v", r.Source, r.Allowed, r.Err)
				}
				if err != nil {
					once.Do(func() { first = err; cancel() })
					return
				}
				lat[w] = append(lat[w], time.Since(t0))
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	if first != nil {
		return result{}, first
	}
	proc1 := processCPU()
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
		cpuPerOp: (cpu1 - cpu0) / time.Duration(len(all)), procPerOp: (proc1 - proc0) / time.Duration(len(all)),
		unacked: unackedOf(l.Stats()) - unacked0}, nil
}

// cellKey names a cell: a mode at a number of callers.
type cellKey struct {
	mode        string
	concurrency int
}

// summary is the median of a cell's runs.
type summary struct {
	runs                  int
	perSec, cpuUs, procUs float64
	p50, p99              time.Duration
	unacked, ops          int64
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
		cpuUs:  med(func(r result) float64 { return float64(r.cpuPerOp) / 1e3 }),
		procUs: med(func(r result) float64 { return float64(r.procPerOp) / 1e3 }),
		p50:    time.Duration(med(func(r result) float64 { return float64(r.p50) })),
		p99:    time.Duration(med(func(r result) float64 { return float64(r.p99) }))}
	for _, r := range rs {
		s.unacked += r.unacked
		s.ops += r.ops
	}
	return s
}

func printTable(command, server, load string, rounds int, cellTime time.Duration, cellOps int64, concs []int, results map[cellKey][]result) {
	fmt.Printf("`%s`: one master and one replica (%s, loopback, `replicaof`), each run at most %s or %d decisions; "+
		"with the replica healthy, %d runs per cell, the modes alternating; %s, %d cores; load average %s at start, %s at end.\n\n",
		command, server, cellTime, cellOps, rounds, runtime.Version(), runtime.NumCPU(), load, machine.LoadAverage())
	fmt.Println("A decision is the limiter's Allow of one unit on a FixedWindow rule, leases off, so every one is a grant in Redis; " +
		"with durability the limiter sends `WAIT 1 <ms>` or `WAITAOF 1 0 <ms>` after the EVALSHA in the same pipeline. " +
		"\"plain\" rows set the master's append-only file (CONFIG SET appendonly, appendfsync) with no durability on the rule. " +
		"\"stalled\": the replica is stopped (SIGSTOP), so every WAIT runs to its timeout, noticed on the master's next event-loop tick (hz 10). " +
		"Master CPU: INFO cpu's used_cpu_sys+used_cpu_user over the run (replication and the file included) per decision; " +
		"process CPU: this process's getrusage (limiter, go-redis, callers) per decision. Values are medians over the runs; " +
		"\"vs plain\": against the plain rule without persistence at the same callers. Unacknowledged: grants answered without " +
		"their acknowledgement (the limiter's stats: timed out, unsupported, failed, or sent without a wait because every waiting pipeline was taken; on a Redis before 7.2 every WAITAOF is an unknown command).")
	fmt.Println()
	fmt.Println("| rule | callers | runs | decisions/s | vs plain | p50 | p99 | master CPU µs/decision | vs plain | process CPU µs/decision | vs plain | unacknowledged |")
	fmt.Println("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
	for _, m := range modes {
		for _, n := range concs {
			rs := results[cellKey{m.name, n}]
			if len(rs) == 0 {
				continue
			}
			s, a := summarize(rs), summarize(results[cellKey{modes[0].name, n}])
			unacked := "–"
			if m.durability.Mode != "" {
				unacked = fmt.Sprintf("%d of %d", s.unacked, s.ops)
			}
			fmt.Printf("| %s | %d | %d | %.0f | %.2fx | %s | %s | %.1f | %.2fx | %.1f | %.2fx | %s |\n", m.name, n, s.runs, s.perSec, s.perSec/a.perSec,
				fmtDur(s.p50), fmtDur(s.p99), s.cpuUs, s.cpuUs/a.cpuUs, s.procUs, s.procUs/a.procUs, unacked)
		}
	}
}

func fmtDur(d time.Duration) string {
	if d >= time.Millisecond {
		return fmt.Sprintf("%.2f ms", float64(d)/1e6)
	}
	return fmt.Sprintf("%d µs", d.Microseconds())
}

// serverVersion names the master's server and version from INFO server: "Valkey 8.0.1" or
// "Redis 7.0.15".
func serverVersion(ctx context.Context, c *redis.Client) string {
	info, err := c.Info(ctx, "server").Result()
	if err != nil {
		return "version unknown: " + err.Error()
	}
	fields := map[string]string{}
	for line := range strings.Lines(info) {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok {
			fields[k] = v
		}
	}
	if v := fields["valkey_version"]; v != "" {
		return "Valkey " + v
	}
	return "Redis " + fields["redis_version"]
}
