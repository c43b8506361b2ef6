package stack

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"time"

	"github.com/redline-dev/redline/internal/sidecar/contract"
	"github.com/redline-dev/redline/internal/testutil/proc"
	"github.com/redline-dev/redline/internal/testutil/redistest"
)

// SidecarImage is the image the webhook writes into injected Pods. Nothing pulls it: the
// stack runs the locally built sidecar binary in its place.
const SidecarImage = "redline-sidecar:local"

// ManagerNamespace is where the manager believes it runs (POD_NAMESPACE; its own namespace is
// excluded from injection by the webhook registration): its own Secrets and the credentials
// Secrets of RedisBackends live there.
const ManagerNamespace = "redline-system"

const managerNamespace = ManagerNamespace

// startManager runs the manager binary against the control plane and Redis, serving the
// webhook on the port and certificate envtest registered, and waits until it is ready.
func (s *Stack) startManager(ctx context.Context) error {
	// The manager keeps Secrets of its own there (the key of the namespaces' Redis passwords).
	if err := s.CreateNamespace(ctx, managerNamespace); err != nil {
		return err
	}
	probePort, err := redistest.FreePort()
	if err != nil {
		return fmt.Errorf("choosing the manager's probe port: %w", err)
	}
	wio := &s.env.WebhookInstallOptions
	s.probeURL = "http://127.0.0.1:" + strconv.Itoa(probePort)
	s.mgrArgs = []string{
		"--kubeconfig=" + s.Kubeconfig,
		"--metrics-bind-address=0",
		"--health-probe-bind-address=127.0.0.1:" + strconv.Itoa(probePort),
		"--redis-url=" + s.Redis.URL(),
		"--sidecar-image=" + SidecarImage,
		"--webhook-port=" + strconv.Itoa(wio.LocalServingPort),
		"--webhook-cert-dir=" + wio.LocalServingCertDir,
		"--webhook-cert-mode=cert-manager", // the certificate is already in the cert dir
		"--native-sidecars=auto",
	}
	// Every interval, bound and mode the chart leaves to the binary stays the binary's default
	// here too: the end-to-end suite runs what an installation runs.
	if s.opts.ScriptCheckInterval > 0 {
		s.mgrArgs = append(s.mgrArgs, "--script-check-interval="+s.opts.ScriptCheckInterval.String())
	}
	s.mgrArgs = append(s.mgrArgs, s.opts.ManagerArgs...)
	return s.runManager(ctx)
}

// ManagerArgs are the flags the manager runs with.
func (s *Stack) ManagerArgs() []string { return slices.Clone(s.mgrArgs) }

func (s *Stack) runManager(ctx context.Context) error {
	s.progress("starting the manager (controller + webhook) on webhook port %d", s.env.WebhookInstallOptions.LocalServingPort)
	env := append(os.Environ(), "KUBECONFIG="+s.Kubeconfig, "POD_NAMESPACE="+managerNamespace,
		contract.EnvRedisPassword+"="+s.opts.RedisPassword)
	p, err := proc.Start(s.Dir, "manager", s.Bin.Manager, s.mgrArgs, env)
	if err != nil {
		return err
	}
	s.Manager = p
	s.addCleanup(func() error { return p.Stop(10 * time.Second) })
	// /readyz includes the webhook server having started.
	if err := p.WaitHTTP(ctx, s.probeURL+"/readyz", time.Minute, 100*time.Millisecond); err != nil {
		return fmt.Errorf("waiting for the manager to be ready: %w", err)
	}
	s.progress("manager ready (log %s)", p.LogPath)
	return nil
}

// RestartManager kills the manager (SIGKILL: no graceful shutdown, like a crashed or evicted
// pod) and starts it again with the same flags, waiting until it is ready.
func (s *Stack) RestartManager(ctx context.Context) error {
	if err := s.Manager.Kill(); err != nil {
		return fmt.Errorf("killing the manager: %w", err)
	}
	return s.runManager(ctx)
}
