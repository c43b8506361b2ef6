// Command docgen writes docs/reference (see internal/docgen): `make docs` runs it.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/redline-dev/redline/internal/docgen"
)

func main() {
	root := flag.String("root", ".", "the repository's root")
	flag.Parse()
	if err := docgen.Write(*root); err != nil {
		fmt.Fprintln(os.Stderr, "docgen:", err)
		os.Exit(1)
	}
}
