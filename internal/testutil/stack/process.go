package stack

import "github.com/redline-dev/redline/internal/testutil/proc"

// Process is a child process of the stack: proc's, under the name internal/testutil/failover
// still imports it by (it moves onto proc on its own branch, then these two go).
type Process = proc.Process

// StartProcess is proc.Start, under the name internal/testutil/failover still calls.
func StartProcess(dir, name, bin string, args, env []string) (*Process, error) {
	return proc.Start(dir, name, bin, args, env)
}
