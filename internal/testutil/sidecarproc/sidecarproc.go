// Package sidecarproc builds the sidecar binary, runs it (on proc) with the files kubelet would
// give it, and reads its metrics and CPU time, for the sidecar's system tests (test/sidecar) and
// the harnesses under hack/ that run it as a process beside other servers.
package sidecarproc

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Build compiles ./cmd/sidecar of the product module at root into dir as the Dockerfile builds
// it (static, stripped), with the product's own go.mod: what a harness measures, RSS above all,
// is the shipped binary.
func Build(ctx context.Context, root, dir string) (string, error) {
	bin := filepath.Join(dir, "sidecar")
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags=-s -w", "-o", bin, "./cmd/sidecar")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/sidecar in %s: %w\n%s", root, err, out)
	}
	return bin, nil
}

// Scrape reads the named unlabelled samples from the Prometheus text at metricsURL. Every name
// must be there.
func Scrape(ctx context.Context, metricsURL string, names ...string) (map[string]float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, metricsURL, nil)
	if err != nil {
		return nil, fmt.Errorf("building the metrics request: %w", err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("scraping %s: %w", metricsURL, err)
	}
	defer resp.Body.Close()
	want := make(map[string]bool, len(names))
	for _, n := range names {
		want[n] = true
	}
	out := make(map[string]float64, len(names))
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		name, val, ok := strings.Cut(sc.Text(), " ")
		if !ok || !want[name] {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(val), 64)
		if err != nil {
			return nil, fmt.Errorf("metric %s: %w", name, err)
		}
		out[name] = v
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading %s: %w", metricsURL, err)
	}
	for _, n := range names {
		if _, ok := out[n]; !ok {
			return nil, fmt.Errorf("metric %s missing from %s", n, metricsURL)
		}
	}
	return out, nil
}

// CPUTime is the user and system CPU time a process has used (from /proc/<pid>/stat, in
// clock ticks of 10ms), or an error where /proc does not say.
func CPUTime(pid int) (time.Duration, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The fields after the command name, which is in parentheses and may hold spaces.
	end := bytes.LastIndexByte(data, ')')
	if end < 0 || end+2 > len(data) {
		return 0, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(string(data[end+2:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	user, err1 := strconv.ParseInt(f[11], 10, 64)
	sys, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc/%d/stat: utime %q, stime %q", pid, f[11], f[12])
	}
	return time.Duration(user+sys) * 10 * time.Millisecond, nil
}
