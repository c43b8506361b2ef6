// Command budgetcost measures what a token budget costs, side by side in one run on real parts:
// the sidecar built from the working tree as a process, a real redis-server, and the fake model
// API (internal/testutil/fakemodel) in this process as the application.
//
//	go run ./cmd/budgetcost -root ../.. [-responses 600] [-rounds 3] [-inflight 300]
//
// Issue 28's budgets, each measured through a sidecar whose rule is a token budget and one
// whose rule counts requests (the same binary, the same application, the same Redis):
//
//  1. Sidecar CPU per streamed response: closed-loop OpenAI chat streams of -tokens output
//     tokens; the budget reads and sizes the body, holds, writes the output cap, asks for the
//     usage, scans and strips it, and settles. The sidecar's utime+stime over the load
//     (/proc/<pid>/stat) divided by the responses; the two alternate for -rounds rounds.
//  2. The latency the request-body read adds: end to end, one client sending one non-streamed
//     request at a time with a 2 KB and a 200 KB body straight to the application and through
//     each sidecar (total time; the response is short), p50 and p99, in alternating blocks;
//     and in this process, the less noisy numbers: the read alone (meter.ReadBody against
//     io.ReadAll of the same body, timed inside a handler) and the sizing steps after it
//     (tokens.ScanRequest, tokens.SetOutputCap).
//  3. Memory per in-flight hold: Redis bytes per open hold (MEMORY USAGE of a key's hold
//     records at 1,000 and 10,000 open holds, and used_memory's growth), and the sidecar's Go
//     heap per in-flight stream (HeapAlloc after a forced GC with -inflight slow streams open,
//     against at rest, divided by them): the budget's less the request count's is the hold's.
//
// The report, markdown, goes to stdout; progress to stderr. Nothing is asserted about speed: a
// loaded machine gives slower numbers, never a failure. What is checked is that each side did
// its work (every response whole and 200, the budget's holds settled with the usage the
// stream reported, the in-flight holds open in Redis), so that a number is never of a path
// that did not run. Every process this command starts ends on success, failure or Ctrl-C, and
// every loop is bounded in count and in time.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/redline-dev/redline/hack/bench/internal/machine"
)

// options are the command's flags.
type options struct {
	root         string
	responses    int64
	rounds       int
	concurrency  int
	tokens       int64
	cellTime     time.Duration
	latencyReqs  int
	readBodyReqs int
	inflight     int
	timeout      time.Duration
}

var began = time.Now()

func progress(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "[%6.1fs] %s\n", time.Since(began).Seconds(), fmt.Sprintf(format, args...))
}

func main() {
	var o options
	flag.StringVar(&o.root, "root", "../..", "the product module's directory (its ./cmd/sidecar is built and measured)")
	flag.Int64Var(&o.responses, "responses", 600, "streamed responses measured per run of the CPU section")
	flag.IntVar(&o.rounds, "rounds", 3, "runs of the CPU section per sidecar, the two alternating")
	flag.IntVar(&o.concurrency, "concurrency", 8, "clients in the CPU section's closed loop")
	flag.Int64Var(&o.tokens, "tokens", 500, "output tokens of each streamed response")
	flag.DurationVar(&o.cellTime, "cell-time", 15*time.Second, "longest measured load of one CPU run")
	flag.IntVar(&o.latencyReqs, "latency-requests", 300, "requests per body size and path in the end-to-end latency section")
	flag.IntVar(&o.readBodyReqs, "readbody-requests", 2000, "requests per body size and reader in the in-process read section")
	flag.IntVar(&o.inflight, "inflight", 300, "slow streams held open at once in the sidecar heap section")
	flag.DurationVar(&o.timeout, "timeout", 4*time.Minute, "give up after this long")
	flag.Parse()
	if o.responses < 1 || o.rounds < 1 || o.concurrency < 1 || o.tokens < 1 || o.cellTime <= 0 ||
		o.latencyReqs < 10 || o.readBodyReqs < 10 || o.inflight < 1 {
		fmt.Fprintln(os.Stderr, "budgetcost: -responses, -rounds, -concurrency, -tokens, -cell-time and -inflight must be positive; -latency-requests and -readbody-requests at least 10")
		os.Exit(2)
	}
	if err := run(o, strings.TrimSpace("go run ./cmd/budgetcost "+strings.Join(os.Args[1:], " "))); err != nil {
		fmt.Fprintln(os.Stderr, "budgetcost:", err)
		os.Exit(1)
	}
}

// report is everything measured, printed at the end.
type report struct {
	command, loadStart, loadEnd string
	cpu                         [2][]cpuSample // by path: plain, budget
	latency                     []latencyCell
	readBody                    []readBodyCell
	sizing                      []sizingCell
	redisHolds                  []redisHoldRow
	heap                        [2][]heapSample
}

func run(o options, command string) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	dir, err := os.MkdirTemp("", "redline-budgetcost-")
	if err != nil {
		return fmt.Errorf("creating a work directory: %w", err)
	}
	defer func() { _ = os.RemoveAll(dir) }()
	root, err := filepath.Abs(o.root)
	if err != nil {
		return fmt.Errorf("resolving -root: %w", err)
	}
	rep := &report{command: command, loadStart: machine.LoadAverage()}

	// The read alone needs nothing else running: first, on a quiet process.
	progress("reading bodies in this process (%d requests per size and reader)", o.readBodyReqs)
	if rep.readBody, err = measureReadBody(ctx, o.readBodyReqs); err != nil {
		return err
	}
	// A tenth as many: a 200 KB body takes milliseconds a step.
	if rep.sizing, err = measureSizing(max(o.readBodyReqs/10, 10)); err != nil {
		return err
	}
	progress("Redis bytes per open hold (in-process limiter, its own redis-server)")
	if rep.redisHolds, err = measureRedisHolds(ctx); err != nil {
		return err
	}

	b, err := startBench(ctx, root, dir, o)
	if err != nil {
		return err
	}
	defer b.close()

	progress("CPU per streamed response: %d rounds of %d responses per sidecar", o.rounds, o.responses)
	for r := range o.rounds {
		for _, p := range roundOrder(r) {
			s, err := measureCPU(ctx, o, b, p)
			if err != nil {
				return fmt.Errorf("CPU round %d, %s: %w\nthe sidecar's log ends:\n%s", r+1, pathNames[p], err, b.sidecars[p].LogTail(2000))
			}
			progress("round %d %-6s: %.0f µs CPU/response, %.0f responses/s", r+1, pathNames[p], float64(s.perResponse)/1e3, s.perSec)
			rep.cpu[p] = append(rep.cpu[p], s)
		}
	}

	progress("end-to-end latency: %d requests per body size and path", o.latencyReqs)
	if rep.latency, err = measureLatency(ctx, o, b); err != nil {
		return err
	}

	progress("sidecar heap with %d slow streams in flight, %d rounds", o.inflight, o.rounds)
	for r := range o.rounds {
		for _, p := range roundOrder(r) {
			s, err := measureHeap(ctx, o, b, p)
			if err != nil {
				return fmt.Errorf("heap round %d, %s: %w\nthe sidecar's log ends:\n%s", r+1, pathNames[p], err, b.sidecars[p].LogTail(2000))
			}
			progress("round %d %-6s: %.1f KiB heap per in-flight stream, %d holds open in Redis", r+1, pathNames[p], s.perStream()/1024, s.holdsInRedis)
			rep.heap[p] = append(rep.heap[p], s)
		}
	}
	if err := b.checkHealthy(ctx); err != nil {
		return err
	}
	rep.loadEnd = machine.LoadAverage()
	printReport(o, rep)
	return nil
}

// The two sidecars measured: the same binary, the same application; one rule each.
const (
	pathPlain = iota
	pathBudget
)

var pathNames = [2]string{"plain", "budget"}

// roundOrder is the order of the two sidecars in round r: which goes first swaps every round,
// so that neither always runs on the machine the other left.
func roundOrder(r int) []int {
	if r%2 == 1 {
		return []int{pathBudget, pathPlain}
	}
	return []int{pathPlain, pathBudget}
}
