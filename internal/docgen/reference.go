package docgen

import (
	"strings"
)

// TableNames are the first column's code spans of the tables in a page's section ("## title",
// up to the next "## "): the flags, metrics or constants the section documents.
func TableNames(page, title string) []string {
	var out []string
	in := false
	for l := range strings.SplitSeq(page, "\n") {
		if t, ok := strings.CutPrefix(l, "## "); ok {
			in = t == title
			continue
		}
		first, ok := strings.CutPrefix(l, "| `")
		if !in || !ok {
			continue
		}
		if name, _, ok := strings.Cut(first, "`"); ok {
			out = append(out, name)
		}
	}
	return out
}

// ExpositionNames are the metric families of a Prometheus text exposition (its # TYPE lines).
func ExpositionNames(text string) []string {
	var out []string
	for l := range strings.SplitSeq(text, "\n") {
		if rest, ok := strings.CutPrefix(l, "# TYPE "); ok {
			out = append(out, strings.Fields(rest)[0])
		}
	}
	return out
}

// Undocumented are the names of a live exposition that a metrics.md section does not list
// and that are not the Go runtime's or the process's.
func Undocumented(page string, live []string, sections ...string) []string {
	doc := map[string]bool{}
	for _, s := range sections {
		for _, n := range TableNames(page, s) {
			doc[n] = true
		}
	}
	var out []string
	for _, n := range live {
		if !doc[n] && !hasPrefix(n, RuntimePrefixes) {
			out = append(out, n)
		}
	}
	return out
}
