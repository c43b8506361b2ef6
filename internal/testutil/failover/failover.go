// Package failover runs sidecar processes against real Redis deployments on loopback and
// drives a failover in the middle of a window (issue 20): a Sentinel group whose replica is cut
// off before its master is killed, a Redis Cluster shard whose master dies while its replica is
// behind, a standalone Redis killed and restarted empty. It measures what every window admitted
// per key against its limit, when the sidecars decided on the new master, and what they
// restored. hack/failover prints its tables; test/failover asserts on them.
//
// Windows align to multiples of their length on Redis's clock (the machine's, on loopback):
// every cell waits for a window to begin, sends demand far above the limits through
// /v1/check until just before that window ends, and so measures exactly one window per key.
package failover

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/redline-dev/redline/internal/policydoc"
	"github.com/redline-dev/redline/internal/sidecar/checkapi"
	"github.com/redline-dev/redline/internal/sidecar/contract"
	"github.com/redline-dev/redline/internal/testutil/kubeletdir"
	"github.com/redline-dev/redline/internal/testutil/proc"
	"github.com/redline-dev/redline/internal/testutil/redistest"
	"github.com/redline-dev/redline/internal/testutil/sidecarproc"
	"github.com/redline-dev/redline/internal/testutil/stack"
)

// Namespace and Policy name the one policy every cell enforces.
const (
	Namespace = "failover"
	Policy    = "failover"
)

// probeLimit is ProbeRule's limit per window, never reached.
const probeLimit = 1_000_000_000

// ProbeRule is a rule of the policy no load spends (a limit never reached): after a kill the
// cell asks every sidecar for it on keys never used before, which have no share to restore and
// so no hold, to see when each sidecar decides from Redis again.
const ProbeRule = "probe"

// HotKey is the key value of rules with one key.
const HotKey = "hot"

// Rule is one limited rule of the policy: Keys key values share its load (1: the hot key,
// HotKey; more: "k0", "k1", ...), each limited to Limit per window.
type Rule struct {
	Name, Algorithm string
	Limit           int64
	Keys            int
	// Weight is the rule's share of the demand against the other rules' (0: 1).
	Weight int
}

// Options configure an Env.
type Options struct {
	// Dir is the work directory: the sidecar binary, policies, labels and every process's log.
	Dir string
	// SidecarBin is a sidecar binary to run; empty builds ./cmd/sidecar into Dir.
	SidecarBin string
	// Window is every rule's window.
	Window time.Duration
	// Rules are the limited rules; ProbeRule is added.
	Rules []Rule
	// HeartbeatInterval is the sidecars' --heartbeat-interval; 0 leaves their default (5s). The
	// hold after a restoration is this interval and a second.
	HeartbeatInterval time.Duration
	// Concurrency is how many /v1/check callers keep the demand up, round-robin over sidecars.
	Concurrency int
	// Progress, when set, is told what a cell is doing.
	Progress func(format string, args ...any)
	// ManagerBin is a manager binary for the TenantACL cells; empty builds ./cmd/manager into
	// Dir on the first such cell.
	ManagerBin string
	// ManagerArgs are flags added to every manager's: none by default, so that the manager
	// runs at its defaults. A control sets them (hack/failover -manager-arg
	// --script-check-interval=10s measures the interval before issue 25).
	ManagerArgs []string
	// InstallTools lets the Env run hack/setup-envtest.sh when KUBEBUILDER_ASSETS is unset
	// (hack/failover); without it a TenantACL cell needs the variable.
	InstallTools bool
}

// Env is what every cell shares: the binary, the policy's files, the upstream.
type Env struct {
	o                     Options
	bin, cfgDir, labels   string
	upstream              string
	stopUpstream          func()
	hc                    *http.Client
	cellSeq               int
	ruleIndex             map[string]int
	hotRules, spreadRules []int

	// The manager binary and the control plane of the TenantACL cells, made on first use.
	mgrOnce sync.Once
	mgrBin  string
	mgrErr  error
	cpOnce  sync.Once
	cp      *controlPlane
	cpErr   error
}

// NewEnv builds the sidecar (unless o.SidecarBin names one), writes the policy and starts the
// upstream the sidecars' proxies point at. Close ends it.
func NewEnv(ctx context.Context, o Options) (*Env, error) {
	if o.Window < time.Second || len(o.Rules) == 0 || o.Concurrency < 1 {
		return nil, errors.New("failover: want a window of at least 1s, a rule and a caller")
	}
	if _, err := redistest.Binary(); err != nil {
		return nil, err
	}
	e := &Env{o: o, bin: o.SidecarBin, ruleIndex: map[string]int{}}
	if e.o.Progress == nil {
		e.o.Progress = func(string, ...any) {}
	}
	for i, r := range o.Rules {
		if r.Keys < 1 || r.Limit < 1 || r.Weight < 0 || r.Name == ProbeRule {
			return nil, fmt.Errorf("failover: rule %q needs a key, a limit and a name other than %q", r.Name, ProbeRule)
		}
		e.ruleIndex[r.Name] = i
		if r.Keys == 1 {
			e.hotRules = append(e.hotRules, i)
		} else {
			e.spreadRules = append(e.spreadRules, i)
		}
	}
	if e.bin == "" {
		root, err := stack.RepoRoot()
		if err != nil {
			return nil, err
		}
		e.o.Progress("building ./cmd/sidecar")
		if e.bin, err = sidecarproc.Build(ctx, root, o.Dir); err != nil {
			return nil, err
		}
	}
	if err := e.writeSidecarFiles(); err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("listening for the upstream: %w", err)
	}
	srv := &http.Server{
		Handler:           http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") }),
		ReadHeaderTimeout: 5 * time.Second,
	}
	go func() { _ = srv.Serve(ln) }()
	e.upstream, e.stopUpstream = ln.Addr().String(), func() { _ = srv.Close() }
	e.hc = &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{MaxIdleConns: 1024, MaxIdleConnsPerHost: 128}}
	return e, nil
}

// Close stops the upstream and the control plane.
func (e *Env) Close() {
	e.hc.CloseIdleConnections()
	e.stopUpstream()
	e.closeControlPlane()
}

// Window is the rules' window.
func (e *Env) Window() time.Duration { return e.o.Window }

// writeSidecarFiles writes the policies document and a labels file the way kubelet would.
func (e *Env) writeSidecarFiles() error {
	pol := policydoc.Policy{
		Name: Policy, Generation: 1, Selector: policydoc.Selector{MatchLabels: map[string]string{"app": "failover"}},
		FailureMode: "Closed",
	}
	w := e.o.Window.Milliseconds()
	for _, r := range e.o.Rules {
		pol.Rules = append(pol.Rules, policydoc.Rule{Name: r.Name, Key: []policydoc.KeyPart{{Header: "x-key"}},
			Algorithm: r.Algorithm, Requests: r.Limit, WindowMS: w, Mode: "Enforce"})
	}
	pol.Rules = append(pol.Rules, policydoc.Rule{Name: ProbeRule, Key: []policydoc.KeyPart{{Header: "x-key"}},
		Algorithm: "FixedWindow", Requests: probeLimit, WindowMS: w, Mode: "Enforce"})
	_, doc, err := policydoc.Build(Namespace, []policydoc.Policy{pol}, map[string]string{})
	if err != nil {
		return fmt.Errorf("building the policies document: %w", err)
	}
	e.cfgDir = filepath.Join(e.o.Dir, "policies")
	info := filepath.Join(e.o.Dir, "podinfo")
	if err := kubeletdir.Write(e.cfgDir, map[string][]byte{policydoc.DataKey: doc}); err != nil {
		return fmt.Errorf("writing the policies: %w", err)
	}
	if err := kubeletdir.Write(info, map[string][]byte{"labels": []byte("app=\"failover\"\n")}); err != nil {
		return fmt.Errorf("writing the labels: %w", err)
	}
	e.labels = filepath.Join(info, "labels")
	return nil
}

// Fleet is n sidecar processes of the policy on one Redis URL.
type Fleet struct {
	Procs []*proc.Process
	// Checks and Admins are the host:port of each sidecar's /v1/check and admin faces.
	Checks, Admins []string
	Leases         bool
}

// StartFleet starts n sidecars on redisURL, leasing (a 2s horizon) or not, and waits until
// every one is ready. With credsDir they authenticate with the credentials there
// (--redis-credentials-dir, as injected with tenant ACLs); without, as Redis's default user.
// Stop ends them.
func (e *Env) StartFleet(ctx context.Context, redisURL, credsDir string, n int, leases bool) (_ *Fleet, err error) {
	f := &Fleet{Leases: leases}
	defer func() {
		if err != nil {
			f.Stop()
		}
	}()
	horizon := "2s"
	if !leases {
		horizon = "0s"
	}
	errs := make([]error, n)
	var wg sync.WaitGroup
	f.Procs, f.Checks, f.Admins = make([]*proc.Process, n), make([]string, n), make([]string, n)
	for i := range n {
		name := fmt.Sprintf("cell%d-sidecar-%d", e.cellSeq, i)
		var ports [4]string
		for j := range ports {
			p, err := redistest.FreePort()
			if err != nil {
				return nil, fmt.Errorf("finding a free port: %w", err)
			}
			ports[j] = "127.0.0.1:" + strconv.Itoa(p)
		}
		args := []string{
			"--listen=" + ports[0], "--upstream=" + e.upstream, "--admin-listen=" + ports[1], "--grpc-listen=" + ports[2],
			"--check-listen=" + ports[3], "--config-dir=" + e.cfgDir, "--pod-labels=" + e.labels,
			"--lease-horizon=" + horizon, "--log-level=info",
		}
		if e.o.HeartbeatInterval > 0 {
			args = append(args, "--heartbeat-interval="+e.o.HeartbeatInterval.String())
		}
		if credsDir != "" {
			args = append(args, "--"+contract.FlagRedisCredentialsDir+"="+credsDir)
		}
		p, err := proc.Start(e.o.Dir, name, e.bin, args,
			append(os.Environ(), "REDLINE_REDIS_URL="+redisURL, "POD_NAME="+name, "POD_NAMESPACE="+Namespace))
		if err != nil {
			return nil, err
		}
		f.Procs[i], f.Checks[i], f.Admins[i] = p, ports[3], ports[1]
		wg.Go(func() { errs[i] = p.WaitHTTP(ctx, "http://"+ports[1]+"/readyz", 30*time.Second, 50*time.Millisecond) })
	}
	wg.Wait()
	return f, errors.Join(errs...)
}

// Stop ends every sidecar (SIGTERM, then SIGKILL after 3s), all at once.
func (f *Fleet) Stop() {
	var wg sync.WaitGroup
	for _, p := range f.Procs {
		if p != nil {
			wg.Go(func() { _ = p.Stop(3 * time.Second) })
		}
	}
	wg.Wait()
}

// LogTails is the end of every sidecar's log, for a failure's message.
func (f *Fleet) LogTails(n int) string {
	var b strings.Builder
	for _, p := range f.Procs {
		if p != nil {
			fmt.Fprintf(&b, "--- %s (%s)\n%s\n", p.Name, p.LogPath, p.LogTail(n))
		}
	}
	return b.String()
}

// Metric reads the named metric of every sidecar of f, summed over its label values: one
// value per sidecar.
func (e *Env) Metric(ctx context.Context, f *Fleet, name string) ([]float64, error) {
	out := make([]float64, len(f.Admins))
	for i, a := range f.Admins {
		v, err := metric(ctx, e.hc, "http://"+a+"/metrics", name)
		if err != nil {
			return nil, err
		}
		out[i] = v
	}
	return out, nil
}

// metric reads the Prometheus text at url and sums the samples of the metric name; a metric
// not served yet counts 0.
func metric(ctx context.Context, hc *http.Client, url, name string) (float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, fmt.Errorf("building the metrics request: %w", err)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, fmt.Errorf("scraping %s: %w", url, err)
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		return 0, fmt.Errorf("parsing the metrics of %s: %w", url, err)
	}
	var sum float64
	if fam, ok := fams[name]; ok {
		for _, m := range fam.GetMetric() {
			sum += m.GetCounter().GetValue() + m.GetGauge().GetValue() + m.GetUntyped().GetValue()
		}
	}
	return sum, nil
}

// check asks the sidecar at addr through /v1/check for one unit of rule's limit on key.
func (e *Env) check(ctx context.Context, addr, rule, key string) (checkapi.Response, error) {
	body, err := json.Marshal(checkapi.Request{Policy: Policy, Rule: rule, Key: []string{key}})
	if err != nil {
		return checkapi.Response{}, fmt.Errorf("encoding the check: %w", err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+checkapi.Path, strings.NewReader(string(body)))
	if err != nil {
		return checkapi.Response{}, fmt.Errorf("building the check: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := e.hc.Do(req)
	if err != nil {
		return checkapi.Response{}, fmt.Errorf("POST %s to %s: %w", checkapi.Path, addr, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return checkapi.Response{}, fmt.Errorf("POST %s to %s: status %d", checkapi.Path, addr, resp.StatusCode)
	}
	var r checkapi.Response
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		return checkapi.Response{}, fmt.Errorf("decoding the decision: %w", err)
	}
	return r, nil
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
