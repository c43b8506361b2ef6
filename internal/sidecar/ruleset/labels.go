package ruleset

import (
	"bufio"
	"bytes"
	"fmt"
	"strconv"
	"strings"
)

// ParseLabels reads the downward API's labels file: one label a line, key="value", the value
// quoted the way Go quotes strings. Blank lines are ignored.
func ParseLabels(data []byte) (map[string]string, error) {
	out := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		key, quoted, ok := strings.Cut(line, "=")
		if !ok || key == "" {
			return nil, fmt.Errorf("labels line %d: want key=\"value\", got %q", n, line)
		}
		val, err := strconv.Unquote(quoted)
		if err != nil {
			return nil, fmt.Errorf("labels line %d: value of %s is not a quoted string: %w", n, key, err)
		}
		out[key] = val
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading labels: %w", err)
	}
	return out, nil
}
