package main

import (
	"fmt"
	"runtime"
	"slices"

	"github.com/redline-dev/redline/hack/bench/internal/machine"
)

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// budget: now within 10% of the base, for the sidecar's CPU and RSS.
const budget = 1.10

func printTable(o options, command, load string, versions [2]*version, cells []cell, results map[cell]*[2][]sample) {
	b := versions[0].name
	fmt.Printf("`%s`, %d rounds per cell and version (base and now alternating, each run on a fresh redis-server and sidecar), "+
		"%d clients, %d decisions measured per run (after 200 of warm-up), %s, %d cores; load average %s at start, %s at end.\n\n",
		command, o.rounds, o.concurrency, o.ops, runtime.Version(), runtime.NumCPU(), load, machine.LoadAverage())
	fmt.Println("CPU: the sidecar's utime+stime over the measured decisions (/proc/<pid>/stat, 10 ms ticks). " +
		"Redis: the redis-server's used_cpu_sys+used_cpu_user (INFO cpu) over the same decisions. " +
		"RSS: the largest VmRSS sampled every 50 ms under load; HWM: VmHWM at the end of the run. allocs: the Go heap's allocations per decision (go_memstats_mallocs_total). " +
		"Each value is the median over the rounds, the minimum in parentheses; ratios are of the medians (of the minimums in parentheses); " +
		"within 10%: both the CPU and the RSS ratio of the medians at most 1.10. degraded: decisions of the base's runs and of now's that " +
		"the failure mode made because Redis did not answer within the sidecars' --redis-timeout (set to " + redisTimeout.String() + " for both, so that on a loaded machine the decisions are Redis's).")
	fmt.Println()
	fmt.Printf("| face | algorithm | keys | leases | CPU µs/decision %s | now | now/%s | Redis µs/decision %s | now | now/%s | RSS MiB %s | now | now/%s | HWM MiB %s | now | now/%s | decisions/s %s | now | allocs/decision %s | now | degraded %s, now | within 10%% |\n",
		b, b, b, b, b, b, b, b, b, b, b)
	fmt.Println("| --- | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
	for _, c := range cells {
		r := results[c]
		col := func(f func(sample) float64) (med [2]float64, low [2]float64) {
			for i := range 2 {
				var v []float64
				for _, s := range r[i] {
					v = append(v, f(s))
				}
				med[i], low[i] = median(v), slices.Min(v)
			}
			return med, low
		}
		cpu, cpuMin := col(func(s sample) float64 { return float64(s.cpuPerDecision) / 1e3 })
		red, redMin := col(func(s sample) float64 { return float64(s.redisPerDecision) / 1e3 })
		rss, rssMin := col(func(s sample) float64 { return s.rssPeakMiB })
		hwm, hwmMin := col(func(s sample) float64 { return s.hwmMiB })
		rate, _ := col(func(s sample) float64 { return s.perSec })
		allocs, _ := col(func(s sample) float64 { return s.allocs })
		var degraded [2]float64
		for i := range 2 {
			for _, s := range r[i] {
				degraded[i] += s.degraded
			}
		}
		leases := "on"
		if !c.leases {
			leases = "off"
		}
		ok := "yes"
		if cpu[1]/cpu[0] > budget || rss[1]/rss[0] > budget {
			ok = "**no**"
		}
		fmt.Printf("| %s | %s | %d | %s | %.1f (%.1f) | %.1f (%.1f) | %.2fx (%.2fx) | %.1f (%.1f) | %.1f (%.1f) | %.2fx (%.2fx) | %.1f (%.1f) | %.1f (%.1f) | %.2fx (%.2fx) | %.1f (%.1f) | %.1f (%.1f) | %.2fx | %.0f | %.0f | %.1f | %.1f | %.0f, %.0f | %s |\n",
			faceNames[c.face], c.algorithm, c.keys, leases,
			cpu[0], cpuMin[0], cpu[1], cpuMin[1], cpu[1]/cpu[0], cpuMin[1]/cpuMin[0],
			red[0], redMin[0], red[1], redMin[1], red[1]/red[0], redMin[1]/redMin[0],
			rss[0], rssMin[0], rss[1], rssMin[1], rss[1]/rss[0], rssMin[1]/rssMin[0],
			hwm[0], hwmMin[0], hwm[1], hwmMin[1], hwm[1]/hwm[0],
			rate[0], rate[1], allocs[0], allocs[1], degraded[0], degraded[1], ok)
	}
}
