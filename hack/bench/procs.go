package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redline-dev/redline/internal/testutil/kubeletdir"

	"github.com/redline-dev/redline/internal/policydoc"
	"github.com/redline-dev/redline/internal/testutil/redistest"
	"github.com/redline-dev/redline/internal/testutil/sidecarproc"
)

// The policies every bench sidecar enforces, in namespace benchNamespace.
const (
	benchNamespace = "bench"
	// benchPolicy/benchRule is the throughput rule: SlidingWindowCounter (the default algorithm),
	// a limit never reached, keyed on X-Key; it applies to every proxied request.
	benchPolicy, benchRule = "bench", "r"
	benchLimit             = 1_000_000_000
	// accPolicy has one rule per algorithm, named after it in lower case, for the accuracy cells.
	// Its rules only match /acc/ so that proxied throughput requests do not touch them.
	accPolicy = "acc"
	keyHeader = "x-key"
)

// accLimit is each accuracy rule's limit per accWindow. The window is long so that a cell
// never crosses a window edge (where FixedWindow may admit up to twice its limit by design).
const (
	accLimit  = 100
	accWindow = time.Hour
)

// policiesDocument builds the compiled document the sidecars load.
func policiesDocument() ([]byte, error) {
	key := []policydoc.KeyPart{{Header: keyHeader}}
	bench := policydoc.Policy{
		Name: benchPolicy, Generation: 1, Selector: policydoc.Selector{MatchLabels: map[string]string{"app": "bench"}},
		FailureMode: "LocalFallback",
		Rules: []policydoc.Rule{{Name: benchRule, Key: key, Algorithm: "SlidingWindowCounter",
			Requests: benchLimit, WindowMS: time.Minute.Milliseconds(), Mode: "Enforce"}},
	}
	acc := policydoc.Policy{
		Name: accPolicy, Generation: 1, Selector: policydoc.Selector{MatchLabels: map[string]string{"app": "bench"}},
		FailureMode: "Closed",
	}
	for _, a := range algorithms {
		acc.Rules = append(acc.Rules, policydoc.Rule{Name: strings.ToLower(a), Match: &policydoc.Match{PathPrefix: "/acc/"},
			Key: key, Algorithm: a, Requests: accLimit, WindowMS: accWindow.Milliseconds(), Mode: "Enforce"})
	}
	_, data, err := policydoc.Build(benchNamespace, []policydoc.Policy{bench, acc}, map[string]string{})
	if err != nil {
		return nil, fmt.Errorf("building the policies document: %w", err)
	}
	return data, nil
}

// startUpstream serves a tiny "ok" application on a loopback port.
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

// Sidecar is one sidecar process on loopback ports.
type Sidecar struct {
	cmd                       *exec.Cmd
	done                      chan struct{}
	log                       string
	Proxy, Admin, Check, GRPC string
}

// Pid is the process id.
func (s *Sidecar) Pid() int { return s.cmd.Process.Pid }

// startSidecar runs bin as pod name with the policies in cfgDir, the labels file labels, Redis
// at redisURL and upstream as its application, and waits until it is ready.
func startSidecar(ctx context.Context, bin, dir, name, cfgDir, labels, redisURL, upstream string) (*Sidecar, error) {
	var ports [4]string
	for i := range ports {
		p, err := redistest.FreePort()
		if err != nil {
			return nil, fmt.Errorf("finding a free port: %w", err)
		}
		ports[i] = "127.0.0.1:" + strconv.Itoa(p)
	}
	s := &Sidecar{Proxy: ports[0], Admin: ports[1], GRPC: ports[2], Check: ports[3], done: make(chan struct{}), log: filepath.Join(dir, name+".log")}
	logf, err := os.Create(s.log)
	if err != nil {
		return nil, fmt.Errorf("creating the sidecar log: %w", err)
	}
	s.cmd = exec.Command(bin, "--listen="+s.Proxy, "--upstream="+upstream, "--admin-listen="+s.Admin,
		"--check-listen="+s.Check, "--grpc-listen="+s.GRPC, "--config-dir="+cfgDir, "--pod-labels="+labels, "--log-level=warn")
	s.cmd.Env = append(os.Environ(), "REDLINE_REDIS_URL="+redisURL, "POD_NAME="+name, "POD_NAMESPACE="+benchNamespace)
	s.cmd.Stdout, s.cmd.Stderr = logf, logf
	if err := s.cmd.Start(); err != nil {
		_ = logf.Close()
		return nil, fmt.Errorf("starting sidecar %s: %w", name, err)
	}
	go func() { _ = s.cmd.Wait(); _ = logf.Close(); close(s.done) }()
	if err := s.waitReady(ctx, 20*time.Second); err != nil {
		s.Stop()
		return nil, err
	}
	return s, nil
}

func (s *Sidecar) waitReady(ctx context.Context, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	client := &http.Client{Timeout: time.Second}
	for {
		if resp, err := client.Get("http://" + s.Admin + "/readyz"); err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-s.done:
			return fmt.Errorf("sidecar exited before ready: %s", s.logTail())
		case <-ctx.Done():
			return fmt.Errorf("waiting for the sidecar: %w", ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("sidecar not ready within %s: %s", limit, s.logTail())
		}
	}
}

func (s *Sidecar) logTail() string {
	b, _ := os.ReadFile(s.log)
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(b)
}

// Stop ends the process (SIGTERM, then SIGKILL after 3s) and waits for it.
func (s *Sidecar) Stop() {
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(3 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.done
	}
}

// Counters are the sidecar's limiter counters from /metrics.
type Counters struct{ RedisDecisions, RoundTrips, Degraded, Precheck float64 }

// counters scrapes the sidecar's limiter counters.
func (s *Sidecar) counters(ctx context.Context) (Counters, error) {
	m, err := sidecarproc.Scrape(ctx, "http://"+s.Admin+"/metrics", "redline_sidecar_redis_decisions_total",
		"redline_sidecar_redis_round_trips_total", "redline_sidecar_degraded_decisions_total", "redline_sidecar_precheck_hits_total")
	if err != nil {
		return Counters{}, err
	}
	return Counters{RedisDecisions: m["redline_sidecar_redis_decisions_total"], RoundTrips: m["redline_sidecar_redis_round_trips_total"],
		Degraded: m["redline_sidecar_degraded_decisions_total"], Precheck: m["redline_sidecar_precheck_hits_total"]}, nil
}

// writeSidecarFiles writes the policies document and a labels file the way kubelet would.
func writeSidecarFiles(dir string) (cfgDir, labels string, err error) {
	doc, err := policiesDocument()
	if err != nil {
		return "", "", err
	}
	cfgDir, info := filepath.Join(dir, "policies"), filepath.Join(dir, "podinfo")
	if err := kubeletdir.Write(cfgDir, map[string][]byte{policydoc.DataKey: doc}); err != nil {
		return "", "", fmt.Errorf("writing the policies: %w", err)
	}
	if err := kubeletdir.Write(info, map[string][]byte{"labels": []byte("app=\"bench\"\n")}); err != nil {
		return "", "", fmt.Errorf("writing the labels: %w", err)
	}
	return cfgDir, filepath.Join(info, "labels"), nil
}
