package stack

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
)

// Environment variables that point the stack at prebuilt binaries instead of building them.
const (
	EnvManagerBin = "REDLINE_MANAGER_BIN"
	EnvSidecarBin = "REDLINE_SIDECAR_BIN"
)

// Control-plane binaries the stack needs in the envtest assets directory.
var controlPlaneBinaries = []string{"etcd", "kube-apiserver", "kube-controller-manager"}

// RepoRoot returns the root of the redline module: the directory of its go.mod.
func RepoRoot() (string, error) {
	// This file sits at internal/testutil/stack in the module; its path is known at build time
	// for `go test` and `go run`, whatever the working directory.
	if _, file, _, ok := runtime.Caller(0); ok {
		root := filepath.Clean(filepath.Join(filepath.Dir(file), "..", "..", ".."))
		if isRedlineRoot(root) {
			return root, nil
		}
	}
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("finding the repository root: %w", err)
	}
	for {
		if isRedlineRoot(dir) {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("finding the repository root: no go.mod of github.com/redline-dev/redline above the working directory")
		}
		dir = parent
	}
}

func isRedlineRoot(dir string) bool {
	data, err := os.ReadFile(filepath.Join(dir, "go.mod"))
	return err == nil && bytes.HasPrefix(data, []byte("module github.com/redline-dev/redline\n"))
}

// Binaries are the Redline programs the stack runs.
type Binaries struct {
	Manager, Sidecar string
}

// BuildBinaries builds cmd/manager and cmd/sidecar into dir (in parallel), unless
// REDLINE_MANAGER_BIN / REDLINE_SIDECAR_BIN name prebuilt ones.
func BuildBinaries(ctx context.Context, root, dir string) (Binaries, error) {
	b := Binaries{Manager: os.Getenv(EnvManagerBin), Sidecar: os.Getenv(EnvSidecarBin)}
	var wg sync.WaitGroup
	errs := make([]error, 2)
	build := func(i int, path *string, pkg, name string) {
		defer wg.Done()
		if *path != "" {
			if _, err := os.Stat(*path); err != nil {
				errs[i] = fmt.Errorf("prebuilt %s binary: %w", name, err)
			}
			return
		}
		*path = filepath.Join(dir, name)
		errs[i] = goBuild(ctx, root, *path, pkg)
	}
	wg.Add(2)
	go build(0, &b.Manager, "./cmd/manager", "manager")
	go build(1, &b.Sidecar, "./cmd/sidecar", "sidecar")
	wg.Wait()
	return b, errors.Join(errs...)
}

func goBuild(ctx context.Context, root, out, pkg string) error {
	goBin, err := exec.LookPath("go")
	if err != nil {
		return fmt.Errorf("building %s: the go command is not on PATH (or set %s and %s to prebuilt binaries): %w",
			pkg, EnvManagerBin, EnvSidecarBin, err)
	}
	cmd := exec.CommandContext(ctx, goBin, "build", "-o", out, pkg)
	cmd.Dir = root
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go build %s: %w\n%s", pkg, err, stderr.String())
	}
	return nil
}

// ControlPlaneAssets returns the directory with etcd, kube-apiserver and kube-controller-manager.
// It is KUBEBUILDER_ASSETS when set; otherwise, with install, what
// `hack/setup-envtest.sh --with-controller-manager` prints (it installs or builds what is
// missing, and answers at once when everything is cached).
func ControlPlaneAssets(root string, install bool) (string, error) {
	dir := os.Getenv("KUBEBUILDER_ASSETS")
	if dir == "" {
		if !install {
			return "", errors.New("KUBEBUILDER_ASSETS is not set: run the tests with `make test`, or set it to the output of " +
				"`hack/setup-envtest.sh --with-controller-manager`")
		}
		cmd := exec.Command(filepath.Join(root, "hack", "setup-envtest.sh"), "--with-controller-manager")
		cmd.Dir = root
		cmd.Stderr = os.Stderr // building takes minutes when nothing is cached: show progress
		out, err := cmd.Output()
		if err != nil {
			return "", fmt.Errorf("installing the control-plane binaries (hack/setup-envtest.sh --with-controller-manager): %w", err)
		}
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		dir = lines[len(lines)-1]
	}
	var missing []string
	for _, name := range controlPlaneBinaries {
		if fi, err := os.Stat(filepath.Join(dir, name)); err != nil || fi.Mode()&0o111 == 0 {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		return "", fmt.Errorf("%s missing in %s: run `hack/setup-envtest.sh --with-controller-manager` "+
			"(kube-controller-manager turns Deployments into Pods; it is built like kube-apiserver)",
			strings.Join(missing, ", "), dir)
	}
	return dir, nil
}
