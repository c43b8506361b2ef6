package e2e

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"

	. "github.com/onsi/gomega"
)

// kubectlRedline is the built why-refused plugin (cmd/kubectl-redline), built by BeforeSuite.
var kubectlRedline string

func buildKubectlRedline(ctx context.Context) string {
	if kubectlRedline != "" {
		return kubectlRedline
	}
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(file), "..", "..")
	out := filepath.Join(st.Dir, "kubectl-redline")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", out, "./cmd/kubectl-redline")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	b, err := cmd.CombinedOutput()
	Expect(err).NotTo(HaveOccurred(), "go build ./cmd/kubectl-redline: %s", b)
	kubectlRedline = out
	return out
}

// runKubectlRedline runs the plugin against the suite's API server as kubectl would.
func runKubectlRedline(g Gomega, ctx context.Context, args ...string) string {
	cmd := exec.CommandContext(ctx, kubectlRedline, args...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+st.Kubeconfig)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	g.Expect(cmd.Run()).To(Succeed(), "kubectl-redline %v: %s", args, stderr.String())
	return stdout.String()
}
