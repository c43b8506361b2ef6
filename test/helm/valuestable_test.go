package helm

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const (
	tableStart = "<!-- values table: generated from charts/redline/values.yaml by test/helm (go test -run TestValuesTable -update) -->\n"
	tableEnd   = "<!-- end of values table -->"
)

// TestValuesTable: README's values table is the one generated from values.yaml's comments,
// and every value is documented.
func TestValuesTable(t *testing.T) {
	rows, err := ValuesTable()
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) < 30 {
		t.Fatalf("values table has %d rows; values.yaml documents more", len(rows))
	}
	readme := filepath.Join(RepoRoot(), "README.md")
	b, err := os.ReadFile(readme)
	if err != nil {
		t.Fatal(err)
	}
	text := string(b)
	start := strings.Index(text, tableStart)
	end := strings.Index(text, tableEnd)
	if start < 0 || end < start {
		t.Fatalf("README.md has no values table between %q and %q", strings.TrimSpace(tableStart), tableEnd)
	}
	want := Markdown(rows)
	got := text[start+len(tableStart) : end]
	if got == want {
		return
	}
	if *update {
		if err := os.WriteFile(readme, []byte(text[:start+len(tableStart)]+want+text[end:]), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Errorf("README.md's values table is not the one values.yaml gives: go test ./... -run TestValuesTable -update (in test/helm)")
}
