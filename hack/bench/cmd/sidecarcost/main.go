// Command sidecarcost measures what a decision costs the sidecar process, side by side in one run:
// the sidecar built from a base commit against the one built from the working tree, CPU per
// decision (utime+stime of the process over the load, from /proc/<pid>/stat, divided by the
// decisions answered) and resident memory under load (the largest VmRSS sampled every 50 ms, and
// VmHWM at the end). Issue 20's budget: within 10% of the base for both.
//
//	go run ./cmd/sidecarcost -root ../.. [-base 73eefbc] [-rounds 5] [-ops 20000] [-faces check,rls]
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
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/redline-dev/redline/internal/policydoc"
	"github.com/redline-dev/redline/internal/sidecar/rls"
	"github.com/redline-dev/redline/internal/testutil/redistest"
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
	// the first pprofSeconds of the measured load), named <version>-<cell>-r<round>.pprof.
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
	flag.StringVar(&o.base, "base", "73eefbc", "the commit measured as the base")
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
	rssPeakMiB     float64
	hwmMiB         float64
	perSec         float64
	degraded       float64
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
	baseTree := filepath.Join(dir, "base-tree")
	progress("extracting %s into %s", o.base, baseTree)
	if err := extract(ctx, root, o.base, baseTree); err != nil {
		return err
	}
	versions := [2]*version{{name: o.base}, {name: "now"}}
	for i, tree := range []string{baseTree, root} {
		v := versions[i]
		out := filepath.Join(dir, "bin-"+strconv.Itoa(i))
		if err := os.Mkdir(out, 0o755); err != nil {
			return fmt.Errorf("creating %s: %w", out, err)
		}
		progress("building ./cmd/sidecar of %s", v.name)
		if v.bin, err = sidecarproc.Build(ctx, tree, out); err != nil {
			return err
		}
		if v.scripts, err = printScripts(ctx, tree, dir); err != nil {
			return fmt.Errorf("reading the scripts of %s: %w", v.name, err)
		}
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
				progress("round %d %-4s %s: %.1f µs/decision, RSS peak %.1f MiB, HWM %.1f MiB, %.0f/s, degraded %.0f",
					r+1, versions[i].name, c, float64(s.cpuPerDecision)/1e3, s.rssPeakMiB, s.hwmMiB, s.perSec, s.degraded)
				results[c][i] = append(results[c][i], s)
			}
		}
	}
	printTable(o, command, load, versions, cells, results)
	return nil
}

func (c cell) String() string {
	return fmt.Sprintf("%s %s %d keys %s", faceNames[c.face], c.algorithm, c.keys, leasesWord(c.leases))
}

// extract writes the tree of commit into dir with git archive.
func extract(ctx context.Context, root, commit, dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("creating %s: %w", dir, err)
	}
	tarball := dir + ".tar"
	if out, err := exec.CommandContext(ctx, "git", "-C", root, "archive", "--format=tar", "-o", tarball, commit).CombinedOutput(); err != nil {
		return fmt.Errorf("git archive %s: %w\n%s", commit, err, out)
	}
	defer func() { _ = os.Remove(tarball) }()
	if out, err := exec.CommandContext(ctx, "tar", "-xf", tarball, "-C", dir).CombinedOutput(); err != nil {
		return fmt.Errorf("extracting %s: %w\n%s", tarball, err, out)
	}
	return nil
}

// printer is the program run inside a tree to print what its manager loads for sidecars. It is
// added to the tree through go's -overlay, so the working tree is not written to.
const printer = `package main

import (
	"encoding/json"
	"os"

	"github.com/redline-dev/redline/internal/redisacl"
)

func main() {
	type script struct{ Name, Source string }
	var out []script
	for _, s := range redisacl.SidecarScripts() {
		out = append(out, script{s.Name, s.Source})
	}
	if err := json.NewEncoder(os.Stdout).Encode(out); err != nil {
		os.Exit(1)
	}
}
`

// printScripts runs printer inside tree and returns the scripts it printed.
func printScripts(ctx context.Context, tree, dir string) ([]script, error) {
	src, err := os.CreateTemp(dir, "printer-*.go")
	if err != nil {
		return nil, fmt.Errorf("writing the printer: %w", err)
	}
	_, err = io.WriteString(src, printer)
	if cerr := src.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, fmt.Errorf("writing the printer: %w", err)
	}
	pkg := filepath.Join(tree, "internal", "zz_sidecarcost_printer")
	ov, err := json.Marshal(map[string]map[string]string{"Replace": {filepath.Join(pkg, "main.go"): src.Name()}})
	if err != nil {
		return nil, fmt.Errorf("encoding the overlay: %w", err)
	}
	ovFile := src.Name() + ".overlay.json"
	if err := os.WriteFile(ovFile, ov, 0o644); err != nil {
		return nil, fmt.Errorf("writing the overlay: %w", err)
	}
	cmd := exec.CommandContext(ctx, "go", "run", "-overlay", ovFile, "./internal/zz_sidecarcost_printer")
	cmd.Dir = tree
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go run the printer in %s: %w\n%s", tree, err, stderr.String())
	}
	var scripts []script
	if err := json.Unmarshal(out, &scripts); err != nil {
		return nil, fmt.Errorf("decoding the printer's output: %w", err)
	}
	if len(scripts) == 0 {
		return nil, errors.New("the printer printed no scripts")
	}
	return scripts, nil
}

// writeSidecarFiles writes the policies document (one rule per algorithm, keyed on x-key) and
// the labels file. Both builds read the same document: policydoc's format did not change.
func writeSidecarFiles(dir string) (sidecarproc.Files, error) {
	key := []policydoc.KeyPart{{Header: keyHeader}}
	p := policydoc.Policy{Name: policy, Generation: 1, Selector: policydoc.Selector{MatchLabels: map[string]string{"app": "bench"}},
		FailureMode: "LocalFallback"}
	for _, alg := range algorithms {
		p.Rules = append(p.Rules, policydoc.Rule{Name: rules[alg], Key: key, Algorithm: alg, Requests: limit,
			WindowMS: window.Milliseconds(), Mode: "Enforce"})
	}
	_, doc, err := policydoc.Build(namespace, []policydoc.Policy{p}, map[string]string{})
	if err != nil {
		return sidecarproc.Files{}, fmt.Errorf("building the policies document: %w", err)
	}
	return sidecarproc.WriteFiles(dir, doc, "bench")
}

// startUpstream serves a tiny application on a loopback port (the sidecar's --upstream).
func startUpstream() (string, func(), error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, fmt.Errorf("listening for the upstream: %w", err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") }),
		ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	return ln.Addr().String(), func() { _ = srv.Close() }, nil
}

// measure runs cell c once on version v: a fresh redis-server with v's scripts, a fresh sidecar.
// With profile set, the sidecar serves pprof and a CPU profile of the load is written there.
func measure(ctx context.Context, o options, v *version, c cell, f sidecarproc.Files, upstream, logs, profile string) (sample, error) {
	srv, err := redistest.Start()
	if err != nil {
		return sample{}, fmt.Errorf("starting redis-server: %w", err)
	}
	defer func() { _ = srv.Close() }()
	rc := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer func() { _ = rc.Close() }()
	for _, s := range v.scripts {
		if err := rc.ScriptLoad(ctx, s.Source).Err(); err != nil {
			return sample{}, fmt.Errorf("SCRIPT LOAD %s: %w", s.Name, err)
		}
	}
	var extra []string
	if !c.leases {
		extra = append(extra, "--lease-horizon=0")
	}
	if profile != "" {
		extra = append(extra, "--pprof")
	}
	sc, err := startSidecar(ctx, v.bin, logs, v.name, f, srv.URL(), upstream, extra)
	if err != nil {
		return sample{}, err
	}
	defer func() { _ = sc.Stop(3 * time.Second) }()
	fn, closeFn, err := faceOp(sc, c)
	if err != nil {
		return sample{}, err
	}
	defer closeFn()
	for i := range 200 { // connections, scripts, first leases
		if err := fn(ctx, int64(i)); err != nil {
			return sample{}, fmt.Errorf("warm-up: %w", err)
		}
	}
	before, err := sc.degraded(ctx)
	if err != nil {
		return sample{}, err
	}
	cpu0, err := sidecarproc.CPUTime(sc.Pid())
	if err != nil {
		return sample{}, fmt.Errorf("reading the sidecar's CPU time: %w", err)
	}
	stopRSS := samplePeak(sc.Pid())
	profiled := make(chan error, 1)
	if profile != "" {
		go func() { profiled <- fetchProfile(ctx, sc.Admin, o.pprofSeconds, profile) }()
	} else {
		profiled <- nil
	}
	ops, elapsed, err := closedLoop(ctx, o.concurrency, o.ops, o.cellTime, fn)
	peak := stopRSS()
	if perr := <-profiled; err == nil && perr != nil {
		err = perr
	}
	if err != nil {
		return sample{}, err
	}
	cpu1, err := sidecarproc.CPUTime(sc.Pid())
	if err != nil {
		return sample{}, fmt.Errorf("reading the sidecar's CPU time: %w", err)
	}
	hwm, err := statusMiB(sc.Pid(), "VmHWM:")
	if err != nil {
		return sample{}, err
	}
	after, err := sc.degraded(ctx)
	if err != nil {
		return sample{}, err
	}
	return sample{cpuPerDecision: (cpu1 - cpu0) / time.Duration(ops), rssPeakMiB: peak, hwmMiB: hwm,
		perSec: float64(ops) / elapsed.Seconds(), degraded: after - before}, nil
}

// fetchProfile writes the sidecar's CPU profile over the next seconds to file.
func fetchProfile(ctx context.Context, admin string, seconds int, file string) error {
	url := fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", admin, seconds)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return fmt.Errorf("building the profile request: %w", err)
	}
	resp, err := (&http.Client{Timeout: time.Duration(seconds)*time.Second + 10*time.Second}).Do(req)
	if err != nil {
		return fmt.Errorf("fetching %s: %w", url, err)
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("fetching %s: status %d", url, resp.StatusCode)
	}
	if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
		return fmt.Errorf("creating %s: %w", filepath.Dir(file), err)
	}
	out, err := os.Create(file)
	if err != nil {
		return fmt.Errorf("creating %s: %w", file, err)
	}
	_, err = io.Copy(out, io.LimitReader(resp.Body, 64<<20))
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("writing %s: %w", file, err)
	}
	return nil
}

func leasesWord(on bool) string {
	if on {
		return "leases-on"
	}
	return "leases-off"
}

// keyOf names the i-th request's key among n.
func keyOf(i int64, n int) string {
	if n == 1 {
		return "hot"
	}
	return "k" + strconv.FormatInt(i%int64(n), 10)
}

// faceOp returns one decision through c's face against sidecar s; every answer must admit.
func faceOp(s *sidecar, c cell) (func(context.Context, int64) error, func(), error) {
	rule := rules[c.algorithm]
	if c.face == faceRLS {
		conn, err := grpc.NewClient(s.GRPC, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return nil, nil, fmt.Errorf("dialing the RLS face: %w", err)
		}
		client := rlsv3.NewRateLimitServiceClient(conn)
		return func(ctx context.Context, i int64) error {
			resp, err := client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "bench",
				Descriptors: []*ratelimitv3.RateLimitDescriptor{{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{
					{Key: rls.EntryPolicy, Value: policy}, {Key: rls.EntryRule, Value: rule}, {Key: keyHeader, Value: keyOf(i, c.keys)},
				}}}})
			if err != nil {
				return fmt.Errorf("ShouldRateLimit: %w", err)
			}
			if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
				return fmt.Errorf("ShouldRateLimit: %s", resp.GetOverallCode())
			}
			return nil
		}, func() { _ = conn.Close() }, nil
	}
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{MaxIdleConns: 256, MaxIdleConnsPerHost: 256}}
	url := "http://" + s.Check + "/v1/check"
	return func(ctx context.Context, i int64) error {
		body := `{"policy":"` + policy + `","rule":"` + rule + `","key":["` + keyOf(i, c.keys) + `"]}`
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
		if err != nil {
			return fmt.Errorf("building request: %w", err)
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := hc.Do(req)
		if err != nil {
			return fmt.Errorf("POST /v1/check: %w", err)
		}
		b, err := io.ReadAll(io.LimitReader(resp.Body, 4096))
		_ = resp.Body.Close()
		if err != nil {
			return fmt.Errorf("reading /v1/check: %w", err)
		}
		if resp.StatusCode != http.StatusOK || !strings.HasPrefix(string(b), `{"allowed":true`) {
			return fmt.Errorf("/v1/check: status %d: %.200s", resp.StatusCode, b)
		}
		return nil
	}, hc.CloseIdleConnections, nil
}

// closedLoop runs fn from conc goroutines until maxOps decisions have been answered or maxTime
// has passed. Any failure ends the run with it: a decision that is not an admission means the
// sidecar measured is not doing what the other one does.
func closedLoop(ctx context.Context, conc int, maxOps int64, maxTime time.Duration, fn func(context.Context, int64) error) (int64, time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, maxTime)
	defer cancel()
	var next, done atomic.Int64
	var once sync.Once
	var first error
	var wg sync.WaitGroup
	start := time.Now()
	for range conc {
		wg.Go(func() {
			for ctx.Err() == nil {
				i := next.Add(1) - 1
				if i >= maxOps {
					return
				}
				if err := fn(ctx, i); err != nil {
					if ctx.Err() == nil {
						once.Do(func() { first = err; cancel() })
					}
					return
				}
				done.Add(1)
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	if first != nil {
		return 0, 0, first
	}
	if done.Load() == 0 {
		return 0, 0, fmt.Errorf("no decision within %s", maxTime)
	}
	return done.Load(), elapsed, nil
}

// sidecar is one sidecar process on loopback ports.
type sidecar struct{ *sidecarproc.Sidecar }

// startSidecar runs bin with the flags both builds know, plus extra, and waits until it is ready.
func startSidecar(ctx context.Context, bin, logs, name string, f sidecarproc.Files, redisURL, upstream string, extra []string) (*sidecar, error) {
	s, err := sidecarproc.Start(ctx, sidecarproc.Options{Bin: bin, Dir: logs, Name: name, Pod: "cost-0", Namespace: namespace,
		Files: f, RedisURL: redisURL, Upstream: upstream, Args: append([]string{"--redis-timeout=" + redisTimeout.String()}, extra...)})
	if err != nil {
		return nil, fmt.Errorf("starting sidecar %s: %w", bin, err)
	}
	return &sidecar{s}, nil
}

// degraded is the sidecar's count of decisions its failure mode made.
func (s *sidecar) degraded(ctx context.Context) (float64, error) {
	m, err := sidecarproc.Scrape(ctx, "http://"+s.Admin+"/metrics", "redline_sidecar_degraded_decisions_total")
	if err != nil {
		return 0, err
	}
	return m["redline_sidecar_degraded_decisions_total"], nil
}

// statusMiB reads a field of /proc/<pid>/status given in kB, in MiB.
func statusMiB(pid int, field string) (float64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, fmt.Errorf("reading the sidecar's status: %w", err)
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, field); ok {
			v, err := strconv.ParseFloat(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 64)
			if err != nil {
				return 0, fmt.Errorf("/proc/%d/status %s %q: %w", pid, field, rest, err)
			}
			return v / 1024, nil
		}
	}
	return 0, fmt.Errorf("/proc/%d/status has no %s", pid, field)
}

// samplePeak reads VmRSS every 50ms until the returned function is called, which returns the
// largest value seen (and a last reading, so that a short run has one).
func samplePeak(pid int) func() float64 {
	var peak float64
	var mu sync.Mutex
	read := func() {
		if v, err := statusMiB(pid, "VmRSS:"); err == nil {
			mu.Lock()
			peak = max(peak, v)
			mu.Unlock()
		}
	}
	done, finished := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(finished)
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				read()
			}
		}
	}()
	return func() float64 {
		close(done)
		<-finished
		read()
		return peak
	}
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// budget is issue 20's: now within 10% of the base.
const budget = 1.10

func printTable(o options, command, load string, versions [2]*version, cells []cell, results map[cell]*[2][]sample) {
	b := versions[0].name
	fmt.Printf("`%s`, %d rounds per cell and version (base and now alternating, each run on a fresh redis-server and sidecar), "+
		"%d clients, %d decisions measured per run (after 200 of warm-up), %s, %d cores; load average %s at start, %s at end.\n\n",
		command, o.rounds, o.concurrency, o.ops, runtime.Version(), runtime.NumCPU(), load, machine.LoadAverage())
	fmt.Println("CPU: the sidecar's utime+stime over the measured decisions (/proc/<pid>/stat, 10 ms ticks). " +
		"RSS: the largest VmRSS sampled every 50 ms under load; HWM: VmHWM at the end of the run. " +
		"Each value is the median over the rounds, the minimum in parentheses; ratios are of the medians (of the minimums in parentheses); " +
		"within 10%: both the CPU and the RSS ratio of the medians at most 1.10. degraded: decisions of the base's runs and of now's that " +
		"the failure mode made because Redis did not answer within the sidecars' --redis-timeout (set to " + redisTimeout.String() + " for both, so that on a loaded machine the decisions are Redis's).")
	fmt.Println()
	fmt.Printf("| face | algorithm | keys | leases | CPU µs/decision %s | now | now/%s | RSS MiB %s | now | now/%s | HWM MiB %s | now | now/%s | decisions/s %s | now | degraded %s, now | within 10%% |\n",
		b, b, b, b, b, b, b, b)
	fmt.Println("| --- | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
	for _, c := range cells {
		r := results[c]
		col := func(f func(sample) float64) (med [2]float64, low [2]float64) {
			for i := range 2 {
				var v []float64
				for _, s := range r[i] {
					v = append(v, f(s))
				}
				med[i], low[i] = median(v), slices.Min(v)
			}
			return med, low
		}
		cpu, cpuMin := col(func(s sample) float64 { return float64(s.cpuPerDecision) / 1e3 })
		rss, rssMin := col(func(s sample) float64 { return s.rssPeakMiB })
		hwm, hwmMin := col(func(s sample) float64 { return s.hwmMiB })
		rate, _ := col(func(s sample) float64 { return s.perSec })
		var degraded [2]float64
		for i := range 2 {
			for _, s := range r[i] {
				degraded[i] += s.degraded
			}
		}
		leases := "on"
		if !c.leases {
			leases = "off"
		}
		ok := "yes"
		if cpu[1]/cpu[0] > budget || rss[1]/rss[0] > budget {
			ok = "**no**"
		}
		fmt.Printf("| %s | %s | %d | %s | %.1f (%.1f) | %.1f (%.1f) | %.2fx (%.2fx) | %.1f (%.1f) | %.1f (%.1f) | %.2fx (%.2fx) | %.1f (%.1f) | %.1f (%.1f) | %.2fx | %.0f | %.0f | %.0f, %.0f | %s |\n",
			faceNames[c.face], c.algorithm, c.keys, leases,
			cpu[0], cpuMin[0], cpu[1], cpuMin[1], cpu[1]/cpu[0], cpuMin[1]/cpuMin[0],
			rss[0], rssMin[0], rss[1], rssMin[1], rss[1]/rss[0], rssMin[1]/rssMin[0],
			hwm[0], hwmMin[0], hwm[1], hwmMin[1], hwm[1]/hwm[0],
			rate[0], rate[1], degraded[0], degraded[1], ok)
	}
}
