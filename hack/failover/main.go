// Command failover measures what a Redis Sentinel failover with a replica behind does to
// Redline's limits (issue 20): the admitted count of one window across the failover, against the
// limit, per algorithm, with leases on and off, for several sidecar counts.
//
//	go run ./hack/failover [-sidecars 3,10] [-limit 20000] [-concurrency 32]
//
// Each cell starts a Sentinel group on loopback (redistest.StartSentinel: a master, a replica,
// three sentinels) and N sidecar processes (./cmd/sidecar, built once) on its
// redis+sentinel:// URL, failure mode Closed, with a FixedWindow and a SlidingWindowCounter rule
// of limit per minute on one hot key. It waits for the start of a minute (windows are aligned
// to the minute on Redis's clock, so the whole cell is one window), sends demand far above the
// limit through /v1/check, cuts the replica off when both rules have admitted a quarter of the
// limit (-cut-at), kills the master (SIGKILL) at half of it (-kill-at), so that the replica
// Sentinel promotes lacks a quarter of the limit, and keeps the demand up until a few seconds
// after the switch. Every
// process is ended on success, failure or Ctrl-C; every loop is bounded in time.
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
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redline-dev/redline/internal/policydoc"
	"github.com/redline-dev/redline/internal/sidecar/checkapi"
	"github.com/redline-dev/redline/internal/testutil/kubeletdir"
	"github.com/redline-dev/redline/internal/testutil/redistest"
	"github.com/redline-dev/redline/internal/testutil/sidecarproc"
	"github.com/redline-dev/redline/internal/testutil/stack"
)

const (
	namespace, policyName = "failover", "failover"
	window                = time.Minute
	// tail is how long the demand goes on after the sentinels name the new master: long enough
	// for every sidecar to decide on it and spend what it lets through, after the hold on keys
	// whose shares were restored (a heartbeat interval and a second).
	tail = 15 * time.Second
)

// rules are the measured algorithms; each is a rule of the policy, named after it in lower case.
var rules = []string{"FixedWindow", "SlidingWindowCounter"}

// Options are the command's flags.
type Options struct {
	Sidecars    []int
	Limit       int
	Concurrency int
	// CutAt and KillAt are the fractions of the limit both rules have admitted when the
	// replica is cut off (0: before the load) and when the master is killed.
	CutAt, KillAt float64
	Timeout       time.Duration
}

// Cell is one algorithm in one failover.
type Cell struct {
	Algorithm string
	Sidecars  int
	Leases    bool
	Limit     int
	// AtCut and AtKill are the rule's admitted count when the replica was cut off and when the
	// master was killed; Admitted is the window's total.
	AtCut, AtKill, Admitted int64
	// Degraded counts decisions the failure mode (Closed: refuse) made instead of Redis.
	Degraded int64
	// Switch is from the kill until every sentinel names the promoted replica; Closed until the
	// last decision the failure mode made instead of Redis (every sidecar decides again).
	Switch, Closed time.Duration
}

func main() {
	var o Options
	var sidecars string
	flag.StringVar(&sidecars, "sidecars", "3,10", "sidecar counts, one failover each (leases on and off)")
	flag.IntVar(&o.Limit, "limit", 20_000, "each rule's limit per minute")
	flag.Float64Var(&o.CutAt, "cut-at", 0.25, "fraction of the limit admitted when the replica is cut off (0: from the start)")
	flag.Float64Var(&o.KillAt, "kill-at", 0.5, "fraction of the limit admitted when the master is killed (within 10s of the cut, or Sentinel refuses the replica)")
	flag.IntVar(&o.Concurrency, "concurrency", 32, "concurrent /v1/check callers, round-robin over the sidecars")
	flag.DurationVar(&o.Timeout, "timeout", 10*time.Minute, "give up after this long")
	flag.Parse()
	var err error
	for f := range strings.SplitSeq(sidecars, ",") {
		n, aerr := strconv.Atoi(strings.TrimSpace(f))
		if aerr != nil || n < 1 || n > 64 {
			err = fmt.Errorf("bad -sidecars entry %q: want 1 to 64", f)
			break
		}
		o.Sidecars = append(o.Sidecars, n)
	}
	if err == nil && (o.Limit < 100 || o.Concurrency < 1) {
		err = errors.New("-limit must be at least 100 and -concurrency at least 1")
	}
	if err == nil && (o.CutAt < 0 || o.KillAt <= o.CutAt || o.KillAt >= 1) {
		err = errors.New("want 0 <= -cut-at < -kill-at < 1")
	}
	if err == nil {
		err = run(o)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "failover:", err)
		os.Exit(1)
	}
}

var began = time.Now()

func progress(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "[%5.1fs] %s\n", time.Since(began).Seconds(), fmt.Sprintf(format, args...))
}

func run(o Options) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	dir, err := os.MkdirTemp("", "redline-failover-")
	if err != nil {
		return fmt.Errorf("creating a work directory: %w", err)
	}
	defer func() { _ = os.RemoveAll(dir) }()
	root, err := stack.RepoRoot()
	if err != nil {
		return err
	}
	progress("building ./cmd/sidecar")
	bin, err := sidecarproc.Build(ctx, root, dir)
	if err != nil {
		return err
	}
	cfgDir, labels, err := writeSidecarFiles(dir, o.Limit)
	if err != nil {
		return err
	}
	upstream, stopUpstream, err := startUpstream()
	if err != nil {
		return err
	}
	defer stopUpstream()
	var cells []Cell
	for _, n := range o.Sidecars {
		for _, leases := range []bool{true, false} {
			cs, err := runCell(ctx, o, bin, dir, cfgDir, labels, upstream, n, leases)
			if err != nil {
				return fmt.Errorf("%d sidecars, leases %t: %w", n, leases, err)
			}
			cells = append(cells, cs...)
		}
	}
	printTable(os.Stdout, cells)
	return nil
}

// runCell is one failover: a fresh Sentinel group, n sidecars, the load, the cut, the kill.
func runCell(ctx context.Context, o Options, bin, dir, cfgDir, labels, upstream string, n int, leases bool) (_ []Cell, err error) {
	g, err := redistest.StartSentinel()
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, g.Close()) }()
	horizon := "2s"
	if !leases {
		horizon = "0s"
	}
	var procs []*stack.Process
	defer func() {
		for _, p := range procs {
			_ = p.Stop(3 * time.Second)
		}
	}()
	var checks []string
	for i := range n {
		name := fmt.Sprintf("sidecar-%d-%t-%d", n, leases, i)
		var ports [4]string
		for j := range ports {
			p, err := redistest.FreePort()
			if err != nil {
				return nil, fmt.Errorf("finding a free port: %w", err)
			}
			ports[j] = "127.0.0.1:" + strconv.Itoa(p)
		}
		p, err := stack.StartProcess(dir, name, bin, []string{
			"--listen=" + ports[0], "--upstream=" + upstream, "--admin-listen=" + ports[1], "--grpc-listen=" + ports[2],
			"--check-listen=" + ports[3], "--config-dir=" + cfgDir, "--pod-labels=" + labels,
			"--lease-horizon=" + horizon, "--log-level=warn",
		}, append(os.Environ(), "REDLINE_REDIS_URL="+g.URL(), "POD_NAME="+name, "POD_NAMESPACE="+namespace))
		if err != nil {
			return nil, err
		}
		procs = append(procs, p)
		if err := waitReady(ctx, p, ports[1]); err != nil {
			return nil, err
		}
		checks = append(checks, ports[3])
	}
	// The whole cell must fall in one window: start just after a minute begins.
	if sec := time.Now().Second(); sec > 5 {
		wait := time.Until(time.Now().Truncate(window).Add(window + 200*time.Millisecond))
		progress("%d sidecars, leases %t: ready; waiting %s for the next window", n, leases, wait.Round(time.Second))
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	windowEnd := time.Now().Truncate(window).Add(window - 500*time.Millisecond)
	progress("%d sidecars, leases %t: load", n, leases)
	return load(ctx, o, g, checks, leases, windowEnd)
}

// load sends the demand and drives the failover; it returns one cell per rule.
func load(ctx context.Context, o Options, g *redistest.Sentinel, checks []string, leases bool, windowEnd time.Time) ([]Cell, error) {
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{MaxIdleConns: 512, MaxIdleConnsPerHost: 64}}
	defer hc.CloseIdleConnections()
	var per [2]counts
	var killedAt atomic.Int64 // unix ns of the kill, 0 before
	ctx, stopLoad := context.WithDeadline(ctx, windowEnd)
	defer stopLoad()
	if o.CutAt == 0 {
		// Cut off from the start: the replica never sees a count.
		if err := g.CutReplica(ctx); err != nil {
			return nil, err
		}
	}
	var wg sync.WaitGroup
	var next atomic.Int64
	errc := make(chan error, o.Concurrency)
	for range o.Concurrency {
		wg.Go(func() {
			for ctx.Err() == nil {
				i := next.Add(1)
				ri := int(i % int64(len(rules)))
				r, err := check(ctx, hc, checks[int(i/2)%len(checks)], strings.ToLower(rules[ri]))
				if err != nil {
					if ctx.Err() == nil {
						errc <- err
						stopLoad()
					}
					return
				}
				per[ri].record(r, killedAt.Load())
			}
		})
	}
	limit := int64(o.Limit)
	minAdmitted := func() int64 { return min(per[0].admitted.Load(), per[1].admitted.Load()) }
	waitFor := func(n int64) error {
		for minAdmitted() < n {
			if err := sleep(ctx, 2*time.Millisecond); err != nil {
				return fmt.Errorf("waiting for %d admitted (at %d): %w", n, minAdmitted(), err)
			}
		}
		return nil
	}
	cells := make([]Cell, len(rules))
	for i, r := range rules {
		cells[i] = Cell{Algorithm: r, Sidecars: len(checks), Leases: leases, Limit: o.Limit}
	}
	drive := func() error {
		if o.CutAt > 0 {
			if err := waitFor(int64(o.CutAt * float64(limit))); err != nil {
				return err
			}
			if err := g.CutReplica(ctx); err != nil {
				return err
			}
		}
		for i := range cells {
			cells[i].AtCut = per[i].admitted.Load()
		}
		if err := waitFor(int64(o.KillAt * float64(limit))); err != nil {
			return err
		}
		for i := range cells {
			cells[i].AtKill = per[i].admitted.Load()
		}
		killed := time.Now()
		killedAt.Store(killed.UnixNano())
		if err := g.Master().Stop(); err != nil {
			return err
		}
		if err := g.WaitMaster(ctx, g.Replica()); err != nil {
			return err
		}
		sw := time.Since(killed)
		for i := range cells {
			cells[i].Switch = sw
		}
		return sleep(ctx, tail)
	}
	derr := drive()
	stopLoad()
	wg.Wait()
	select {
	case err := <-errc:
		return nil, err
	default:
	}
	if derr != nil && !errors.Is(derr, context.DeadlineExceeded) {
		return nil, derr
	}
	if cells[0].Switch == 0 {
		return nil, fmt.Errorf("the window ended before the failover completed: %w", derr)
	}
	for i := range cells {
		cells[i].Admitted, cells[i].Degraded = per[i].admitted.Load(), per[i].degraded.Load()
		cells[i].Closed = time.Duration(per[i].closedNs.Load())
	}
	return cells, nil
}

// counts are one rule's decisions in a cell.
type counts struct{ admitted, degraded, closedNs atomic.Int64 }

// record counts one decision; killedAt is the kill's unix ns, 0 before it.
func (c *counts) record(r checkapi.Response, killedAt int64) {
	if r.Allowed {
		c.admitted.Add(1)
	}
	if len(r.Results) == 0 {
		return
	}
	switch r.Results[0].Source {
	case "redis", "precheck", "lease":
		return
	}
	c.degraded.Add(1)
	if killedAt == 0 {
		return
	}
	// The last decision the failure mode made after the kill is when the last sidecar stopped
	// refusing.
	for d := time.Now().UnixNano() - killedAt; ; {
		old := c.closedNs.Load()
		if d <= old || c.closedNs.CompareAndSwap(old, d) {
			return
		}
	}
}

func sleep(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}

// check asks the sidecar at addr through /v1/check for one unit of rule's limit on the hot key.
func check(ctx context.Context, hc *http.Client, addr, rule string) (checkapi.Response, error) {
	body, err := json.Marshal(checkapi.Request{Policy: policyName, Rule: rule, Key: []string{"hot"}})
	if err != nil {
		return checkapi.Response{}, fmt.Errorf("encoding the check: %w", err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+checkapi.Path, strings.NewReader(string(body)))
	if err != nil {
		return checkapi.Response{}, fmt.Errorf("building the check: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return checkapi.Response{}, fmt.Errorf("POST %s: %w", checkapi.Path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return checkapi.Response{}, fmt.Errorf("POST %s: status %d", checkapi.Path, resp.StatusCode)
	}
	var r checkapi.Response
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		return checkapi.Response{}, fmt.Errorf("decoding the decision: %w", err)
	}
	return r, nil
}

// waitReady waits until the sidecar's /readyz answers 200, for at most 20s.
func waitReady(ctx context.Context, p *stack.Process, admin string) error {
	hc := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if resp, err := hc.Get("http://" + admin + "/readyz"); err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if done, err := p.Exited(); done {
			return fmt.Errorf("%s exited (%v): %s", p.Name, err, p.LogTail(2000))
		}
		if err := sleep(ctx, 50*time.Millisecond); err != nil {
			return err
		}
	}
	return fmt.Errorf("%s not ready within 20s: %s", p.Name, p.LogTail(2000))
}

// writeSidecarFiles writes the policies document and a labels file the way kubelet would.
func writeSidecarFiles(dir string, limit int) (cfgDir, labels string, err error) {
	pol := policydoc.Policy{
		Name: policyName, Generation: 1, Selector: policydoc.Selector{MatchLabels: map[string]string{"app": "failover"}},
		FailureMode: "Closed",
	}
	for _, a := range rules {
		pol.Rules = append(pol.Rules, policydoc.Rule{Name: strings.ToLower(a), Key: []policydoc.KeyPart{{Header: "x-key"}},
			Algorithm: a, Requests: int64(limit), WindowMS: window.Milliseconds(), Mode: "Enforce"})
	}
	_, doc, err := policydoc.Build(namespace, []policydoc.Policy{pol}, map[string]string{})
	if err != nil {
		return "", "", fmt.Errorf("building the policies document: %w", err)
	}
	cfgDir, info := dir+"/policies", dir+"/podinfo"
	if err := kubeletdir.Write(cfgDir, map[string][]byte{policydoc.DataKey: doc}); err != nil {
		return "", "", fmt.Errorf("writing the policies: %w", err)
	}
	if err := kubeletdir.Write(info, map[string][]byte{"labels": []byte("app=\"failover\"\n")}); err != nil {
		return "", "", fmt.Errorf("writing the labels: %w", err)
	}
	return cfgDir, info + "/labels", nil
}

// startUpstream serves a tiny application the sidecars' proxy faces point at (a sidecar needs
// one; the measurement goes through /v1/check).
func startUpstream() (addr string, stop func(), err error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, fmt.Errorf("listening for the upstream: %w", err)
	}
	srv := &http.Server{
		Handler:           http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") }),
		ReadHeaderTimeout: 5 * time.Second,
	}
	go func() { _ = srv.Serve(ln) }()
	return ln.Addr().String(), func() { _ = srv.Close() }, nil
}

func printTable(w io.Writer, cells []Cell) {
	_, _ = fmt.Fprintf(w, "%-21s %8s %6s %7s %8s %8s %7s %9s %7s %6s %9s %7s %7s\n",
		"algorithm", "sidecars", "leases", "limit", "at cut", "at kill", "behind", "admitted", "over", "x",
		"degraded", "switch", "closed")
	for _, c := range cells {
		lease := "off"
		if c.Leases {
			lease = "on"
		}
		_, _ = fmt.Fprintf(w, "%-21s %8d %6s %7d %8d %8d %7d %9d %+7d %5.2fx %9d %6.1fs %6.1fs\n",
			c.Algorithm, c.Sidecars, lease, c.Limit, c.AtCut, c.AtKill, c.AtKill-c.AtCut, c.Admitted,
			c.Admitted-int64(c.Limit), float64(c.Admitted)/float64(c.Limit), c.Degraded, c.Switch.Seconds(), c.Closed.Seconds())
	}
}
