// Command bench is Redline's benchmark report: one run on this machine that measures the
// sidecar's faces, the Redis round trips per decision, the accuracy of shared limits across
// replicas and the sidecar's memory, next to what this machine's Redis can do at most, and
// writes results/bench.md (tables), results/bench.png (chart) and results/bench.json (raw).
//
//	make bench                      # or: go run ./hack/bench [-out results] [-cell-time 2s]
//
// It starts its own redis-server (redis-server and redis-benchmark on PATH), a tiny upstream
// and sidecar processes (./cmd/sidecar, built once), all on loopback, and ends them all on
// success, failure or Ctrl-C. Every load loop is bounded in count and in time.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redline-dev/redline/hack/bench/internal/machine"
	"github.com/redline-dev/redline/internal/sidecar/contract"
	"github.com/redline-dev/redline/internal/testutil/redistest"
	"github.com/redline-dev/redline/internal/testutil/sidecarproc"
)

// Options are the command's flags.
type Options struct {
	Out             string
	Root            string
	Sidecar         string
	Concurrency     []int
	RTConcurrency   []int
	Replicas        []int
	CellTime        time.Duration
	WrkTime         time.Duration
	CellOps         int64
	CeilingRequests int
	Timeout         time.Duration
}

// Report is everything one run measured; bench.json is this, encoded.
type Report struct {
	Command    string          `json:"command"`
	Machine    Machine         `json:"machine"`
	Ceilings   []Ceiling       `json:"ceilings"`
	Faces      []FaceCell      `json:"faces"`
	RoundTrips []RoundTripCell `json:"roundTrips"`
	Accuracy   []AccuracyCell  `json:"accuracy"`
	Wrk        []WrkCell       `json:"wrk"`
	WrkSkipped string          `json:"wrkSkipped,omitempty"`
	Memory     Memory          `json:"memory"`
	Conns      Conns           `json:"redisConnections"`
}

// Memory is the first sidecar's resident set, and the other replicas' when idle.
type Memory struct {
	IdleMiB         float64   `json:"idleMiB"`
	PeakLoadMiB     float64   `json:"peakUnderLoadMiB"`
	AfterLoadMiB    float64   `json:"afterLoadMiB"`
	ReplicasIdleMiB []float64 `json:"replicasIdleMiB"`
}

var began = time.Now()

// progress prints a line to stderr with the seconds since start.
func progress(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "[%5.1fs] %s\n", time.Since(began).Seconds(), fmt.Sprintf(format, args...))
}

func main() {
	var o Options
	var conc, replicas, rtConc string
	flag.StringVar(&o.Out, "out", "results", "directory for bench.md, bench.png and bench.json")
	flag.StringVar(&o.Root, "root", "../..", "the product module's directory, where ./cmd/sidecar is built")
	flag.StringVar(&o.Sidecar, "sidecar", "", "a sidecar binary to use instead of building ./cmd/sidecar")
	flag.StringVar(&conc, "concurrency", "1,16,64", "concurrent clients of each face")
	flag.StringVar(&rtConc, "rt-concurrency", "1,16,256", "concurrent callers of the round-trip cells")
	flag.StringVar(&replicas, "replicas", "3,10", "replica counts of the accuracy cells")
	flag.DurationVar(&o.CellTime, "cell-time", 2*time.Second, "longest run of one load cell")
	flag.DurationVar(&o.WrkTime, "wrk-time", 8*time.Second, "length of each wrk run (needs wrk on PATH)")
	flag.Int64Var(&o.CellOps, "cell-ops", 200_000, "most operations of one load cell")
	flag.IntVar(&o.CeilingRequests, "ceiling-requests", 300_000, "redis-benchmark -n for the ceiling")
	flag.DurationVar(&o.Timeout, "timeout", 8*time.Minute, "give up after this long")
	flag.Parse()
	var err error
	if o.Concurrency, err = intList(conc); err == nil {
		o.Replicas, err = intList(replicas)
	}
	if err == nil {
		o.RTConcurrency, err = intList(rtConc)
	}
	if err == nil {
		err = run(o, "go run ./hack/bench "+strings.Join(os.Args[1:], " "))
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func intList(s string) ([]int, error) {
	var out []int
	for f := range strings.SplitSeq(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("bad list entry %q: want positive integers", f)
		}
		out = append(out, n)
	}
	return out, nil
}

func run(o Options, command string) (err error) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	rep := Report{Command: strings.TrimSpace(command), Machine: machineFacts()}
	rep.Machine.LoadAtStart = machine.LoadAverage()
	rep.Machine.StartedAtUTC = began.UTC().Format(time.RFC3339)
	progress("machine: %s, %d cores, %s, redis-server %s; load average %s",
		rep.Machine.CPU, rep.Machine.Cores, rep.Machine.Go, rep.Machine.Redis, rep.Machine.LoadAtStart)

	dir, err := os.MkdirTemp("", "redline-bench-")
	if err != nil {
		return fmt.Errorf("creating a work directory: %w", err)
	}
	defer func() { _ = os.RemoveAll(dir) }()
	bin := o.Sidecar
	if bin == "" {
		progress("building ./cmd/sidecar")
		if bin, err = sidecarproc.Build(ctx, o.Root, dir); err != nil {
			return err
		}
	}
	srv, err := redistest.Start()
	if err != nil {
		return fmt.Errorf("starting redis-server: %w", err)
	}
	defer func() { _ = srv.Close() }()
	upstream, stopUpstream, err := startUpstream()
	if err != nil {
		return err
	}
	defer stopUpstream()

	if err := measureRedis(ctx, o, srv, &rep); err != nil {
		return err
	}

	files, err := writeSidecarFiles(dir)
	if err != nil {
		return err
	}
	var sidecars []*Sidecar
	defer func() {
		for _, s := range sidecars {
			s.Stop()
		}
	}()
	first, err := startSidecar(ctx, bin, dir, "bench-0", files, srv.URL(), upstream)
	if err != nil {
		return err
	}
	sidecars = append(sidecars, first)
	if err := measureOne(ctx, o, dir, first, upstream, &rep); err != nil {
		return err
	}

	maxReplicas := 0
	for _, n := range o.Replicas {
		maxReplicas = max(maxReplicas, n)
	}
	progress("starting %d more sidecars for the accuracy cells", maxReplicas-1)
	for i := 1; i < maxReplicas; i++ {
		s, err := startSidecar(ctx, bin, dir, "bench-"+strconv.Itoa(i), files, srv.URL(), upstream)
		if err != nil {
			return err
		}
		sidecars = append(sidecars, s)
	}
	for _, s := range sidecars[1:] {
		rep.Memory.ReplicasIdleMiB = append(rep.Memory.ReplicasIdleMiB, rssMiB(s.Pid()))
	}
	if err := measureFleet(ctx, o, srv.URL(), sidecars, &rep); err != nil {
		return err
	}

	rep.Machine.LoadAtEnd = machine.LoadAverage()
	rep.Machine.WallSeconds = time.Since(began).Seconds()
	progress("load average at end %s", rep.Machine.LoadAtEnd)
	return writeReport(o.Out, &rep)
}

// measureRedis measures the round trips per decision of the in-process limiter, then the
// ceiling: redis-benchmark running the SlidingWindowCounter script.
func measureRedis(ctx context.Context, o Options, srv *redistest.Server, rep *Report) (err error) {
	// Round trips first: their cells load the scripts that redis-benchmark then runs.
	progress("round trips per decision, in-process limiter, %v callers", o.RTConcurrency)
	if rep.RoundTrips, err = runRoundTrips(ctx, srv.URL(), o.RTConcurrency, Bounds{MaxOps: o.CellOps, MaxTime: o.CellTime * 3 / 4}); err != nil {
		return err
	}
	progress("ceiling: redis-benchmark with the SlidingWindowCounter script")
	for _, p := range []struct{ pipeline, n int }{{16, o.CeilingRequests}, {1, o.CeilingRequests / 4}} {
		c, err := redisBenchmark(ctx, srv.Port, p.pipeline, p.n)
		if err != nil {
			return err
		}
		progress("  -P %-2d %8.0f EVALSHA/s", c.Pipeline, c.PerSec)
		rep.Ceilings = append(rep.Ceilings, c)
	}
	return nil
}

// measureOne measures one sidecar: its RSS and Redis connections at rest, under the faces'
// load and after, and wrk's numbers.
func measureOne(ctx context.Context, o Options, dir string, first *Sidecar, upstream string, rep *Report) (err error) {
	cellBounds := Bounds{MaxOps: o.CellOps, MaxTime: o.CellTime, Warmup: 200}
	time.Sleep(2 * time.Second) // let start-up garbage settle before reading idle RSS
	rep.Memory.IdleMiB = rssMiB(first.Pid())
	rep.Conns = Conns{IdleTimeoutSecs: contract.DefaultRedisIdleTimeoutSeconds}
	var pool float64
	if rep.Conns.FirstAtRest, pool, err = sidecarConns(ctx, first); err != nil {
		return err
	}
	rep.Conns.Pool = int(pool)
	progress("sidecar ready; RSS idle %.1f MiB; %.0f Redis connections at rest (pool %d)", rep.Memory.IdleMiB, rep.Conns.FirstAtRest, rep.Conns.Pool)

	progress("faces, concurrency %v, each cell at most %s or %d requests", o.Concurrency, o.CellTime, o.CellOps)
	stopSampling := sampleRSS(first.Pid())
	stopConns := samplePeak(func() (float64, error) { open, _, err := sidecarConns(ctx, first); return open, err })
	rep.Faces, err = runFaces(ctx, first, upstream, o.Concurrency, cellBounds)
	rep.Memory.PeakLoadMiB = stopSampling()
	rep.Conns.FirstUnderLoad = stopConns()
	if err != nil {
		return err
	}
	rep.Memory.AfterLoadMiB = rssMiB(first.Pid())
	if rep.Conns.FirstAfterLoad, _, err = sidecarConns(ctx, first); err != nil {
		return err
	}
	progress("RSS peak under load %.1f MiB, after %.1f MiB; Redis connections peak %.0f, after %.0f",
		rep.Memory.PeakLoadMiB, rep.Memory.AfterLoadMiB, rep.Conns.FirstUnderLoad, rep.Conns.FirstAfterLoad)

	progress("wrk, 64 connections, %s per face", o.WrkTime)
	if rep.Wrk, rep.WrkSkipped, err = runWrk(ctx, dir, first, o.WrkTime); err != nil {
		return err
	}
	if rep.WrkSkipped != "" {
		progress("  %s", rep.WrkSkipped)
	}
	return nil
}

// measureFleet measures the accuracy of the replicas together and their Redis connections.
func measureFleet(ctx context.Context, o Options, redisURL string, sidecars []*Sidecar, rep *Report) error {
	fleet, err := newFleetConns(redisURL)
	if err != nil {
		return err
	}
	defer fleet.close()
	rep.Conns.Replicas = len(sidecars)
	if rep.Conns.FleetAtRest, err = fleet.count(ctx); err != nil {
		return err
	}
	progress("accuracy: %d times the limit of %d, round-robin over the replicas", 3, accLimit)
	stopConns := samplePeak(func() (float64, error) { n, err := fleet.count(ctx); return float64(n), err })
	rep.Accuracy, err = runAccuracy(ctx, sidecars, o.Replicas, 3)
	rep.Conns.FleetUnderLoad = int(stopConns())
	if err != nil {
		return err
	}
	if rep.Conns.FleetAfterLoad, err = fleet.count(ctx); err != nil {
		return err
	}
	progress("Redis connections of %d sidecars: %d at rest, peak %d under load, %d after",
		rep.Conns.Replicas, rep.Conns.FleetAtRest, rep.Conns.FleetUnderLoad, rep.Conns.FleetAfterLoad)
	return nil
}

// sampleRSS reads a process's RSS every 100ms until the returned stop function is called,
// which returns the largest value seen.
func sampleRSS(pid int) func() float64 {
	return samplePeak(func() (float64, error) { return rssMiB(pid), nil })
}
