package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redline-dev/redline/internal/policydoc"
	"github.com/redline-dev/redline/internal/testutil/kubeletdir"
	"github.com/redline-dev/redline/internal/testutil/redistest"
)

// What both servers enforce. Each request carries one descriptor of two entries,
// generic_key=<domain>/<rule> and k=<key>, the same bytes for both servers: envoyproxy/ratelimit
// matches it with a nested descriptor (generic_key, then k); Redline's RLS face reads
// "<policy>/<rule>" from generic_key and takes k's value as the key.
const (
	domain     = "bench" // envoyproxy/ratelimit's domain; Redline's namespace and policy
	benchRule  = "r"     // FixedWindow, benchLimit per minute: never reached in a cell
	probeRule  = "probe" // FixedWindow, 1 per minute: shows that both servers really enforce
	entryKey   = "k"
	benchLimit = 1_000_000
)

// envoyConfigYAML is envoyproxy/ratelimit's descriptor configuration for domain bench.
func envoyConfigYAML() string {
	return `domain: ` + domain + `
descriptors:
  - key: generic_key
    value: ` + domain + `/` + benchRule + `
    descriptors:
      - key: ` + entryKey + `
        rate_limit:
          unit: minute
          requests_per_unit: ` + strconv.Itoa(benchLimit) + `
  - key: generic_key
    value: ` + domain + `/` + probeRule + `
    descriptors:
      - key: ` + entryKey + `
        rate_limit:
          unit: minute
          requests_per_unit: 1
`
}

// policiesDocument is the compiled document the sidecar loads: the same two limits.
func policiesDocument() ([]byte, error) {
	rule := func(name string, requests int64) policydoc.Rule {
		return policydoc.Rule{Name: name, Key: []policydoc.KeyPart{{Header: entryKey}}, Algorithm: "FixedWindow",
			Requests: requests, WindowMS: time.Minute.Milliseconds(), Mode: "Enforce"}
	}
	p := policydoc.Policy{
		Name: domain, Generation: 1, Selector: policydoc.Selector{MatchLabels: map[string]string{"app": domain}},
		FailureMode: "Closed", // a decision Redis did not make is an error here, not an admission
		Rules:       []policydoc.Rule{rule(benchRule, benchLimit), rule(probeRule, 1)},
	}
	_, data, err := policydoc.Build(domain, []policydoc.Policy{p}, map[string]string{})
	if err != nil {
		return nil, fmt.Errorf("building the policies document: %w", err)
	}
	return data, nil
}

// proc is a server process on loopback ports with its output in a log file.
type proc struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
	log  string
	// GRPC is the address of its rate limit service.
	GRPC string
}

// pid is the process's id, 0 before it started.
func (p *proc) pid() int {
	if p.cmd == nil || p.cmd.Process == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

func freeAddr() (string, error) {
	p, err := redistest.FreePort()
	if err != nil {
		return "", fmt.Errorf("finding a free port: %w", err)
	}
	return "127.0.0.1:" + strconv.Itoa(p), nil
}

func freeAddrs(n int) ([]string, error) {
	out := make([]string, n)
	for i := range out {
		a, err := freeAddr()
		if err != nil {
			return nil, err
		}
		out[i] = a
	}
	return out, nil
}

func (p *proc) start() error {
	logf, err := os.Create(p.log)
	if err != nil {
		return fmt.Errorf("creating the log of %s: %w", p.name, err)
	}
	p.cmd.Stdout, p.cmd.Stderr = logf, logf
	p.done = make(chan struct{})
	if err := p.cmd.Start(); err != nil {
		_ = logf.Close()
		return fmt.Errorf("starting %s: %w", p.name, err)
	}
	go func() { _ = p.cmd.Wait(); _ = logf.Close(); close(p.done) }()
	return nil
}

// waitHTTP polls url until it answers 200, the process exits or limit passes.
func (p *proc) waitHTTP(ctx context.Context, url string, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	client := &http.Client{Timeout: time.Second}
	for {
		if resp, err := client.Get(url); err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-p.done:
			return fmt.Errorf("%s exited before ready:\n%s", p.name, p.logTail())
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w", p.name, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready within %s:\n%s", p.name, limit, p.logTail())
		}
	}
}

func (p *proc) logTail() string {
	b, _ := os.ReadFile(p.log)
	if len(b) > 3000 {
		b = b[len(b)-3000:]
	}
	return string(b)
}

// stop ends the process (SIGTERM, then SIGKILL after 5s) and waits for it.
func (p *proc) stop() {
	if p.cmd.Process == nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(5 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// startEnvoyRatelimit runs envoyproxy/ratelimit's server binary against redisAddr, configured
// the way its README documents: environment variables and a YAML file under
// RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/config. extraEnv (KEY=VALUE) comes last and wins.
func startEnvoyRatelimit(ctx context.Context, bin, dir, redisAddr string, extraEnv []string) (*proc, error) {
	runtimeRoot := filepath.Join(dir, "runtime")
	cfgDir := filepath.Join(runtimeRoot, "ratelimit", "config")
	if err := os.MkdirAll(cfgDir, 0o755); err != nil {
		return nil, fmt.Errorf("creating %s: %w", cfgDir, err)
	}
	if err := os.WriteFile(filepath.Join(cfgDir, domain+".yaml"), []byte(envoyConfigYAML()), 0o644); err != nil {
		return nil, fmt.Errorf("writing the envoyproxy/ratelimit config: %w", err)
	}
	addrs, err := freeAddrs(3)
	if err != nil {
		return nil, err
	}
	httpAddr, grpcAddr, debugAddr := addrs[0], addrs[1], addrs[2]
	hostPort := func(a string) (string, string) { h, port, _ := strings.Cut(a, ":"); return h, port }
	hh, hp := hostPort(httpAddr)
	gh, gp := hostPort(grpcAddr)
	dh, dp := hostPort(debugAddr)
	p := &proc{name: "envoyproxy/ratelimit", log: filepath.Join(dir, "envoy-ratelimit.log"), GRPC: grpcAddr}
	p.cmd = exec.Command(bin)
	p.cmd.Env = append(os.Environ(),
		"HOST="+hh, "PORT="+hp, "GRPC_HOST="+gh, "GRPC_PORT="+gp, "DEBUG_HOST="+dh, "DEBUG_PORT="+dp,
		"RUNTIME_ROOT="+runtimeRoot, "RUNTIME_SUBDIRECTORY=ratelimit", "RUNTIME_APPDIRECTORY=config",
		"RUNTIME_WATCH_ROOT=false", "RUNTIME_IGNOREDOTFILES=true",
		"HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED=true",
		// USE_STATSD=false alone sends stats to a logging sink that writes a line per timer
		// sample, about one per request: a cost no deployment pays. DISABLE_STATS keeps the
		// counting and drops the output, as the sidecar's in-process metrics cost nothing to scrape.
		"USE_STATSD=false", "DISABLE_STATS=true", "LOG_LEVEL=warn",
		"BACKEND_TYPE=redis", "REDIS_SOCKET_TYPE=tcp", "REDIS_TYPE=SINGLE", "REDIS_URL="+redisAddr,
	)
	p.cmd.Env = append(p.cmd.Env, extraEnv...)
	if err := p.start(); err != nil {
		return nil, err
	}
	if err := p.waitHTTP(ctx, "http://"+httpAddr+"/healthcheck", 30*time.Second); err != nil {
		p.stop()
		return nil, err
	}
	return p, nil
}

// sidecar is a Redline sidecar process; Admin serves /readyz and /metrics.
type sidecar struct {
	*proc
	Admin string
}

// startSidecar runs the sidecar binary with the policies document against redisURL. The
// proxy face needs an upstream; nothing listens there, only the gRPC face is measured.
func startSidecar(ctx context.Context, bin, dir, redisURL string, extraArgs []string) (*sidecar, error) {
	doc, err := policiesDocument()
	if err != nil {
		return nil, err
	}
	cfgDir, info := filepath.Join(dir, "policies"), filepath.Join(dir, "podinfo")
	if err := kubeletdir.Write(cfgDir, map[string][]byte{policydoc.DataKey: doc}); err != nil {
		return nil, fmt.Errorf("writing the policies: %w", err)
	}
	if err := kubeletdir.Write(info, map[string][]byte{"labels": []byte("app=\"" + domain + "\"\n")}); err != nil {
		return nil, fmt.Errorf("writing the labels: %w", err)
	}
	addrs, err := freeAddrs(5)
	if err != nil {
		return nil, err
	}
	s := &sidecar{proc: &proc{name: "redline sidecar", log: filepath.Join(dir, "sidecar.log"), GRPC: addrs[2]}, Admin: addrs[1]}
	args := []string{"--listen=" + addrs[0], "--admin-listen=" + s.Admin, "--grpc-listen=" + s.GRPC,
		"--check-listen=" + addrs[3], "--upstream=" + addrs[4], "--config-dir=" + cfgDir,
		"--pod-labels=" + filepath.Join(info, "labels"), "--log-level=warn"}
	s.cmd = exec.Command(bin, append(args, extraArgs...)...)
	s.cmd.Env = append(os.Environ(), "REDLINE_REDIS_URL="+redisURL, "POD_NAME=compare-0", "POD_NAMESPACE="+domain)
	if err := s.start(); err != nil {
		return nil, err
	}
	if err := s.waitHTTP(ctx, "http://"+s.Admin+"/readyz", 30*time.Second); err != nil {
		s.stop()
		return nil, err
	}
	return s, nil
}
