package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/redline-dev/redline/internal/policydoc"
	"github.com/redline-dev/redline/internal/testutil/sidecarproc"
)

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

// fetchProfile writes the sidecar's CPU profile over the next seconds to file.
func fetchProfile(ctx context.Context, admin string, seconds int, file string) error {
	return fetch(ctx, fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", admin, seconds), seconds, file)
}

// fetchHeap writes the sidecar's heap profile, after a collection (what is live), to file.
func fetchHeap(ctx context.Context, admin, file string) error {
	return fetch(ctx, fmt.Sprintf("http://%s/debug/pprof/heap?gc=1", admin), 0, file)
}

func fetch(ctx context.Context, url string, seconds int, file string) error {
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

// counters are what the sidecar's metrics count, read before and after a load.
type counters struct {
	// degraded is the decisions its failure mode made; mallocs and allocBytes are the Go heap's
	// objects and bytes allocated, gcs its collections and nextGC the heap size of the next
	// (twice the heap live after the last, at least 4 MiB; every build registers the Go
	// collector).
	degraded, mallocs, allocBytes, gcs, nextGC float64
}

func (s *sidecar) counters(ctx context.Context) (counters, error) {
	const degraded, mallocs, allocBytes = "redline_sidecar_degraded_decisions_total", "go_memstats_mallocs_total", "go_memstats_alloc_bytes_total"
	const gcs, nextGC = "go_gc_duration_seconds_count", "go_memstats_next_gc_bytes"
	m, err := sidecarproc.Scrape(ctx, "http://"+s.Admin+"/metrics", degraded, mallocs, allocBytes, gcs, nextGC)
	if err != nil {
		return counters{}, err
	}
	return counters{degraded: m[degraded], mallocs: m[mallocs], allocBytes: m[allocBytes], gcs: m[gcs], nextGC: m[nextGC]}, nil
}
