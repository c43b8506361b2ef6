package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/redline-dev/redline/internal/policydoc"
	"github.com/redline-dev/redline/internal/testutil/proc"
	"github.com/redline-dev/redline/internal/testutil/redistest"
	"github.com/redline-dev/redline/internal/testutil/sidecarproc"
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

// server is a rate limit server process; GRPC is the address of its rate limit service.
type server struct {
	*proc.Process
	GRPC string
}

// stopGrace is how long a server has to end after SIGTERM before it is killed.
const stopGrace = 5 * time.Second

// freeAddrs are n loopback addresses nothing listens on.
func freeAddrs(n int) ([]string, error) {
	out := make([]string, n)
	for i := range out {
		p, err := redistest.FreePort()
		if err != nil {
			return nil, fmt.Errorf("finding a free port: %w", err)
		}
		out[i] = "127.0.0.1:" + strconv.Itoa(p)
	}
	return out, nil
}

// startEnvoyRatelimit runs envoyproxy/ratelimit's server binary against redisAddr, configured
// the way its README documents: environment variables and a YAML file under
// RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/config. extraEnv (KEY=VALUE) comes last and wins.
func startEnvoyRatelimit(ctx context.Context, bin, dir, redisAddr string, extraEnv []string) (*server, error) {
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
	env := append(os.Environ(),
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
	p, err := proc.Start(dir, "envoy-ratelimit", bin, nil, append(env, extraEnv...))
	if err != nil {
		return nil, err
	}
	if err := p.WaitHTTP(ctx, "http://"+httpAddr+"/healthcheck", 30*time.Second, 50*time.Millisecond); err != nil {
		_ = p.Stop(stopGrace)
		return nil, fmt.Errorf("waiting for envoyproxy/ratelimit to be ready: %w", err)
	}
	return &server{Process: p, GRPC: grpcAddr}, nil
}

// sidecar is a Redline sidecar process; Admin serves /readyz and /metrics.
type sidecar struct{ *sidecarproc.Sidecar }

// startSidecar runs the sidecar binary with the policies document against redisURL. The
// proxy face needs an upstream; nothing listens there, only the gRPC face is measured.
func startSidecar(ctx context.Context, bin, dir, redisURL string, extraArgs []string) (*sidecar, error) {
	doc, err := policiesDocument()
	if err != nil {
		return nil, err
	}
	files, err := sidecarproc.WriteFiles(dir, doc, domain)
	if err != nil {
		return nil, err
	}
	s, err := sidecarproc.Start(ctx, sidecarproc.Options{Bin: bin, Dir: dir, Name: "sidecar", Pod: "compare-0",
		Namespace: domain, Files: files, RedisURL: redisURL, Args: extraArgs})
	if err != nil {
		return nil, fmt.Errorf("starting the Redline sidecar: %w", err)
	}
	return &sidecar{s}, nil
}
