package helm

import (
	"os"
	"strings"
	"testing"
)

// TestValuesTable: the chart README's values table, under "## Values", is the one generated
// from values.yaml's comments, and every value is documented.
func TestValuesTable(t *testing.T) {
	rows, err := ValuesTable()
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) < 30 {
		t.Fatalf("values table has %d rows; values.yaml documents more", len(rows))
	}
	b, err := os.ReadFile(ChartReadme())
	if err != nil {
		t.Fatal(err)
	}
	text := string(b)
	values := strings.Index(text, "\n## Values\n")
	if values < 0 || strings.Index(text, TableStart) < values {
		t.Fatalf("%s has no values table under its \"## Values\" section", ChartReadme())
	}
	want, err := WithValuesTable(text)
	if err != nil {
		t.Fatal(err)
	}
	if want == text {
		return
	}
	if *update {
		if err := os.WriteFile(ChartReadme(), []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Errorf("%s's values table is not the one values.yaml gives: run make docs", ChartReadme())
}
