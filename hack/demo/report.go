package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	v1alpha1 "github.com/redline-dev/redline/api/v1alpha1"
	"github.com/redline-dev/redline/internal/testutil/stack"
)

// row is one line of the comparison table.
type row struct {
	name     string
	limit    int
	window   time.Duration
	replicas int
	sent     int
	admitted int
	// callsPerDecision is Redis round trips per decision; negative when it does not apply.
	callsPerDecision float64
}

// overAdmission says how far admitted is above the limit, in percent of it.
func (r row) overAdmission() string {
	over := float64(r.admitted-r.limit) / float64(r.limit) * 100
	switch {
	case r.admitted <= r.limit:
		return "none"
	default:
		return fmt.Sprintf("+%.0f%%", over)
	}
}

func (r row) calls() string {
	if r.callsPerDecision < 0 {
		return "- (no Redis)"
	}
	return fmt.Sprintf("%.2f", r.callsPerDecision)
}

// tableHeader heads the summary table, printed (printTable) and in demo.md (markdown).
var tableHeader = []string{"", "limit", "replicas", "sent", "admitted", "over-admission", "Redis calls/decision"}

// cells is r's line of the summary table.
func (r row) cells() []string {
	return []string{
		r.name, fmt.Sprintf("%d/%s", r.limit, shortDuration(r.window)), fmt.Sprint(r.replicas),
		fmt.Sprint(r.sent), fmt.Sprint(r.admitted), r.overAdmission(), r.calls(),
	}
}

// printTable writes rows side by side in fixed-width columns.
func printTable(w io.Writer, rows []row) {
	header := tableHeader
	cells := [][]string{header}
	for _, r := range rows {
		cells = append(cells, r.cells())
	}
	widths := make([]int, len(header))
	for _, line := range cells {
		for i, c := range line {
			widths[i] = max(widths[i], len(c))
		}
	}
	for n, line := range cells {
		var b strings.Builder
		b.WriteString("    ")
		for i, c := range line {
			if i == 0 {
				b.WriteString(c + strings.Repeat(" ", widths[i]-len(c)))
			} else {
				b.WriteString("   " + strings.Repeat(" ", widths[i]-len(c)) + c)
			}
		}
		_, _ = fmt.Fprintln(w, strings.TrimRight(b.String(), " "))
		if n == 0 {
			_, _ = fmt.Fprintln(w, "    "+strings.Repeat("-", len(b.String())-4))
		}
	}
}

func shortDuration(d time.Duration) string {
	switch {
	case d%time.Hour == 0:
		return fmt.Sprintf("%dh", d/time.Hour)
	case d%time.Minute == 0:
		return fmt.Sprintf("%dmin", d/time.Minute)
	default:
		return d.String()
	}
}

// sumMetric adds a metric over sidecars.
func sumMetric(ctx context.Context, sidecars []*stack.Sidecar, name string, labels map[string]string) (float64, error) {
	total := 0.0
	for _, sc := range sidecars {
		v, err := sc.Metric(ctx, name, labels)
		if err != nil {
			return 0, err
		}
		total += v
	}
	return total, nil
}

// perTarget renders admitted counts per replica ("33 + 33 + 34").
func perTarget(t stack.Tally) string {
	parts := make([]string, len(t.PerTarget))
	for i, c := range t.PerTarget {
		parts[i] = fmt.Sprint(c.Admitted)
	}
	return strings.Join(parts, " + ")
}

// seconds renders a duration for people.
func seconds(d time.Duration) string {
	if d < time.Second {
		return fmt.Sprintf("%dms", d.Milliseconds())
	}
	return fmt.Sprintf("%.1fs", d.Seconds())
}

// pathOf is the path a rule matches, in either form of the API.
func pathOf(r v1alpha1.Rule) string {
	switch {
	case r.Match == nil:
		return "/"
	case r.Match.Path != nil:
		return r.Match.Path.Value
	case r.Match.PathPrefix != "":
		return r.Match.PathPrefix
	}
	return "/"
}

func methods(r v1alpha1.Rule) []string {
	if r.Match == nil || len(r.Match.Methods) == 0 {
		return []string{"requests"}
	}
	out := make([]string, len(r.Match.Methods))
	for i, m := range r.Match.Methods {
		out[i] = string(m) + "s"
	}
	return out
}

func envNames(env []corev1.EnvVar) string {
	names := make([]string, len(env))
	for i, e := range env {
		names[i] = e.Name
	}
	return strings.Join(names, ",")
}
