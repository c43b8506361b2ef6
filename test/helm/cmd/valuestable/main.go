// Command valuestable regenerates the values table of charts/redline/README.md from
// values.yaml's comments (`make docs` runs it; TestValuesTable holds it).
package main

import (
	"fmt"
	"os"

	helm "github.com/redline-dev/redline/test/helm"
)

func main() {
	if err := helm.WriteValuesTable(); err != nil {
		fmt.Fprintln(os.Stderr, "valuestable:", err)
		os.Exit(1)
	}
}
