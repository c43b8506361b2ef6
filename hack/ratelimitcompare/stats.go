package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/redline-dev/redline/internal/testutil/sidecarproc"
)

// unknown stands for a fact that could not be read.
const unknown = "unknown"

// harnessCommands are what this tool itself sends to Redis around a cell; they are not the
// servers' work.
var harnessCommands = []string{"info", "config|resetstat", "flushall", "dbsize", "scan", "ping", "hello", "client|setinfo", "select"}

// parseCommandStats reads INFO commandstats into calls per command, without the harness's own.
func parseCommandStats(info string) (map[string]int64, error) {
	out := map[string]int64{}
	for line := range strings.SplitSeq(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		cmd, isStat := strings.CutPrefix(name, "cmdstat_")
		if !ok || !isStat || slices.Contains(harnessCommands, cmd) {
			continue
		}
		for field := range strings.SplitSeq(rest, ",") {
			if v, ok := strings.CutPrefix(field, "calls="); ok {
				n, err := strconv.ParseInt(v, 10, 64)
				if err != nil {
					return nil, fmt.Errorf("commandstats line %q: %w", line, err)
				}
				out[cmd] = n
			}
		}
	}
	return out, nil
}

// scriptCommands run a server-side script; the commands a script calls count in commandstats
// too. The sidecar calls nothing but scripts, envoyproxy/ratelimit nothing but plain commands
// (the sidecar's heartbeat scripts still run during its cells, a few per cell).
var scriptCommands = []string{"evalsha", "eval", "evalsha_ro", "eval_ro", "fcall", "fcall_ro"}

// formatPerDecision renders calls per decision, biggest first: "INCRBY 1.00, EXPIRE 1.00", or
// for a server that runs scripts "EVALSHA 1.00 (inside: TIME 1.00, ...)".
func formatPerDecision(calls map[string]int64, decisions int64, scripts bool) string {
	if decisions <= 0 || len(calls) == 0 {
		return "-"
	}
	outer, inner := map[string]int64{}, map[string]int64{}
	for n, c := range calls {
		if scripts && !slices.Contains(scriptCommands, n) {
			inner[n] = c
		} else if scripts || !slices.Contains(scriptCommands, n) {
			outer[n] = c
		}
	}
	s := perDecision(outer, decisions)
	if len(inner) > 0 {
		s += " (inside: " + perDecision(inner, decisions) + ")"
	}
	return s
}

func perDecision(calls map[string]int64, decisions int64) string {
	names := make([]string, 0, len(calls))
	for n := range calls {
		names = append(names, n)
	}
	slices.SortFunc(names, func(a, b string) int {
		if calls[a] != calls[b] {
			return int(calls[b] - calls[a])
		}
		return strings.Compare(a, b)
	})
	parts := make([]string, 0, len(names))
	for _, n := range names {
		if r := float64(calls[n]) / float64(decisions); r >= 0.005 {
			parts = append(parts, fmt.Sprintf("%s %.2f", strings.ToUpper(n), r))
		}
	}
	if len(parts) == 0 {
		return "< 0.01"
	}
	return strings.Join(parts, ", ")
}

// resetStats resets the command statistics before a cell is measured.
func resetStats(ctx context.Context, rc *redis.Client) error {
	if err := rc.ConfigResetStat(ctx).Err(); err != nil {
		return fmt.Errorf("CONFIG RESETSTAT: %w", err)
	}
	return nil
}

// redisAfter reads what a cell did in Redis: calls per command and how many keys match pattern.
func redisAfter(ctx context.Context, rc *redis.Client, pattern string) (map[string]int64, int, error) {
	info, err := rc.Info(ctx, "commandstats").Result()
	if err != nil {
		return nil, 0, fmt.Errorf("INFO commandstats: %w", err)
	}
	calls, err := parseCommandStats(info)
	if err != nil {
		return nil, 0, err
	}
	n := 0
	iter := rc.Scan(ctx, 0, pattern, 1000).Iterator()
	for iter.Next(ctx) {
		n++
	}
	if err := iter.Err(); err != nil {
		return nil, 0, fmt.Errorf("SCAN %s: %w", pattern, err)
	}
	return calls, n, nil
}

// sidecarCounters are the sidecar's limiter counters from /metrics.
type sidecarCounters struct{ RedisDecisions, RoundTrips, Degraded float64 }

func (s *sidecar) counters(ctx context.Context) (sidecarCounters, error) {
	m, err := sidecarproc.Scrape(ctx, "http://"+s.Admin+"/metrics", "redline_sidecar_redis_decisions_total",
		"redline_sidecar_redis_round_trips_total", "redline_sidecar_degraded_decisions_total")
	if err != nil {
		return sidecarCounters{}, err
	}
	return sidecarCounters{RedisDecisions: m["redline_sidecar_redis_decisions_total"],
		RoundTrips: m["redline_sidecar_redis_round_trips_total"], Degraded: m["redline_sidecar_degraded_decisions_total"]}, nil
}

// loadAverage is the 1, 5 and 15 minute load averages.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return unknown
	}
	if f := strings.Fields(string(b)); len(f) >= 3 {
		return strings.Join(f[:3], " ")
	}
	return unknown
}

// cpuModel is the first model name of /proc/cpuinfo.
func cpuModel() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return unknown
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if k, v, ok := strings.Cut(s.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return unknown
}

// redisVersion is redis-server's version.
func redisVersion(bin string) string {
	out, err := exec.Command(bin, "--version").Output()
	if err != nil {
		return unknown
	}
	for f := range strings.FieldsSeq(string(out)) {
		if v, ok := strings.CutPrefix(f, "v="); ok {
			return v
		}
	}
	return unknown
}

// binaryRevision is the VCS revision Go stamped into bin (go version -m), if it was built
// from a git checkout.
func binaryRevision(bin string) string {
	out, err := exec.Command("go", "version", "-m", bin).Output()
	if err != nil {
		return ""
	}
	for line := range strings.SplitSeq(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) == 2 && f[0] == "build" {
			if v, ok := strings.CutPrefix(f[1], "vcs.revision="); ok {
				return v
			}
		}
	}
	return ""
}

func cores() int { return runtime.NumCPU() }
