package helm

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	yaml3 "go.yaml.in/yaml/v3"
)

// ValueRow is one row of README's values table: a value of values.yaml documented by the
// "# -- text" comment above it.
type ValueRow struct {
	Key, Default, Description string
}

// ValuesTable reads charts/redline/values.yaml and returns its documented values, in file
// order. A mapping whose children are documented gets their rows, not one of its own.
func ValuesTable() ([]ValueRow, error) {
	b, err := os.ReadFile(filepath.Join(ChartDir(), "values.yaml"))
	if err != nil {
		return nil, fmt.Errorf("reading values.yaml: %w", err)
	}
	var doc yaml3.Node
	if err := yaml3.Unmarshal(b, &doc); err != nil {
		return nil, fmt.Errorf("parsing values.yaml: %w", err)
	}
	var rows []ValueRow
	var undocumented []string
	var walk func(prefix string, m *yaml3.Node)
	walk = func(prefix string, m *yaml3.Node) {
		for i := 0; i+1 < len(m.Content); i += 2 {
			k, v := m.Content[i], m.Content[i+1]
			key := prefix + k.Value
			desc := description(k.HeadComment)
			if v.Kind == yaml3.MappingNode && len(v.Content) > 0 && hasDocumented(v) {
				walk(key+".", v)
				continue
			}
			if desc == "" {
				undocumented = append(undocumented, key)
				continue
			}
			var val any
			if err := v.Decode(&val); err != nil {
				undocumented = append(undocumented, key+" ("+err.Error()+")")
				continue
			}
			def, _ := json.Marshal(val)
			rows = append(rows, ValueRow{Key: key, Default: string(def), Description: desc})
		}
	}
	walk("", doc.Content[0])
	if len(undocumented) > 0 {
		return rows, fmt.Errorf("values.yaml: values without a \"# --\" comment: %s", strings.Join(undocumented, ", "))
	}
	return rows, nil
}

func hasDocumented(m *yaml3.Node) bool {
	for i := 0; i+1 < len(m.Content); i += 2 {
		if description(m.Content[i].HeadComment) != "" {
			return true
		}
		if v := m.Content[i+1]; v.Kind == yaml3.MappingNode && hasDocumented(v) {
			return true
		}
	}
	return false
}

// description is the text of the last "# --" comment block of a head comment.
func description(head string) string {
	lines := strings.Split(head, "\n")
	for i, line := range slices.Backward(lines) {
		if text, ok := strings.CutPrefix(strings.TrimSpace(line), "# --"); ok {
			parts := []string{strings.TrimSpace(text)}
			for _, l := range lines[i+1:] {
				parts = append(parts, strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(l), "#")))
			}
			return strings.Join(parts, " ")
		}
	}
	return ""
}

// Markdown renders rows as README's table.
func Markdown(rows []ValueRow) string {
	var b strings.Builder
	b.WriteString("| value | default | meaning |\n| --- | --- | --- |\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "| `%s` | `%s` | %s |\n", r.Key, strings.ReplaceAll(r.Default, "|", `\|`), strings.ReplaceAll(r.Description, "|", `\|`))
	}
	return b.String()
}

// The values table's bounds in the chart's README.
const (
	TableStart = "<!-- values table: generated from charts/redline/values.yaml by make docs (test/helm/cmd/valuestable); do not edit -->\n"
	TableEnd   = "<!-- end of values table -->"
)

// ChartReadme is the chart's README, which holds the values table under "## Values".
func ChartReadme() string { return filepath.Join(ChartDir(), "README.md") }

// WithValuesTable returns readme with the table between TableStart and TableEnd replaced by
// the one values.yaml's comments give.
func WithValuesTable(readme string) (string, error) {
	rows, err := ValuesTable()
	if err != nil {
		return "", err
	}
	start := strings.Index(readme, TableStart)
	end := strings.Index(readme, TableEnd)
	if start < 0 || end < start {
		return "", fmt.Errorf("no values table between %q and %q", strings.TrimSpace(TableStart), TableEnd)
	}
	return readme[:start+len(TableStart)] + Markdown(rows) + readme[end:], nil
}

// WriteValuesTable regenerates the values table of the chart's README.
func WriteValuesTable() error {
	b, err := os.ReadFile(ChartReadme())
	if err != nil {
		return err
	}
	out, err := WithValuesTable(string(b))
	if err != nil {
		return fmt.Errorf("%s: %w", ChartReadme(), err)
	}
	return os.WriteFile(ChartReadme(), []byte(out), 0o644)
}
