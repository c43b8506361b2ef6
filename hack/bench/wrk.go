package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// WrkCell is one run of wrk, a C load generator, against a sidecar face. The harness's Go
// clients take a good share of the two cores from the sidecar; wrk leaves it more, so these
// are the rows to read the sidecar's own capacity from.
type WrkCell struct {
	Face        string        `json:"face"`
	Connections int           `json:"connections"`
	Seconds     float64       `json:"seconds"`
	PerSec      float64       `json:"perSec"`
	P50         time.Duration `json:"p50"`
	P99         time.Duration `json:"p99"`
	Non2xx      int64         `json:"non2xx"`
	PeakRSSMiB  float64       `json:"peakRSSMiB"`
}

const wrkCheckScript = `local n = 0
request = function()
  n = n + 1
  return wrk.format("POST", "/v1/check", {["Content-Type"] = "application/json"},
    '{"policy":"POLICY","rule":"RULE","key":["k' .. (n % 10000) .. '"]}')
end
`

const wrkProxyScript = `local n = 0
request = function()
  n = n + 1
  return wrk.format("GET", "/", {["KEYHEADER"] = "k" .. (n % 10000)})
end
`

// runWrk runs wrk against /v1/check and the proxy face of s, with 64 connections over two
// threads. It returns nil cells and a reason when wrk is not installed.
func runWrk(ctx context.Context, dir string, s *Sidecar, d time.Duration) ([]WrkCell, string, error) {
	if _, err := exec.LookPath("wrk"); err != nil {
		return nil, "wrk is not installed (Debian: apt-get install wrk); these rows were not measured", nil
	}
	var cells []WrkCell
	for _, f := range []struct{ face, url, script string }{
		{faceCheck, "http://" + s.Check, strings.NewReplacer("POLICY", benchPolicy, "RULE", benchRule).Replace(wrkCheckScript)},
		{faceProxy, "http://" + s.Proxy, strings.ReplaceAll(wrkProxyScript, "KEYHEADER", keyHeader)},
	} {
		script := filepath.Join(dir, strings.ReplaceAll(f.face, "/", "")+".lua")
		if err := os.WriteFile(script, []byte(f.script), 0o644); err != nil {
			return nil, "", fmt.Errorf("writing the wrk script: %w", err)
		}
		stop := sampleRSS(s.Pid())
		out, err := exec.CommandContext(ctx, "wrk", "-t2", "-c64", "-d"+strconv.Itoa(int(d.Seconds()))+"s",
			"--latency", "-s", script, f.url).CombinedOutput()
		peak := stop()
		if err != nil {
			return nil, "", fmt.Errorf("wrk against %s: %w\n%s", f.face, err, out)
		}
		c, err := parseWrk(string(out))
		if err != nil {
			return nil, "", fmt.Errorf("reading wrk's output for %s: %w\n%s", f.face, err, out)
		}
		c.Face, c.Connections, c.Seconds, c.PeakRSSMiB = f.face, 64, d.Seconds(), peak
		cells = append(cells, c)
		progress("  wrk %-10s %8.0f/s p50 %s p99 %s, RSS peak %.1f MiB", f.face, c.PerSec, us(c.P50), us(c.P99), peak)
	}
	return cells, "", nil
}

var (
	wrkRate    = regexp.MustCompile(`Requests/sec:\s+([0-9.]+)`)
	wrkPct     = regexp.MustCompile(`(?m)^\s+(50|99)%\s+([0-9.]+)(us|ms|s)\s*$`)
	wrkNon2xx  = regexp.MustCompile(`Non-2xx or 3xx responses:\s+(\d+)`)
	wrkUnitDur = map[string]time.Duration{"us": time.Microsecond, "ms": time.Millisecond, "s": time.Second}
)

func parseWrk(out string) (WrkCell, error) {
	var c WrkCell
	m := wrkRate.FindStringSubmatch(out)
	if m == nil {
		return c, fmt.Errorf("no Requests/sec line")
	}
	c.PerSec, _ = strconv.ParseFloat(m[1], 64)
	for _, p := range wrkPct.FindAllStringSubmatch(out, -1) {
		v, _ := strconv.ParseFloat(p[2], 64)
		d := time.Duration(v * float64(wrkUnitDur[p[3]]))
		if p[1] == "50" {
			c.P50 = d
		} else {
			c.P99 = d
		}
	}
	if c.P50 == 0 || c.P99 == 0 {
		return c, fmt.Errorf("no latency distribution")
	}
	if m := wrkNon2xx.FindStringSubmatch(out); m != nil {
		c.Non2xx, _ = strconv.ParseInt(m[1], 10, 64)
	}
	return c, nil
}
