package main

import (
	"fmt"
	"math"
	"runtime"
	"slices"
	"time"
)

// percentile is the nearest-rank q-quantile of d (0 < q <= 1): the smallest value with at
// least q of the values at or below it.
func percentile(d []time.Duration, q float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	i := int(math.Ceil(q*float64(len(s)))) - 1
	return s[min(max(i, 0), len(s)-1)]
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// ms writes a duration in µs below a millisecond, else in ms.
func ms(d time.Duration) string {
	if d < time.Millisecond {
		return fmt.Sprintf("%.0f µs", float64(d)/1e3)
	}
	return fmt.Sprintf("%.2f ms", float64(d)/1e6)
}

func kib(b int) string {
	if b < 1<<20 {
		return fmt.Sprintf("%d KiB", b>>10)
	}
	return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20))
}

func printReport(o options, r *report) {
	fmt.Printf("`%s` on %d cores, %s; load average %s at start, %s at end; %.0f s. "+
		"Everything (clients, the fake model API, both sidecars, redis-server) shares this machine over loopback: "+
		"compare the rows of one table, measured side by side, not the absolute numbers.\n\n",
		r.command, runtime.NumCPU(), runtime.Version(), r.loadStart, r.loadEnd, time.Since(began).Seconds())
	fmt.Println("Two sidecars of the working tree's `./cmd/sidecar`, as processes, in front of the same fake model API (`internal/testutil/fakemodel`, " +
		"in this process), on one redis-server: **request count**, a FixedWindow rule of a billion requests a day keyed on `X-Key`, and **token budget**, " +
		"the same rule with its cost from the response (a billion tokens a day; defaultHold 1000, minOutput 10). Neither limit is reached: " +
		"every request is admitted, and each is checked to have gone the whole way.")
	fmt.Println()
	printCPU(o, r)
	printLatency(o, r)
	printMemory(o, r)
}

func printCPU(o options, r *report) {
	fmt.Println("## Sidecar CPU per streamed response")
	fmt.Println()
	fmt.Printf("OpenAI chat streams of %d output tokens (one event a token, flushed), `max_completion_tokens` %d, no `stream_options`: "+
		"the budget's sidecar reads and sizes the body, holds, lowers the cap to what the hold affords, asks for the usage, "+
		"scans the stream for it and strips the usage chunk before the client, and settles. %d clients in a closed loop, %d responses a run "+
		"(after %d of warm-up), %d runs per sidecar, the two alternating (which goes first swaps every round). "+
		"CPU: the sidecar's utime+stime over the run (`/proc/<pid>/stat`, 10 ms ticks) including the settles that end after the last response, "+
		"divided by its responses. Median over the runs, minimum in parentheses. Each run checks that the application served every token, "+
		"every stream ended whole without a usage chunk, and (budget) that every hold was settled with the usage its stream reported.\n\n",
		o.tokens, outputCap, o.concurrency, o.responses, warmUp, o.rounds)
	fmt.Println("| rule | runs | CPU µs per response | responses/s | holds settled with a usage | units given back per settle |")
	fmt.Println("| --- | ---: | ---: | ---: | ---: | ---: |")
	var med [2]float64
	for p := range r.cpu {
		var cpu, rate []float64
		var settled, returned float64
		for _, s := range r.cpu[p] {
			cpu = append(cpu, float64(s.perResponse)/1e3)
			rate = append(rate, s.perSec)
			settled += s.settled
			returned += s.returned
		}
		med[p] = median(cpu)
		settles, back := "–", "–"
		if p == pathBudget {
			settles = fmt.Sprintf("%.0f", settled)
			if settled > 0 {
				back = fmt.Sprintf("%.0f", returned/settled)
			}
		}
		fmt.Printf("| %s | %d | %.0f (%.0f) | %.0f | %s | %s |\n", ruleNames[p], len(cpu), med[p], slices.Min(cpu), median(rate), settles, back)
	}
	fmt.Println()
	if med[pathPlain] > 0 {
		fmt.Printf("Added by the token budget: **%.0f µs of sidecar CPU per streamed response** (%.2fx the request count's %.0f µs).\n\n",
			med[pathBudget]-med[pathPlain], med[pathBudget]/med[pathPlain], med[pathPlain])
	}
}

var ruleNames = [2]string{"request count", "token budget"}

func printLatency(o options, r *report) {
	fmt.Println("## Latency the request-body read adds")
	fmt.Println()
	fmt.Printf("End to end: one client, one request at a time, an OpenAI chat request (not streamed) whose prompt fills the body, "+
		"`max_completion_tokens` 16 (so the response is short and the time is the request's), timed from the send to the last byte of the response; "+
		"%d requests per body size and path after 20 of warm-up, in blocks of %d that turn between the paths. "+
		"The budget's difference from the request count's is the whole budget path (the body read and sized, the hold's Redis call "+
		"in place of the lease's), of which the read is one part; these bodies are not rewritten (not streamed, and their cap is what the hold affords).\n\n", o.latencyReqs, block)
	fmt.Println("| body | path | p50 | p99 | p50 − request count | p99 − request count |")
	fmt.Println("| ---: | --- | ---: | ---: | ---: | ---: |")
	for i := 0; i+2 < len(r.latency); i += 3 {
		plain := r.latency[i+1]
		for _, c := range r.latency[i : i+3] {
			d50, d99 := "–", "–"
			if c.path != plain.path {
				d50 = signed(percentile(c.took, 0.5) - percentile(plain.took, 0.5))
				d99 = signed(percentile(c.took, 0.99) - percentile(plain.took, 0.99))
			}
			fmt.Printf("| %s (%d B) | %s | %s | %s | %s | %s |\n", kib(c.size), c.bodyBytes, c.path,
				ms(percentile(c.took, 0.5)), ms(percentile(c.took, 0.99)), d50, d99)
		}
	}
	fmt.Println()
	fmt.Printf("The read alone, in this process: a handler on loopback times the read of the body it was sent, by `meter.ReadBody` "+
		"(as the budget path reads it: bounded at %d bytes and 1 s, on a goroutine of its own) and by a plain `io.ReadAll`; "+
		"%d reads per size and reader after %d of warm-up, in alternating blocks of %d. Measured first, before the sidecars start: "+
		"this is the less noisy number.\n\n", 1<<20, o.readBodyReqs, warmUp, block)
	fmt.Println("| body | reader | p50 | p99 | p50 − io.ReadAll | p99 − io.ReadAll |")
	fmt.Println("| ---: | --- | ---: | ---: | ---: | ---: |")
	for i := 0; i+1 < len(r.readBody); i += 2 {
		all := r.readBody[i]
		for _, c := range r.readBody[i : i+2] {
			d50, d99 := "–", "–"
			if c.reader != all.reader {
				d50 = signed(percentile(c.took, 0.5) - percentile(all.took, 0.5))
				d99 = signed(percentile(c.took, 0.99) - percentile(all.took, 0.99))
			}
			fmt.Printf("| %s | %s | %s | %s | %s | %s |\n", kib(c.size), c.reader, ms(percentile(c.took, 0.5)), ms(percentile(c.took, 0.99)), d50, d99)
		}
	}
	fmt.Println()
	fmt.Printf("What the budget path does with the body once read, timed the same way in this process (%d times per size, one goroutine, "+
		"on the end-to-end section's bodies, after %d of warm-up): `tokens.ScanRequest` estimates the prompt and reads the caps, `tokens.SetOutputCap` writes the body "+
		"again with the cap the hold affords. With the read, these are the body's part of the budget's added latency; the rest is the hold's Redis call.\n\n", max(o.readBodyReqs/10, 10), warmUp)
	fmt.Println("| body | step | p50 | p99 |")
	fmt.Println("| ---: | --- | ---: | ---: |")
	for _, c := range r.sizing {
		fmt.Printf("| %s | %s | %s | %s |\n", kib(c.size), c.step, ms(percentile(c.took, 0.5)), ms(percentile(c.took, 0.99)))
	}
	fmt.Println()
}

// signed writes d with its sign.
func signed(d time.Duration) string {
	switch {
	case d.Abs() < 500*time.Nanosecond:
		return "0 µs"
	case d < 0:
		return "−" + ms(-d)
	}
	return "+" + ms(d)
}

func printMemory(o options, r *report) {
	fmt.Println("## Memory per in-flight hold")
	fmt.Println()
	fmt.Println("Redis: holds reserved through `internal/limiter` (as the sidecar reserves them; 8 callers, one key, a FixedWindow rule whose " +
		"window outlasts the run) on a redis-server of their own; `MEMORY USAGE <key>:h SAMPLES 0` of the key's hold records, and how much " +
		"`used_memory` grew from before the first hold (the window's state and the server's own allocations included).")
	fmt.Println()
	fmt.Println("| open holds | hold records (MEMORY USAGE) | bytes per hold | used_memory growth | bytes per hold | per hold since the row above |")
	fmt.Println("| ---: | ---: | ---: | ---: | ---: | ---: |")
	var prev redisHoldRow
	for _, h := range r.redisHolds {
		fmt.Printf("| %d | %d | %.1f | %d | %.1f | %.1f |\n", h.holds, h.zsetBytes, float64(h.zsetBytes)/float64(h.holds),
			h.usedMemory, float64(h.usedMemory)/float64(h.holds), float64(h.usedMemory-prev.usedMemory)/float64(h.holds-prev.holds))
		prev = h
	}
	fmt.Println()
	fmt.Printf("Sidecar: %d streams held open at once through each sidecar (the fake sends a token every 100 ms, so every hold is open while "+
		"measured), each counted once its first event reached the client, %d runs per sidecar alternating; the sidecar's `go_memstats_heap_alloc_bytes` right after a GC "+
		"(its `/debug/pprof/heap?gc=1`; the least of three readings) in flight against at rest before them, divided by the streams; median over the runs, range in parentheses. "+
		"A stream through the request count costs the proxy its connections, buffers and goroutines; the budget's difference is its hold, "+
		"its body, its meter and its settle's state. The budget's row also counts the hold records open in Redis at that moment (spread over the 16 keys: small zsets, listpacks).\n\n", o.inflight, o.rounds)
	fmt.Println("| rule | streams in flight | runs | heap at rest | heap in flight | per stream | goroutines at rest, in flight | holds open in Redis | their MEMORY USAGE per hold |")
	fmt.Println("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
	var per [2]float64
	for p, runs := range r.heap {
		col := func(f func(heapSample) float64) []float64 {
			var v []float64
			for _, h := range runs {
				v = append(v, f(h))
			}
			return v
		}
		ps := col(func(h heapSample) float64 { return h.perStream() / 1024 })
		per[p] = median(ps)
		holds, bytesPer := "–", "–"
		if p == pathBudget {
			holds = fmt.Sprintf("%.0f", median(col(func(h heapSample) float64 { return float64(h.holdsInRedis) })))
			bytesPer = fmt.Sprintf("%.1f B", median(col(func(h heapSample) float64 { return float64(h.holdBytes) / float64(max(h.holdsInRedis, 1)) })))
		}
		fmt.Printf("| %s | %d | %d | %s | %s | %.1f KiB (%.1f–%.1f) | %.0f, %.0f | %s | %s |\n", ruleNames[p], o.inflight, len(runs),
			kib(int(median(col(func(h heapSample) float64 { return h.restHeap })))), kib(int(median(col(func(h heapSample) float64 { return h.flightHeap })))),
			per[p], slices.Min(ps), slices.Max(ps),
			median(col(func(h heapSample) float64 { return h.restGoroutines })), median(col(func(h heapSample) float64 { return h.flightGoro })), holds, bytesPer)
	}
	fmt.Println()
	fmt.Printf("Added by the token budget: **%.1f KiB of sidecar heap per in-flight hold** (medians: %.1f KiB a stream against %.1f KiB). "+
		"Goroutine stacks are outside HeapAlloc; the goroutine counts say whether the budget adds any.\n",
		per[pathBudget]-per[pathPlain], per[pathBudget], per[pathPlain])
}
