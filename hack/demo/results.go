package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/redline-dev/redline/hack/demo/timeline"
	"github.com/redline-dev/redline/internal/testutil/promtest"
)

// phaseLine renders a phase's numbers for the demo's output.
func phaseLine(p *timeline.Phase, pods []string) string {
	return fmt.Sprintf("Prometheus, %s (%s): admitted %s, refused %s, fallback %s, breaker open on %s of %d pods",
		p.Name, seconds(p.End.Sub(p.Start)), perPod(p.Stats.Admitted, pods), perPod(p.Stats.Refused, pods),
		num(p.Stats.Fallback), num(p.Stats.BreakerOpen), len(pods))
}

func perPod(m map[string]float64, pods []string) string {
	parts := make([]string, len(pods))
	for i, p := range pods {
		parts[i] = num(m[p])
	}
	return strings.Join(parts, " + ")
}

func num(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }

// writeResults writes dir/demo.json and dir/demo.md.
func writeResults(dir string, d *timeline.Data, pods []string, rows []row, candidate string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("creating %s: %w", dir, err)
	}
	data, err := marshalIndent(d)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "demo.json"), data, 0o644); err != nil {
		return fmt.Errorf("writing demo.json: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "demo.md"), []byte(markdown(d, pods, rows, candidate)), 0o644); err != nil {
		return fmt.Errorf("writing demo.md: %w", err)
	}
	return nil
}

func marshalIndent(d *timeline.Data) ([]byte, error) {
	data, err := json.MarshalIndent(d, "", " ")
	if err != nil {
		return nil, fmt.Errorf("encoding demo.json: %w", err)
	}
	return append(data, '\n'), nil
}

// markdown is results/demo.md: the summary table make demo prints (rows), then per phase what
// Prometheus returned next to the client's count, split as the picture's labels split it
// (timeline.Breakdown), and the queries.
func markdown(d *timeline.Data, pods []string, rows []row, candidate string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# What `make demo` measured, and what Prometheus returned\n\n")
	fmt.Fprintf(&b, "The summary table `make demo` prints at its end (demo of %s): each row is one fresh API key, its requests sent round-robin over the %d replicas.\n\n",
		d.Began.UTC().Format(time.DateOnly), len(pods))
	fmt.Fprintf(&b, "| %s |\n|---|%s\n", strings.Join(tableHeader, " | "), strings.Repeat("--:|", len(tableHeader)-1))
	for _, r := range rows {
		fmt.Fprintf(&b, "| %s |\n", strings.Join(r.cells(), " | "))
	}
	if candidate != "" {
		fmt.Fprintf(&b, "\n%s\n", candidate)
	}
	fmt.Fprintf(&b, "\nPrometheus %s scraped the manager and the %d sidecars (pods %s) every %s.\n",
		d.Prometheus, len(pods), strings.Join(pods, ", "), promtest.ScrapeInterval)
	fmt.Fprintf(&b, "A phase counts every decision the sidecars made in it, all keys: the row of the table above measured in it (the in-memory limiters' row is not a sidecar's), ")
	fmt.Fprintf(&b, "and the probes around it, fresh keys sent one request at a time until every replica enforces a limit (after the policy change, after Redis is back). ")
	fmt.Fprintf(&b, "The picture, [demo.png](demo.png), labels each phase with the same three numbers; the series are in [demo.json](demo.json).\n")
	fmt.Fprintf(&b, "Per-pod numbers are listed in the order of the pods; each phase ends when Prometheus has scraped every target after its last request.\n\n")
	fmt.Fprintf(&b, "| phase | seconds | admitted (Prometheus) | of them, the table's row | of them, probes | admitted (client, 2xx) | refused (Prometheus) | of them, the table's row | of them, probes | refused (client, 429) | fallback decisions | pods with breaker open | peak admitted/s of a pod | peak refused/s of a pod |\n")
	fmt.Fprintf(&b, "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n")
	for _, p := range d.Phases {
		client := func(m map[string]int) string {
			parts := make([]string, len(pods))
			for i, pod := range pods {
				parts[i] = strconv.Itoa(m[pod])
			}
			return strings.Join(parts, " + ")
		}
		adm, ref := p.Breakdown(timeline.Admitted), p.Breakdown(timeline.Refused)
		fmt.Fprintf(&b, "| %s | %.1f | %s = %s | %s | %s | %s | %s = %s | %s | %s | %s | %s | %s of %d | %s | %s |\n", p.Name, p.End.Sub(p.Start).Seconds(),
			perPod(p.Stats.Admitted, pods), num(adm.Total), inRow(adm), num(adm.Probes), client(p.Stats.ClientAdmitted),
			perPod(p.Stats.Refused, pods), num(ref.Total), inRow(ref), num(ref.Probes), client(p.Stats.ClientRefused),
			num(p.Stats.Fallback), num(p.Stats.BreakerOpen), len(pods),
			num(peak(d, timeline.Admitted, p)), num(peak(d, timeline.Refused, p)))
	}
	fmt.Fprintf(&b, "\nThe queries (instant queries at each phase's start and end, the breaker's over the phase; the per-second series with query_range, step %s):\n\n", d.Step)
	for _, q := range [][2]string{
		{"admitted per pod (cumulative)", cumulativeQuery(resultLabel[timeline.Admitted])},
		{"refused per pod (cumulative)", cumulativeQuery(resultLabel[timeline.Refused])},
		{"fallback decisions (cumulative)", fallbackQuery},
		{"breaker open during a phase of N seconds", breakerQuery(0)},
		{"admitted per second per pod (the picture)", perSecondQuery(resultLabel[timeline.Admitted])},
		{"refused per second per pod (the picture)", perSecondQuery(resultLabel[timeline.Refused])},
	} {
		fmt.Fprintf(&b, "- %s: `%s`\n", q[0], strings.Replace(q[1], "[0s]", "[Ns]", 1))
	}
	return b.String()
}

// inRow is a breakdown's count in the summary table's row, "<n> of <sent>" ("-" without a row).
func inRow(b timeline.Breakdown) string {
	if b.Row == nil {
		return "-"
	}
	return fmt.Sprintf("%d of %d", b.InRow, b.Row.Sent)
}

// peak is the highest per-second value of result, any pod, at the points of phase p (a
// point at t counts the second before t).
func peak(d *timeline.Data, result string, p timeline.Phase) float64 {
	lo, hi := d.Seconds(p.Start), d.Seconds(p.End)+d.Step.Seconds()
	top := 0.0
	for _, s := range d.Of(result) {
		for _, pt := range s.Points {
			if pt.T > lo && pt.T <= hi {
				top = max(top, pt.V)
			}
		}
	}
	return top
}
