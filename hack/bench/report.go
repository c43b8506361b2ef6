package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// writeReport writes bench.md, bench.json and bench.png into dir and prints bench.md.
func writeReport(dir string, rep *Report) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("creating %s: %w", dir, err)
	}
	js, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return fmt.Errorf("encoding the report: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "bench.json"), append(js, '\n'), 0o644); err != nil {
		return fmt.Errorf("writing bench.json: %w", err)
	}
	if err := drawChart(filepath.Join(dir, "bench.png"), rep); err != nil {
		return err
	}
	md := markdown(rep)
	if err := os.WriteFile(filepath.Join(dir, "bench.md"), []byte(md), 0o644); err != nil {
		return fmt.Errorf("writing bench.md: %w", err)
	}
	fmt.Print(md)
	return nil
}

// ceiling is the -P 16 figure every throughput is read against.
func (r *Report) ceiling() float64 {
	for _, c := range r.Ceilings {
		if c.Pipeline == 16 {
			return c.PerSec
		}
	}
	return 0
}

func us(d time.Duration) string {
	if d >= time.Millisecond {
		return fmt.Sprintf("%.2f ms", float64(d)/float64(time.Millisecond))
	}
	return fmt.Sprintf("%d µs", d.Microseconds())
}

func pct(v, of float64) string {
	if of <= 0 {
		return "–"
	}
	return fmt.Sprintf("%.1f%%", 100*v/of)
}

// markdown renders the report as the tables of results/bench.md.
func markdown(r *Report) string {
	var b strings.Builder
	m := r.Machine
	ceil := r.ceiling()
	fmt.Fprintf(&b, "# Redline benchmark\n\n")
	fmt.Fprintf(&b, "`%s` (what `make bench` runs) on %s (%d cores), %s, redis-server %s, Linux %s, %s.\n", r.Command, m.CPU, m.Cores, m.Go, m.Redis, m.Kernel, m.StartedAtUTC)
	fmt.Fprintf(&b, "Load average (1/5/15 min) **%s at start, %s at end**; wall time %.0f s. ", m.LoadAtStart, m.LoadAtEnd, m.WallSeconds)
	fmt.Fprintf(&b, "Everything (load generator, upstream, sidecars, redis-server) shares this machine over loopback, so absolute numbers are low and noisy; read them as fractions of the ceiling measured in the same run.\n\n")

	fmt.Fprintf(&b, "## Ceiling: redis-benchmark with the same script\n\n")
	fmt.Fprintf(&b, "| redis-benchmark | clients | requests | EVALSHA/s |\n| --- | ---: | ---: | ---: |\n")
	for _, c := range r.Ceilings {
		fmt.Fprintf(&b, "| `-P %d` SlidingWindowCounter script, 1024 keys | %d | %d | %.0f |\n", c.Pipeline, c.Clients, c.Requests, c.PerSec)
	}

	fmt.Fprintf(&b, "\n## Decisions through the sidecar's faces\n\n")
	fmt.Fprintf(&b, "One sidecar, one SlidingWindowCounter rule never reached, 10000 keys: every decision runs the script in Redis. Closed loop: each client sends its next request when the previous is answered. \"direct\" is the same HTTP load sent straight to the upstream, without Redline. Round trips per decision come from the sidecar's own metrics. \"degraded\": decisions its failure mode made because Redis did not answer within the sidecar's 50 ms --redis-timeout (a sign of the machine's load, not of Redis).\n\n")
	fmt.Fprintf(&b, "| face | clients | decisions/s | of ceiling | p50 | p99 | Redis round trips / decision | degraded |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	for _, f := range r.Faces {
		rt, deg, of := fmt.Sprintf("%.3f", f.RoundTripsPerDecision), fmt.Sprintf("%.0f", f.Degraded), pct(f.PerSec, ceil)
		if f.Face == faceDirect {
			rt, deg, of = "–", "–", "–"
		}
		fmt.Fprintf(&b, "| %s | %d | %.0f | %s | %s | %s | %s | %s |\n", f.Face, f.Concurrency, f.PerSec, of, us(f.P50), us(f.P99), rt, deg)
	}

	fmt.Fprintf(&b, "\n### The same faces under wrk\n\n")
	if r.WrkSkipped != "" {
		fmt.Fprintf(&b, "%s.\n", r.WrkSkipped)
	} else {
		fmt.Fprintf(&b, "wrk (a C load generator, `wrk -t2 -c64 --latency` with a Lua script naming 10000 keys) leaves the sidecar more of the two cores than the Go clients above, so these rows are the sidecar's capacity on this machine. RSS is the sidecar's peak during the run.\n\n")
		fmt.Fprintf(&b, "| face | connections | seconds | decisions/s | p50 | p99 | non-2xx | sidecar RSS peak |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
		for _, c := range r.Wrk {
			fmt.Fprintf(&b, "| %s | %d | %.0f | %.0f | %s | %s | %d | %.1f MiB |\n", c.Face, c.Connections, c.Seconds, c.PerSec, us(c.P50), us(c.P99), c.Non2xx, c.PeakRSSMiB)
		}
	}

	fmt.Fprintf(&b, "\n## Redis round trips per decision\n\n")
	fmt.Fprintf(&b, "The limiter engine in-process (no HTTP), against the same Redis. *Under limit*: 1024 keys, never refused. *Over limit*: 64 keys with a limit of 10 per minute, so almost every decision is a refusal. Round trips are counted on the client (one per command or pipeline); commands are the EVALSHA, INCR and EXPIRE calls Redis counted in INFO commandstats (batching saves round trips, not script runs; the pre-check saves both). \"local\": refused from the pre-check cache, no Redis ceiling applies.\n\n")
	fmt.Fprintf(&b, "| mode | workload | callers | decisions/s | of ceiling | p50 | p99 | round trips / decision | Redis commands / decision | allocs / decision | refused |\n| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	for _, c := range r.RoundTrips {
		of := pct(c.PerSec, ceil)
		if c.Commands < 0.5 {
			of = "local" // refused by the pre-check without asking Redis: no Redis ceiling applies
		}
		fmt.Fprintf(&b, "| %s | %s | %d | %.0f | %s | %s | %s | %.3f | %.3f | %.1f | %.0f%% |\n", c.Mode, c.Workload, c.Concurrency, c.PerSec, of, us(c.P50), us(c.P99), c.RoundTrips, c.Commands, c.Allocs, 100*c.Refused)
	}

	b.WriteString(engineRatios(r.RoundTrips, ceil))
	fmt.Fprintf(&b, "\n## Accuracy: admitted vs limit across replicas\n\n")
	if len(r.Accuracy) > 0 {
		fmt.Fprintf(&b, "Separate sidecar processes share one limit of %d per %.0f minutes on one key; %d requests go round-robin over them through `/v1/check`, 16 at a time. Independent in-memory counters would admit up to replicas x limit.\n\n", r.Accuracy[0].Limit, accWindow.Minutes(), r.Accuracy[0].Sent)
	}
	fmt.Fprintf(&b, "| algorithm | replicas | limit | sent | admitted | admitted / limit | degraded |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	for _, a := range r.Accuracy {
		fmt.Fprintf(&b, "| %s | %d | %d | %d | %d | %.2f | %d |\n", a.Algorithm, a.Replicas, a.Limit, a.Sent, a.Admitted, float64(a.Admitted)/float64(a.Limit), a.Degraded)
	}

	fmt.Fprintf(&b, "\n## Memory: sidecar RSS\n\n| when | RSS |\n| --- | ---: |\n")
	fmt.Fprintf(&b, "| idle, after start | %.1f MiB |\n| peak during the face cells | %.1f MiB |\n| after the face cells | %.1f MiB |\n", r.Memory.IdleMiB, r.Memory.PeakLoadMiB, r.Memory.AfterLoadMiB)
	if len(r.Memory.ReplicasIdleMiB) > 0 {
		fmt.Fprintf(&b, "| %d more replicas, idle (min–max) | %.1f–%.1f MiB |\n", len(r.Memory.ReplicasIdleMiB), slices.Min(r.Memory.ReplicasIdleMiB), slices.Max(r.Memory.ReplicasIdleMiB))
	}
	b.WriteString(connsMarkdown(r.Conns))
	fmt.Fprintf(&b, "\n![decisions per second and p99 latency per face, with the Redis ceiling](bench.png)\n")
	return b.String()
}

// engineRatios says, per concurrency of the under-limit workload, how the default engine
// compares with one EVALSHA per decision and with the redis-benchmark ceiling.
func engineRatios(cells []RoundTripCell, ceil float64) string {
	const engineMode, plainMode = "engine, batching + pre-check + leases (default)", "EVALSHA per decision"
	byConc := map[int]map[string]float64{}
	calls := map[int]float64{}
	var concs []int
	for _, c := range cells {
		if c.Workload != workAdmit || c.Mode != engineMode && c.Mode != plainMode {
			continue
		}
		if byConc[c.Concurrency] == nil {
			byConc[c.Concurrency] = map[string]float64{}
			concs = append(concs, c.Concurrency)
		}
		byConc[c.Concurrency][c.Mode] = c.PerSec
		if c.Mode == engineMode {
			calls[c.Concurrency] = c.Commands
		}
	}
	var b strings.Builder
	for _, n := range concs {
		e, p := byConc[n][engineMode], byConc[n][plainMode]
		if e == 0 || p == 0 {
			continue
		}
		fmt.Fprintf(&b, "\nUnder limit, %d callers: the engine decides %.2fx as fast as one EVALSHA per decision, at %s of the ceiling, with %.3f Redis commands per decision.", n, e/p, pct(e, ceil), calls[n])
	}
	if b.Len() > 0 {
		b.WriteString("\n")
	}
	return b.String()
}
