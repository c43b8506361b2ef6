package docs_test

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const (
	// maxPageLines bounds a page of docs/: one topic a page, read in one sitting.
	maxPageLines = 400
	// maxReadmeLines bounds the README, the front door: what Redline does, how to try it,
	// where the manual is.
	maxReadmeLines = 200
)

// generatedReferences are written from the code (make docs): their length follows the API,
// the flags and the metrics, not an author's choice.
var generatedReferences = map[string]bool{
	"docs/reference/api.md":         true,
	"docs/reference/flags.md":       true,
	"docs/reference/annotations.md": true,
	"docs/reference/metrics.md":     true,
	"docs/reference/conditions.md":  true,
}

// TestDocsPageLengths: no page of docs/ over maxPageLines lines, the README under maxReadmeLines.
func TestDocsPageLengths(t *testing.T) {
	pages := 0
	for _, file := range checkedFiles(t) {
		limit := 0
		switch {
		case file == "README.md":
			limit = maxReadmeLines
		case strings.HasPrefix(file, "docs/") && !generatedReferences[file]:
			limit = maxPageLines
		default:
			continue
		}
		pages++
		data, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(file)))
		if err != nil {
			t.Fatal(err)
		}
		if n := lineCount(data); n > limit {
			t.Errorf("%s has %d lines, more than %d: split it by topic (and link the parts from docs/README.md)", file, n, limit)
		}
	}
	if pages < 2 {
		t.Fatalf("found %d pages to measure: README.md and docs/ are missing", pages)
	}
}

func lineCount(data []byte) int {
	n := bytes.Count(data, []byte("\n"))
	if len(data) > 0 && data[len(data)-1] != '\n' {
		n++
	}
	return n
}

func TestDocsLineCount(t *testing.T) {
	for s, want := range map[string]int{"": 0, "a": 1, "a\n": 1, "a\nb": 2, "a\n\nb\n": 3} {
		if got := lineCount([]byte(s)); got != want {
			t.Errorf("lineCount(%q) = %d, want %d", s, got, want)
		}
	}
}
