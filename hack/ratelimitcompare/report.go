package main

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// Meta is what a reader needs to judge the numbers.
type Meta struct {
	Date, EnvoyCommit, CPU, Go, Redis, LoadStart, LoadEnd string
	Cores                                                 int
	Duration                                              time.Duration
	Rounds, Keys, Conns, Warmup                           int
	EnvoyEnv, SidecarArgs                                 []string
}

func ms(d time.Duration) string { return fmt.Sprintf("%.2f ms", float64(d)/float64(time.Millisecond)) }

// find returns the cell of server at callers in round.
func find(cells []Cell, server string, callers, round int) (Cell, bool) {
	i := slices.IndexFunc(cells, func(c Cell) bool { return c.Server == server && c.Callers == callers && c.Round == round })
	if i < 0 {
		return Cell{}, false
	}
	return cells[i], true
}

func median[T int64 | float64 | time.Duration](xs []T) T {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// formatCPU is the CPU each process spent per decision of a cell, and the share of a core it
// ran at: where the client nears a whole core, it is what bounds the cell.
func formatCPU(c Cell) string {
	n := c.Decisions + c.Errors
	if n == 0 || c.Elapsed <= 0 || c.CPU.Client == 0 {
		return "–"
	}
	part := func(d time.Duration) string {
		return fmt.Sprintf("%.0f µs (%.0f%%)", float64(d.Microseconds())/float64(n), 100*d.Seconds()/c.Elapsed.Seconds())
	}
	return part(c.CPU.Server) + " / " + part(c.CPU.Client) + " / " + part(c.CPU.Redis)
}

// renderReport is the markdown report: every cell, then a summary per concurrency.
func renderReport(m Meta, callers []int, cells []Cell) string {
	var b strings.Builder
	commit := m.EnvoyCommit
	if commit == "" {
		commit = "unknown (pass -envoy-ratelimit-commit)"
	}
	fmt.Fprintf(&b, "## Redline sidecar vs envoyproxy/ratelimit (Envoy RLS over gRPC)\n\n")
	fmt.Fprintf(&b, "%s · envoyproxy/ratelimit %s · %s, %d cores · %s · redis-server %s · load average %s at start, %s at end\n\n",
		m.Date, commit, m.CPU, m.Cores, m.Go, m.Redis, m.LoadStart, m.LoadEnd)
	fmt.Fprintf(&b, "One redis-server, one closed-loop grpc-go client (%d connection(s) per server), %d keys, FixedWindow 1,000,000/min "+
		"(never reached), %s per cell, %d rounds. Before every cell: Redis flushed, %d warm-up requests (each key seen before, the steady state), then Redis's statistics reset.", m.Conns, m.Keys, m.Duration, m.Rounds, m.Warmup)
	if len(m.EnvoyEnv) > 0 {
		fmt.Fprintf(&b, " envoyproxy/ratelimit environment added: `%s`.", strings.Join(m.EnvoyEnv, " "))
	}
	if len(m.SidecarArgs) > 0 {
		fmt.Fprintf(&b, " Sidecar flags added: `%s`.", strings.Join(m.SidecarArgs, " "))
	}
	b.WriteString("\n\n")
	b.WriteString("| server | callers | round | decisions/s | p50 | p99 | errors | Redis commands per decision | CPU per decision: server / client / redis-server | sidecar/envoy |\n")
	b.WriteString("| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- | ---: |\n")
	rounds := 0
	for _, c := range cells {
		rounds = max(rounds, c.Round)
	}
	for _, n := range callers {
		for r := 1; r <= rounds; r++ {
			for _, s := range []string{serverEnvoy, serverSidecar} {
				c, ok := find(cells, s, n, r)
				if !ok {
					continue
				}
				ratio := ""
				if e, ok := find(cells, serverEnvoy, n, r); ok && s == serverSidecar && e.PerSec > 0 {
					ratio = fmt.Sprintf("%.2fx", c.PerSec/e.PerSec)
				}
				errs := fmt.Sprint(c.Errors)
				if c.Degraded > 0 {
					errs += fmt.Sprintf(" (%.0f by its failure mode)", c.Degraded)
				}
				fmt.Fprintf(&b, "| %s | %d | %d | %.0f | %s | %s | %s | %s | %s | %s |\n", s, n, r, c.PerSec, ms(c.P50), ms(c.P99), errs,
					formatPerDecision(c.RedisCalls, c.Decisions+c.Errors, s == serverSidecar), formatCPU(c), ratio)
			}
		}
	}
	b.WriteString("\nMedians over the rounds:\n\n")
	b.WriteString("| callers | envoyproxy/ratelimit decisions/s | sidecar decisions/s | sidecar/envoy (per round) | p99 envoyproxy/ratelimit | p99 sidecar |\n")
	b.WriteString("| ---: | ---: | ---: | --- | ---: | ---: |\n")
	for _, n := range callers {
		var ePS, sPS, ratios []float64
		var eP99, sP99 []time.Duration
		for r := 1; r <= rounds; r++ {
			e, ok1 := find(cells, serverEnvoy, n, r)
			s, ok2 := find(cells, serverSidecar, n, r)
			if !ok1 || !ok2 {
				continue
			}
			ePS, sPS, eP99, sP99 = append(ePS, e.PerSec), append(sPS, s.PerSec), append(eP99, e.P99), append(sP99, s.P99)
			if e.PerSec > 0 {
				ratios = append(ratios, s.PerSec/e.PerSec)
			}
		}
		if len(ratios) == 0 {
			continue
		}
		fmt.Fprintf(&b, "| %d | %.0f | %.0f | %.2fx (%.2f-%.2f) | %s | %s |\n", n, median(ePS), median(sPS), median(ratios),
			slices.Min(ratios), slices.Max(ratios), ms(median(eP99)), ms(median(sP99)))
	}
	var rt []float64
	for _, c := range cells {
		if c.Server == serverSidecar && c.RoundTrips > 0 {
			rt = append(rt, c.RoundTrips)
		}
	}
	if len(rt) > 0 {
		fmt.Fprintf(&b, "\nThe sidecar's Redis round trips per decision (its batching), median over the cells: %.3f.\n", median(rt))
	}
	return b.String()
}
