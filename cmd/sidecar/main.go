// Command sidecar will enforce RateLimitPolicies next to each application container.
//
// Placeholder until the sidecar issue lands: it only reports that it is not implemented, so
// nothing can mistake it for an enforcer.
package main

import (
	"fmt"
	"os"
)

func main() {
	fmt.Fprintln(os.Stderr, "redline sidecar: not implemented yet (see the sidecar issue); this binary enforces nothing")
	os.Exit(2)
}
