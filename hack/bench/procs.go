package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/redline-dev/redline/internal/policydoc"
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
type Sidecar struct{ *sidecarproc.Sidecar }

// startSidecar runs bin as pod name with files, Redis at redisURL and upstream as its
// application, logging to dir, and waits until it is ready.
func startSidecar(ctx context.Context, bin, dir, name string, files sidecarproc.Files, redisURL, upstream string) (*Sidecar, error) {
	s, err := sidecarproc.Start(ctx, sidecarproc.Options{Bin: bin, Dir: dir, Name: name, Namespace: benchNamespace,
		Files: files, RedisURL: redisURL, Upstream: upstream})
	if err != nil {
		return nil, fmt.Errorf("starting sidecar %s: %w", name, err)
	}
	return &Sidecar{s}, nil
}

// Stop ends the process (SIGTERM, then SIGKILL after 3s) and waits for it.
func (s *Sidecar) Stop() { _ = s.Sidecar.Stop(3 * time.Second) }

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
func writeSidecarFiles(dir string) (sidecarproc.Files, error) {
	doc, err := policiesDocument()
	if err != nil {
		return sidecarproc.Files{}, err
	}
	return sidecarproc.WriteFiles(dir, doc, "bench")
}
