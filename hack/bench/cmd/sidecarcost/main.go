// Command sidecarcost measures what a decision costs, side by side in one run: the sidecar built
// from a base revision (-base REV, any revision git knows; HEAD unless set, so that by default it
// measures what the working tree's uncommitted changes cost, and on a clean tree the noise of two
// equal builds) against the one built from the working tree. Per decision: the sidecar's CPU
// (utime+stime of the process over the load, from /proc/<pid>/stat, divided by the decisions
// answered) and Redis's (used_cpu_sys+used_cpu_user of INFO cpu over the same load, the scripts,
// their parsing and replies included), and the sidecar's resident memory under load (the largest
// VmRSS sampled every 50 ms, and VmHWM at the end), and the Go heap's allocations per decision
// (go_memstats_mallocs_total; the progress lines add their bytes, the collections per 1,000
// decisions and the heap goal: where the live heap is under 4 MiB, every 4 MiB allocated costs
// a collection). The budget: within 10% of the base for the sidecar's CPU and RSS.
//
//	go run ./cmd/sidecarcost -root ../.. [-base REV] [-rounds 5] [-ops 20000] [-faces check,rls]
//
// Cells: leases on (the default horizon) and off (--lease-horizon=0), one hot key and 1,000 keys,
// FixedWindow and SlidingWindowCounter (limits never reached, so every decision is an admission),
// 16 clients in a closed loop on /v1/check and on the Envoy RLS gRPC face. Each cell runs
// -rounds times per version, base and now alternating (which goes first swaps every round), each
// run on a fresh redis-server and a fresh sidecar, so that VmHWM is the cell's own. The table
// gives the median and the minimum over the rounds and the ratio now/base of the medians.
//
// The base tree comes from git archive into a temporary directory, built there with its own
// go.mod; each version's scripts (what the manager would load: its redisacl.SidecarScripts) are
// printed by a small program run inside its own tree, and loaded here with SCRIPT LOAD before
// its sidecar starts. Only flags both builds know are passed. Every process this command starts
// ends on success, failure or Ctrl-C; every load loop is bounded in count and in time.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redline-dev/redline/internal/testutil/sidecarproc"

	"github.com/redline-dev/redline/hack/bench/internal/machine"
)

const (
	namespace = "bench"
	policy    = "cost"
	keyHeader = "x-key"
	// limit per window is never reached: every decision admits, and with leases off runs the
	// script in Redis.
	limit  = 1_000_000_000
	window = time.Minute
)

// redisTimeout is both sidecars' --redis-timeout: long enough that on a loaded machine the
// decisions measured are Redis's, not the failure mode's (which cost the sidecar less), so that
// the two versions do the same work.
const redisTimeout = time.Second

// rules maps each algorithm measured to its rule's name in the policy.
var rules = map[string]string{"FixedWindow": "fw", "SlidingWindowCounter": "swc"}

var algorithms = []string{"FixedWindow", "SlidingWindowCounter"}

// options are the command's flags.
type options struct {
	root, base  string
	rounds      int
	ops         int64
	cellTime    time.Duration
	concurrency int
	faces       []string
	keys        []int
	timeout     time.Duration
	// pprofDir, when set, gets a CPU profile of every run (the sidecar's --pprof, fetched over
	// the first pprofSeconds of the measured load), named <version>-<cell>-r<round>.pprof, and
	// a heap profile after the load beside it (.heap.pprof).
	pprofDir     string
	pprofSeconds int
}

var began = time.Now()

func progress(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "[%6.1fs] %s\n", time.Since(began).Seconds(), fmt.Sprintf(format, args...))
}

func main() {
	var o options
	var faces, keys string
	flag.StringVar(&o.root, "root", "../..", "the product module's directory (the working tree measured as now)")
	flag.StringVar(&o.base, "base", "HEAD", "the revision measured as the base (a commit, a branch, a tag; HEAD: what the uncommitted changes cost)")
	flag.IntVar(&o.rounds, "rounds", 5, "runs of each cell per version")
	flag.Int64Var(&o.ops, "ops", 20000, "decisions measured per run")
	flag.DurationVar(&o.cellTime, "cell-time", 15*time.Second, "longest measured load of one run")
	flag.IntVar(&o.concurrency, "concurrency", 16, "clients in the closed loop")
	flag.StringVar(&faces, "faces", "check,rls", "faces to load: check (/v1/check), rls (Envoy RLS gRPC)")
	flag.StringVar(&keys, "keys", "1,1000", "key counts of the cells")
	flag.DurationVar(&o.timeout, "timeout", 20*time.Minute, "give up after this long")
	flag.StringVar(&o.pprofDir, "pprof-dir", "", "write a CPU profile of every run here (turns the sidecars' --pprof on; the CPU figures then include the profiler's cost)")
	flag.IntVar(&o.pprofSeconds, "pprof-seconds", 2, "length of each profile, within the measured load")
	flag.Parse()
	err := parseLists(&o, faces, keys)
	if err == nil {
		err = run(o, strings.TrimSpace("go run ./cmd/sidecarcost "+strings.Join(os.Args[1:], " ")))
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "sidecarcost:", err)
		os.Exit(1)
	}
}

func parseLists(o *options, faces, keys string) error {
	for f := range strings.SplitSeq(faces, ",") {
		if f != faceCheck && f != faceRLS {
			return fmt.Errorf("-faces: unknown face %q (check or rls)", f)
		}
		o.faces = append(o.faces, f)
	}
	for k := range strings.SplitSeq(keys, ",") {
		n, err := strconv.Atoi(k)
		if err != nil || n < 1 {
			return fmt.Errorf("-keys: %q is not a positive count", k)
		}
		o.keys = append(o.keys, n)
	}
	if o.rounds < 1 || o.ops < 1 || o.concurrency < 1 || o.cellTime <= 0 {
		return errors.New("-rounds, -ops, -concurrency and -cell-time must be positive")
	}
	return nil
}

const (
	faceCheck = "check"
	faceRLS   = "rls"
)

var faceNames = map[string]string{faceCheck: "/v1/check", faceRLS: "Envoy RLS"}

// version is one build of the sidecar and the scripts its manager would load.
type version struct {
	name    string
	bin     string
	scripts []script
}

// script is what the printing program writes per script.
type script struct{ Name, Source string }

// cell is one combination measured.
type cell struct {
	face, algorithm string
	keys            int
	leases          bool
}

// sample is one run of a cell on one version.
type sample struct {
	cpuPerDecision time.Duration
	// redisPerDecision is the redis-server's CPU over the same load, per decision.
	redisPerDecision time.Duration
	rssPeakMiB       float64
	hwmMiB           float64
	perSec           float64
	degraded         float64
	// allocs and allocBytes are the Go heap's allocations per decision (the metrics scrapes
	// before and after the load add their own, a few hundred in all).
	allocs, allocBytes float64
	// gcsPer1k is the collections per 1,000 decisions, nextGCMiB the heap goal at the end.
	gcsPer1k, nextGCMiB float64
}

func run(o options, command string) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	dir, err := os.MkdirTemp("", "redline-sidecarcost-")
	if err != nil {
		return fmt.Errorf("creating a work directory: %w", err)
	}
	defer func() { _ = os.RemoveAll(dir) }()
	root, err := filepath.Abs(o.root)
	if err != nil {
		return fmt.Errorf("resolving -root: %w", err)
	}
	versions, err := buildVersions(ctx, o, root, dir)
	if err != nil {
		return err
	}
	files, err := writeSidecarFiles(filepath.Join(dir, "files"))
	if err != nil {
		return err
	}
	upstream, stopUpstream, err := startUpstream()
	if err != nil {
		return err
	}
	defer stopUpstream()

	var cells []cell
	for _, face := range o.faces {
		for _, leases := range []bool{true, false} {
			for _, keys := range o.keys {
				for _, alg := range algorithms {
					cells = append(cells, cell{face: face, algorithm: alg, keys: keys, leases: leases})
				}
			}
		}
	}
	results := make(map[cell]*[2][]sample, len(cells))
	for _, c := range cells {
		results[c] = &[2][]sample{}
	}
	load := machine.LoadAverage()
	for r := range o.rounds {
		for _, c := range cells {
			order := []int{0, 1}
			if r%2 == 1 {
				order = []int{1, 0}
			}
			for _, i := range order {
				profile := ""
				if o.pprofDir != "" {
					profile = filepath.Join(o.pprofDir, fmt.Sprintf("%s-%s-%s-%d-%s-r%d.pprof", versions[i].name, c.face, c.algorithm, c.keys, leasesWord(c.leases), r+1))
				}
				s, err := measure(ctx, o, versions[i], c, files, upstream, filepath.Join(dir, "logs"), profile)
				if err != nil {
					return fmt.Errorf("round %d, %s, %s: %w", r+1, versions[i].name, c, err)
				}
				progress("round %d %-4s %s: %.1f µs/decision, Redis %.1f µs/decision, %.1f allocs (%.0f B)/decision, %.2f GCs/1k decisions, heap goal %.1f MiB, RSS peak %.1f MiB, HWM %.1f MiB, %.0f/s, degraded %.0f",
					r+1, versions[i].name, c, float64(s.cpuPerDecision)/1e3, float64(s.redisPerDecision)/1e3, s.allocs, s.allocBytes, s.gcsPer1k, s.nextGCMiB, s.rssPeakMiB, s.hwmMiB, s.perSec, s.degraded)
				results[c][i] = append(results[c][i], s)
			}
		}
	}
	printTable(o, command, load, versions, cells, results)
	return nil
}

// buildVersions builds the sidecar of o.base (extracted under dir) and of the tree at root,
// and reads the scripts each runs.
func buildVersions(ctx context.Context, o options, root, dir string) ([2]*version, error) {
	baseTree := filepath.Join(dir, "base-tree")
	versions := [2]*version{{name: o.base}, {name: "now"}}
	commit, err := resolve(ctx, root, o.base)
	if err != nil {
		return versions, err
	}
	versions[0].name = commit
	progress("extracting %s (%s) into %s", o.base, commit, baseTree)
	if err := extract(ctx, root, commit, baseTree); err != nil {
		return versions, err
	}
	for i, tree := range []string{baseTree, root} {
		v := versions[i]
		out := filepath.Join(dir, "bin-"+strconv.Itoa(i))
		if err := os.Mkdir(out, 0o755); err != nil {
			return versions, fmt.Errorf("creating %s: %w", out, err)
		}
		progress("building ./cmd/sidecar of %s", v.name)
		if v.bin, err = sidecarproc.Build(ctx, tree, out); err != nil {
			return versions, err
		}
		if v.scripts, err = printScripts(ctx, tree, dir); err != nil {
			return versions, fmt.Errorf("reading the scripts of %s: %w", v.name, err)
		}
	}
	return versions, nil
}

func (c cell) String() string {
	return fmt.Sprintf("%s %s %d keys %s", faceNames[c.face], c.algorithm, c.keys, leasesWord(c.leases))
}
