package stack

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/redline-dev/redline/internal/testutil/proc"
)

// kcmControllers are the kube-controller-manager controllers the stack needs: Deployments make
// ReplicaSets, ReplicaSets make Pods. With no scheduler and no kubelet the Pods stay Pending,
// which is all the webhook needs to see.
const kcmControllers = "deployment-controller,replicaset-controller"

// startControlPlane starts etcd and kube-apiserver with the CRD and the webhook registration
// installed, writes the admin kubeconfig and starts kube-controller-manager.
func (s *Stack) startControlPlane(ctx context.Context, assets string) error {
	s.progress("starting etcd and kube-apiserver (envtest)")
	s.env = &envtest.Environment{
		BinaryAssetsDirectory: assets,
		CRDDirectoryPaths:     []string{filepath.Join(s.root, "config", "crd", "bases")},
		ErrorIfCRDPathMissing: true,
		// envtest points the webhook's clientConfig at https://127.0.0.1:<port>/mutate-v1-pod
		// with a CA it generates; the manager serves the certificate from LocalServingCertDir.
		WebhookInstallOptions: envtest.WebhookInstallOptions{
			Paths: []string{filepath.Join(s.root, "config", "webhook")},
		},
		Scheme: Scheme,
		// Two cores shared with a compiler: give the processes time.
		ControlPlaneStartTimeout: time.Minute,
		ControlPlaneStopTimeout:  30 * time.Second,
	}
	cfg, err := s.env.Start()
	if err != nil {
		return fmt.Errorf("starting etcd and kube-apiserver from %s: %w", assets, err)
	}
	s.addCleanup(s.env.Stop)
	s.Config = cfg
	s.Client, err = client.New(cfg, client.Options{Scheme: Scheme})
	if err != nil {
		return fmt.Errorf("creating API client: %w", err)
	}
	s.Kubeconfig = s.path("kubeconfig")
	if err := os.WriteFile(s.Kubeconfig, s.env.KubeConfig, 0o600); err != nil {
		return fmt.Errorf("writing kubeconfig: %w", err)
	}
	s.progress("kube-apiserver at %s (kubeconfig %s)", cfg.Host, s.Kubeconfig)

	s.progress("starting kube-controller-manager (%s)", kcmControllers)
	kcm, err := proc.Start(s.Dir, "kube-controller-manager", filepath.Join(assets, "kube-controller-manager"), []string{
		"--kubeconfig=" + s.Kubeconfig,
		"--controllers=" + kcmControllers,
		"--leader-elect=false",
		"--use-service-account-credentials=false",
		"--secure-port=0",
		"--kube-api-qps=100", "--kube-api-burst=200",
	}, nil)
	if err != nil {
		return err
	}
	s.kcm = kcm
	s.addCleanup(func() error { return kcm.Stop(10 * time.Second) })
	// It has no health endpoint without a secure port; a quick crash (bad flag) shows here,
	// anything later when Pods fail to appear.
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(500 * time.Millisecond):
	}
	if done, _ := kcm.Exited(); done {
		return kcm.ExitError()
	}
	return nil
}
