// Command ratelimitcompare measures Redline's Envoy rate limit service (the sidecar's gRPC face)
// side by side with envoyproxy/ratelimit, the reference implementation of the same API, on one
// redis-server, with one closed-loop grpc-go client, in one run.
//
// Both servers enforce a fixed window of 1,000,000 per minute per key (never reached) over
// 10,000 keys and receive the same request bytes. Each cell (server, callers, round) starts on
// an empty Redis with reset command statistics; servers alternate within a round and which one
// goes first alternates between rounds, so that drift on a shared machine hits both alike.
//
//	go build -o /tmp/ratelimit ./src/service_cmd            # in a checkout of envoyproxy/ratelimit
//	ENVOY_RATELIMIT_BIN=/tmp/ratelimit make compare-envoy   # in this repository
//
// It needs redis-server on PATH (or $REDIS_SERVER) and go (to build the sidecar).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redline-dev/redline/internal/testutil/redistest"
	"github.com/redline-dev/redline/internal/testutil/sidecarproc"
)

// The two servers, in table order.
const (
	serverEnvoy   = "envoyproxy/ratelimit"
	serverSidecar = "redline sidecar"
)

// Options are the command's flags.
type Options struct {
	EnvoyBin     string
	EnvoyCommit  string
	Root         string
	Out          string
	Duration     time.Duration
	Rounds       int
	Callers      []int
	Keys         int
	Conns        int
	Warmup       int
	EnvoyEnv     []string
	SidecarArgs  []string
	KeepTempDirs bool
}

// Cell is one server at one concurrency in one round.
type Cell struct {
	Server  string
	Callers int
	Round   int
	Result
	// RedisCalls are the Redis commands the cell ran, by name (INFO commandstats).
	RedisCalls map[string]int64
	// RedisKeys is how many of the server's keys Redis held after the cell.
	RedisKeys int
	// Degraded counts sidecar decisions made by the failure mode instead of Redis.
	Degraded float64
	// RoundTrips is the sidecar's Redis round trips per Redis decision (batching).
	RoundTrips float64
	// CPU is what the server, the client (this process) and redis-server spent during the
	// measured cell; zero where /proc does not say.
	CPU struct{ Server, Client, Redis time.Duration }
}

type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, " ") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

var began = time.Now()

func progress(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "[%6.1fs] %s\n", time.Since(began).Seconds(), fmt.Sprintf(format, args...))
}

func main() {
	o, err := parseFlags(os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, "ratelimitcompare:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o); err != nil {
		fmt.Fprintln(os.Stderr, "ratelimitcompare:", err)
		os.Exit(1)
	}
}

func parseFlags(args []string) (Options, error) {
	var o Options
	fs := flag.NewFlagSet("ratelimitcompare", flag.ContinueOnError)
	fs.StringVar(&o.EnvoyBin, "envoy-ratelimit", os.Getenv("ENVOY_RATELIMIT_BIN"), "envoyproxy/ratelimit's server binary, built from its ./src/service_cmd (default $ENVOY_RATELIMIT_BIN)")
	fs.StringVar(&o.EnvoyCommit, "envoy-ratelimit-commit", "", "the envoyproxy/ratelimit commit the binary was built from, for the report (default: the revision Go stamped into it, if any)")
	fs.StringVar(&o.Root, "root", "../..", "root of the Redline repository (the sidecar is built from its ./cmd/sidecar)")
	fs.StringVar(&o.Out, "out", "", "also write the markdown report to this file")
	fs.DurationVar(&o.Duration, "duration", 5*time.Second, "measured time of each cell")
	fs.IntVar(&o.Rounds, "rounds", 3, "rounds of every cell; the servers alternate in each")
	callers := fs.String("callers", "16,256", "concurrent callers of the cells, comma-separated")
	fs.IntVar(&o.Keys, "keys", 10000, "distinct keys the callers cycle through")
	fs.IntVar(&o.Conns, "conns", 1, "gRPC connections of the client to each server (callers share them round robin)")
	fs.IntVar(&o.Warmup, "warmup", 0, "requests sent before each cell is measured (default: twice the keys, so that both servers are measured in their steady state, every key seen before)")
	fs.Var((*listFlag)(&o.EnvoyEnv), "envoy-env", "extra KEY=VALUE for envoyproxy/ratelimit's environment (repeatable), e.g. REDIS_PIPELINE_WINDOW=150us")
	fs.Var((*listFlag)(&o.SidecarArgs), "sidecar-arg", "extra flag for the sidecar (repeatable), e.g. --max-procs=2")
	fs.BoolVar(&o.KeepTempDirs, "keep", false, "keep the temporary directory (server logs) after the run")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if o.EnvoyBin == "" {
		return o, errors.New("no envoyproxy/ratelimit binary: pass -envoy-ratelimit=PATH or set ENVOY_RATELIMIT_BIN (build it with `go build -o PATH ./src/service_cmd` in a checkout of envoyproxy/ratelimit)")
	}
	for f := range strings.SplitSeq(*callers, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return o, fmt.Errorf("-callers: %q is not a positive number", f)
		}
		o.Callers = append(o.Callers, n)
	}
	for _, kv := range o.EnvoyEnv {
		if k, _, ok := strings.Cut(kv, "="); !ok || k == "" {
			return o, fmt.Errorf("-envoy-env %q: want KEY=VALUE", kv)
		}
	}
	switch {
	case o.Duration <= 0:
		return o, errors.New("-duration must be positive")
	case o.Rounds < 1:
		return o, errors.New("-rounds must be at least 1")
	case o.Keys < 1:
		return o, errors.New("-keys must be at least 1")
	case o.Conns < 1:
		return o, errors.New("-conns must be at least 1")
	case o.Warmup < 0:
		return o, errors.New("-warmup must not be negative")
	}
	if o.Warmup == 0 {
		o.Warmup = 2 * o.Keys
	}
	return o, nil
}

func run(ctx context.Context, o Options) error {
	bin, err := envoyBinary(&o)
	if err != nil {
		return err
	}
	root, err := filepath.Abs(o.Root)
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "ratelimitcompare-")
	if err != nil {
		return err
	}
	if o.KeepTempDirs {
		progress("logs and configuration in %s", dir)
	} else {
		defer os.RemoveAll(dir)
	}
	redisBin, err := redistest.Binary()
	if err != nil {
		return err
	}
	loadStart := loadAverage()
	progress("building the sidecar from %s", root)
	sidecarBin, err := sidecarproc.Build(ctx, root, dir)
	if err != nil {
		return err
	}
	rs, err := redistest.Start()
	if err != nil {
		return fmt.Errorf("starting redis-server: %w", err)
	}
	defer rs.Close()
	rc := redis.NewClient(&redis.Options{Addr: rs.Addr()})
	defer rc.Close()

	envoy, err := startEnvoyRatelimit(ctx, bin, dir, rs.Addr(), o.EnvoyEnv)
	if err != nil {
		return err
	}
	defer func() { _ = envoy.Stop(stopGrace) }()
	sc, err := startSidecar(ctx, sidecarBin, dir, rs.URL(), o.SidecarArgs)
	if err != nil {
		return err
	}
	defer func() { _ = sc.Stop(stopGrace) }()
	progress("redis-server on %s, envoyproxy/ratelimit gRPC on %s, sidecar gRPC on %s", rs.Addr(), envoy.GRPC, sc.GRPC)

	pids := map[string]cellPIDs{
		serverEnvoy:   {server: envoy.Pid(), redis: rs.Pid()},
		serverSidecar: {server: sc.Pid(), redis: rs.Pid()},
	}
	clients := map[string]*client{}
	for name, addr := range map[string]string{serverEnvoy: envoy.GRPC, serverSidecar: sc.GRPC} {
		c, err := newClient(addr, o.Conns, o.Keys)
		if err != nil {
			return err
		}
		defer c.close()
		clients[name] = c
	}
	patterns := map[string]string{
		serverEnvoy:   domain + "_generic_key_" + domain + "/" + benchRule + "_*",
		serverSidecar: "rl:{" + domain + "/" + domain + "/" + benchRule + "/*",
	}
	if err := probeBoth(ctx, clients); err != nil {
		return err
	}

	cells, err := runRounds(ctx, o, rc, clients, sc, pids, patterns)
	if err != nil {
		return err
	}
	meta := Meta{
		Date: began.UTC().Format("2006-01-02 15:04 UTC"), EnvoyCommit: o.EnvoyCommit, CPU: cpuModel(), Cores: cores(),
		Go: runtime.Version(), Redis: redisVersion(redisBin), LoadStart: loadStart, LoadEnd: loadAverage(),
		Duration: o.Duration, Rounds: o.Rounds, Keys: o.Keys, Conns: o.Conns, Warmup: o.Warmup, EnvoyEnv: o.EnvoyEnv, SidecarArgs: o.SidecarArgs,
	}
	return writeReport(o, renderReport(meta, o.Callers, cells))
}

// envoyBinary is the absolute path of o.EnvoyBin, which must be a file; it fills in
// o.EnvoyCommit from the binary when not given.
func envoyBinary(o *Options) (string, error) {
	bin, err := filepath.Abs(o.EnvoyBin)
	if err != nil {
		return "", err
	}
	if st, err := os.Stat(bin); err != nil || st.IsDir() {
		return "", fmt.Errorf("envoyproxy/ratelimit binary %s: not a file (%v)", bin, err)
	}
	if o.EnvoyCommit == "" {
		o.EnvoyCommit = binaryRevision(bin)
	}
	return bin, nil
}

// probeBoth checks that both servers admit once and then refuse under a 1/min limit.
func probeBoth(ctx context.Context, clients map[string]*client) error {
	for _, name := range []string{serverEnvoy, serverSidecar} {
		if err := clients[name].probe(ctx, "probe-"+strconv.FormatInt(time.Now().UnixNano(), 36)); err != nil {
			return fmt.Errorf("%s does not enforce: %w", name, err)
		}
	}
	progress("both servers admit once and then refuse under a 1/min limit")
	return nil
}

// runRounds measures both servers at every concurrency, o.Rounds times, which one goes
// first swapping every round.
func runRounds(ctx context.Context, o Options, rc *redis.Client, clients map[string]*client, sc *sidecar, pids map[string]cellPIDs, patterns map[string]string) ([]Cell, error) {
	var cells []Cell
	for round := 1; round <= o.Rounds; round++ {
		for _, callers := range o.Callers {
			order := []string{serverEnvoy, serverSidecar}
			if round%2 == 0 {
				slices.Reverse(order)
			}
			for _, name := range order {
				c, err := runCell(ctx, o, rc, clients[name], sc, pids[name], name, patterns[name], callers, round)
				if err != nil {
					return nil, fmt.Errorf("%s, %d callers, round %d: %w", name, callers, round, err)
				}
				progress("round %d  %-21s c=%-4d %8.0f/s  p50 %-8s p99 %-8s errors %d %.120s  redis %s", round, name, callers,
					c.PerSec, c.P50.Round(time.Microsecond), c.P99.Round(time.Microsecond), c.Errors, c.FirstErr, formatPerDecision(c.RedisCalls, c.Decisions+c.Errors, name == serverSidecar))
				cells = append(cells, c)
			}
		}
	}
	return cells, nil
}

// writeReport prints the report and writes it to o.Out, if set.
func writeReport(o Options, report string) error {
	fmt.Print(report)
	if o.Out != "" {
		if err := os.MkdirAll(filepath.Dir(o.Out), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(o.Out, []byte(report), 0o644); err != nil {
			return fmt.Errorf("writing %s: %w", o.Out, err)
		}
		progress("report written to %s", o.Out)
	}
	return nil
}

// cellPIDs are the processes whose CPU a cell reports besides this one (the client).
type cellPIDs struct{ server, redis int }

// cpu reads the server's, this process's and redis-server's CPU time; 0 where it cannot.
func (p cellPIDs) cpu() [3]time.Duration {
	var out [3]time.Duration
	for i, pid := range []int{p.server, os.Getpid(), p.redis} {
		if pid > 0 {
			out[i], _ = sidecarproc.CPUTime(pid)
		}
	}
	return out
}

// runCell measures one server at one concurrency on an emptied Redis.
func runCell(ctx context.Context, o Options, rc *redis.Client, c *client, sc *sidecar, pids cellPIDs, name, pattern string, callers, round int) (Cell, error) {
	cell := Cell{Server: name, Callers: callers, Round: round}
	if err := rc.FlushAll(ctx).Err(); err != nil {
		return cell, fmt.Errorf("FLUSHALL: %w", err)
	}
	// A cell may leave a server degraded (the sidecar's breaker opens when Redis answers
	// slower than its timeout); the next starts once it decides again.
	if err := c.waitOK(ctx, 30*time.Second); err != nil {
		return cell, err
	}
	if err := warmUp(ctx, c, o.Warmup); err != nil {
		return cell, err
	}
	// The counters the warm-up wrote stay: the sidecar's leases were carved from them, and
	// both servers go on counting in them as they would in the steady state.
	if err := resetStats(ctx, rc); err != nil {
		return cell, err
	}
	before, err := sc.counters(ctx)
	if err != nil {
		return cell, err
	}
	cpu0 := pids.cpu()
	cell.Result = closedLoop(ctx, c, callers, o.Duration)
	cpu1 := pids.cpu()
	cell.CPU.Server, cell.CPU.Client, cell.CPU.Redis = cpu1[0]-cpu0[0], cpu1[1]-cpu0[1], cpu1[2]-cpu0[2]
	if ctx.Err() != nil {
		return cell, ctx.Err()
	}
	after, err := sc.counters(ctx)
	if err != nil {
		return cell, err
	}
	if cell.RedisCalls, cell.RedisKeys, err = redisAfter(ctx, rc, pattern); err != nil {
		return cell, err
	}
	if name == serverSidecar {
		cell.Degraded = after.Degraded - before.Degraded
		if d := after.RedisDecisions - before.RedisDecisions; d > 0 {
			cell.RoundTrips = (after.RoundTrips - before.RoundTrips) / d
		}
	}
	if cell.Decisions == 0 {
		return cell, fmt.Errorf("no decision succeeded, first error: %s", cell.FirstErr)
	}
	// Both servers keep a counter per key; one that answered without Redis would leave none.
	// (Not one per key: the sidecar's counters end with their aligned window, so a cell that
	// crosses a minute loses the keys not decided again since.)
	if cell.RedisKeys == 0 {
		return cell, fmt.Errorf("no key of its rule in Redis after %d decisions: it is not deciding in Redis", cell.Decisions)
	}
	return cell, nil
}
