package main

import (
	"strings"
	"testing"
	"time"

	"github.com/redline-dev/redline/internal/sidecar/rls"
)

func TestParseCommandStats(t *testing.T) {
	info := "# Commandstats\r\n" +
		"cmdstat_evalsha:calls=100,usec=900,usec_per_call=9.00,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_time:calls=100,usec=10,usec_per_call=0.10,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_info:calls=3,usec=10,usec_per_call=3.33,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_config|resetstat:calls=1,usec=1,usec_per_call=1.00,rejected_calls=0,failed_calls=0\r\n"
	got, err := parseCommandStats(info)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got["evalsha"] != 100 || got["time"] != 100 {
		t.Fatalf("got %v, want evalsha and time only (the harness's own commands left out)", got)
	}
}

func TestFormatPerDecision(t *testing.T) {
	for _, tc := range []struct {
		calls   map[string]int64
		scripts bool
		want    string
	}{
		{map[string]int64{"incrby": 1000, "expire": 1000}, false, "EXPIRE 1.00, INCRBY 1.00"},
		{map[string]int64{"incrby": 1000, "expire": 1000, "evalsha": 2, "time": 2}, false, "EXPIRE 1.00, INCRBY 1.00"},
		{map[string]int64{"evalsha": 500, "time": 500, "set": 200}, true, "EVALSHA 0.50 (inside: TIME 0.50, SET 0.20)"},
		{map[string]int64{"get": 1}, false, "< 0.01"},
		{nil, false, "-"},
	} {
		if got := formatPerDecision(tc.calls, 1000, tc.scripts); got != tc.want {
			t.Errorf("formatPerDecision(%v) = %q, want %q", tc.calls, got, tc.want)
		}
	}
}

func TestRenderReportRatios(t *testing.T) {
	cell := func(server string, callers, round int, perSec float64) Cell {
		return Cell{Server: server, Callers: callers, Round: round, Result: Result{Decisions: 10, PerSec: perSec, P99: time.Millisecond}}
	}
	cells := []Cell{
		cell(serverEnvoy, 16, 1, 1000), cell(serverSidecar, 16, 1, 2500),
		cell(serverSidecar, 16, 2, 3000), cell(serverEnvoy, 16, 2, 1000),
	}
	out := renderReport(Meta{EnvoyCommit: "abc"}, []int{16}, cells)
	for _, want := range []string{"envoyproxy/ratelimit abc", "| redline sidecar | 16 | 1 | 2500 |", "| 2.50x |", "| 3.00x |", "| 16 | 1000 | 2750 | 2.75x (2.50-3.00) |"} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q:\n%s", want, out)
		}
	}
}

func TestParseFlags(t *testing.T) {
	t.Setenv("ENVOY_RATELIMIT_BIN", "")
	if _, err := parseFlags(nil); err == nil || !strings.Contains(err.Error(), "ENVOY_RATELIMIT_BIN") {
		t.Fatalf("without a binary: %v, want an error naming ENVOY_RATELIMIT_BIN", err)
	}
	o, err := parseFlags([]string{"-envoy-ratelimit=/x", "-callers=4, 8", "-envoy-env=REDIS_POOL_SIZE=20"})
	if err != nil {
		t.Fatal(err)
	}
	if len(o.Callers) != 2 || o.Callers[1] != 8 || o.EnvoyEnv[0] != "REDIS_POOL_SIZE=20" {
		t.Fatalf("got %+v", o)
	}
	for _, bad := range [][]string{{"-envoy-ratelimit=/x", "-callers=0"}, {"-envoy-ratelimit=/x", "-envoy-env=NOEQUALS"}, {"-envoy-ratelimit=/x", "-rounds=0"}} {
		if _, err := parseFlags(bad); err == nil {
			t.Errorf("parseFlags(%q) accepted", bad)
		}
	}
}

// Both servers must see the same rule in the same request: the sidecar maps it to its bench
// rule and takes k's value as the key.
func TestRequestSelectsTheRuleOfBoth(t *testing.T) {
	req := request(benchRule, "key-7")
	h, ok := rls.HitFor(req.Descriptors[0])
	if !ok || h.Policy != domain || h.Rule != benchRule || len(h.Key) != 1 || h.Key[0] != "key-7" {
		t.Fatalf("HitFor = %+v, %v", h, ok)
	}
	y := envoyConfigYAML()
	for _, want := range []string{"domain: bench\n", "value: bench/r\n", "- key: k\n", "requests_per_unit: 1000000\n"} {
		if !strings.Contains(y, want) {
			t.Errorf("envoyproxy/ratelimit config lacks %q:\n%s", want, y)
		}
	}
	if _, err := policiesDocument(); err != nil {
		t.Fatal(err)
	}
}
