// Command dashboards writes Redline's Grafana dashboards (test/helm/dashboards) as JSON files
// into a directory: `make dashboards` writes them into charts/redline/dashboards.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/redline-dev/redline/test/helm/dashboards"
)

func main() {
	out := flag.String("out", "", "Directory to write <dashboard>.json files into.")
	flag.Parse()
	if *out == "" {
		fmt.Fprintln(os.Stderr, "dashboards: -out is required")
		os.Exit(2)
	}
	if err := write(*out); err != nil {
		fmt.Fprintln(os.Stderr, "dashboards:", err)
		os.Exit(1)
	}
}

func write(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("creating %s: %w", dir, err)
	}
	for _, d := range dashboards.All() {
		b, err := d.JSON()
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, d.File+".json"), b, 0o644); err != nil {
			return fmt.Errorf("writing dashboard %s: %w", d.File, err)
		}
	}
	return nil
}
