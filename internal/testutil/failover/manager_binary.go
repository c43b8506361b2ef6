package failover

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/redline-dev/redline/internal/sidecar/contract"
	"github.com/redline-dev/redline/internal/testutil/stack"
)

// ManagerBinary is the manager the TenantACL cells run, built on first use unless
// Options.ManagerBin names one.
func (e *Env) ManagerBinary(ctx context.Context) (string, error) {
	e.mgrOnce.Do(func() {
		if e.o.ManagerBin != "" {
			e.mgrBin = e.o.ManagerBin
			return
		}
		root, err := stack.RepoRoot()
		if err != nil {
			e.mgrErr = err
			return
		}
		e.o.Progress("building ./cmd/manager")
		e.mgrBin = filepath.Join(e.o.Dir, "manager")
		cmd := exec.CommandContext(ctx, "go", "build", "-o", e.mgrBin, "./cmd/manager")
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			e.mgrErr = fmt.Errorf("go build ./cmd/manager in %s: %w\n%s", root, err, out)
		}
	})
	return e.mgrBin, e.mgrErr
}

// ManagerArgs are the flags the Env adds to every manager it starts (Options.ManagerArgs):
// none unless the caller asked, so that the manager runs at its defaults.
func (e *Env) ManagerArgs() []string { return slices.Clone(e.o.ManagerArgs) }

// ManagerDefaults reads the defaults of the manager binary's flags from its -help: the
// defaults the TenantACL cells run on, as the binary has them (not a copy of them).
func (e *Env) ManagerDefaults(ctx context.Context) (map[string]string, error) {
	bin, err := e.ManagerBinary(ctx)
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, bin, "-help")
	// Nothing to connect to: a manager that got past its flags would fail on these.
	cmd.Env = append(os.Environ(), "KUBECONFIG="+filepath.Join(e.o.Dir, "missing"), contract.EnvRedisURL+"=redis://127.0.0.1:1")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("%s -help: %w\n%s", bin, err, out.String())
	}
	return parseFlagDefaults(out.String()), nil
}

// flagUsage matches one flag of Go's flag package usage: "  -name type\n    \tusage (default x)".
var flagUsage = regexp.MustCompile(`(?m)^  -([a-z0-9-]+)(?: [a-z0-9]+)?\n((?:    \t.*\n?)+)`)

// flagDefault is the "(default x)" at the end of a flag's usage; Go quotes string defaults.
var flagDefault = regexp.MustCompile(`\(default ("(?:[^"\\]|\\.)*"|[^)]*)\)\s*$`)

// parseFlagDefaults reads every flag's default from usage text; a flag whose default is the
// zero value has none.
func parseFlagDefaults(usage string) map[string]string {
	out := map[string]string{}
	for _, m := range flagUsage.FindAllStringSubmatch(usage, -1) {
		d := flagDefault.FindStringSubmatch(strings.TrimRight(m[2], "\n"))
		if d == nil {
			out[m[1]] = ""
			continue
		}
		v := d[1]
		if uq, err := strconv.Unquote(v); err == nil {
			v = uq
		}
		out[m[1]] = v
	}
	return out
}
