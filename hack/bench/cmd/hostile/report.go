package main

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
)

// render writes the report in Markdown.
func render(images []imageCase, f flood, run time.Duration) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# Hostile clients against the built sidecar\n\n")
	fmt.Fprintf(&b, "Measured %s by `hack/bench/cmd/hostile` (`cd hack/bench && go run ./cmd/hostile -out ../../results`): the built sidecar, a real redis-server, "+
		"and upstreams that count what they bill.\n\n", time.Now().UTC().Format("2006-01-02"))
	fmt.Fprintf(&b, "## Images the estimate cannot size\n\n")
	fmt.Fprintf(&b, "Chat requests of N `image_url` parts and `max_tokens: 1`, FixedWindow budget of 10,000 tokens a minute per `X-API-Key` "+
		"(`defaultHold` 1,000, `minOutput` 1); the upstream bills %d tokens an image (a 1024 px image at gpt-4o's high detail) and 10 of text. "+
		"Every case sends for %v inside one window, on a key of its own; a refused client waits 20 ms.\n\n", perImage, run)
	b.WriteString("| images | clients | model time | billed per request | tokens served on the key in the window | requests served | answers by status |\n")
	b.WriteString("| --- | --- | --- | --- | --- | --- | --- |\n")
	for _, c := range images {
		fmt.Fprintf(&b, "| %d | %d | %v | %d | **%d** | %d | %s |\n", c.Images, c.Clients, c.Delay, c.BilledPerRequest, c.Served, c.Requests, statuses(c.Answers))
	}
	fmt.Fprintf(&b, "\n## Slow 1 MiB bodies at the injector's memory limit\n\n")
	fmt.Fprintf(&b, "%d connections each send a token budget request of a 1 MiB body and withhold its last byte, to a sidecar started with `%s` "+
		"(it sets GOMEMLIMIT to 85%% of it, as in an injected pod; memory budget %.1f MiB).\n\n", f.Conns, f.MemoryLimitEnvironment, f.BudgetBytes/(1<<20))
	b.WriteString("| idle RSS | peak RSS (VmHWM) | limit | answers by status | at the upstream | memory budget refusals | another key: plain rule (3 a minute) | another key: small token budget request |\n")
	b.WriteString("| --- | --- | --- | --- | --- | --- | --- | --- |\n")
	fmt.Fprintf(&b, "| %.1f MiB | **%.1f MiB** | %.0f MiB | %s | %d | %.0f | %v | %d |\n", f.IdleMiB, f.PeakMiB, f.LimitMiB,
		statuses(intKeys(f.Answers)), f.AtUpstream, f.Refusals, f.PlainStatuses, f.OtherKeyStatus)
	return b.String()
}

func intKeys(m map[int]int) map[int]int64 {
	out := make(map[int]int64, len(m))
	for k, v := range m {
		out[k] = int64(v)
	}
	return out
}

func statuses(m map[int]int64) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		name := fmt.Sprint(k)
		if k == 0 {
			name = "no answer"
		}
		parts = append(parts, fmt.Sprintf("%s: %d", name, m[k]))
	}
	return strings.Join(parts, ", ")
}
