package cluster

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart/loader"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/cli-runtime/pkg/genericclioptions"
)

const (
	releaseName = "redline"
	releaseNS   = "redline-system"
	adminSecret = "redline-redis-admin"
)

// installValues are the chart's defaults but for what a site must say (where its Redis is, the
// Secret with the admin's password) and the sidecars' Redis timeout: the default, 50 ms, is
// for a Redis answering in a millisecond, and on a machine whose two cores other suites share a
// round trip sometimes takes longer; the failure mode (the sample's LocalFallback) then decides
// from a local count, which is not what the exact counts here test. They check that no
// decision was the failure mode's (redline_sidecar_degraded_decisions_total).
func installValues() map[string]any {
	return map[string]any{
		"redis":   map[string]any{"url": suite.redis.url(), "existingSecret": adminSecret},
		"sidecar": map[string]any{"redisTimeout": "1s"},
	}
}

// installChart installs charts/redline as `helm install --wait` does and logs how long the
// wait took (every manager replica Ready).
func installChart(ctx context.Context) error {
	c := suite.client
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: releaseNS}}); err != nil {
		return fmt.Errorf("creating namespace %s: %w", releaseNS, err)
	}
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: adminSecret, Namespace: releaseNS},
		StringData: map[string]string{"password": suite.redis.password},
	}
	if err := c.Create(ctx, secret); err != nil {
		return fmt.Errorf("creating the Redis admin's Secret: %w", err)
	}
	cfg, err := helmConfig()
	if err != nil {
		return err
	}
	ch, err := loader.Load(filepath.Join(suite.root, "charts", "redline"))
	if err != nil {
		return fmt.Errorf("loading the chart: %w", err)
	}
	install := action.NewInstall(cfg)
	install.ReleaseName, install.Namespace = releaseName, releaseNS
	install.Wait, install.Timeout = true, 5*time.Minute // helm's default --timeout
	t0 := time.Now()
	if _, err := install.RunWithContext(ctx, ch, installValues()); err != nil {
		return fmt.Errorf("helm install --wait: %w", err)
	}
	logf("helm install --wait returned after %s (every manager replica Ready)", since(t0))
	return nil
}

func helmConfig() (*action.Configuration, error) { return helmConfigIn(releaseNS) }

// helmConfigIn is Helm's configuration for releases in namespace ns.
func helmConfigIn(ns string) (*action.Configuration, error) {
	flags := genericclioptions.NewConfigFlags(false)
	flags.KubeConfig, flags.Namespace = &suite.kubeconfig, &ns
	cfg := &action.Configuration{}
	if err := cfg.Init(flags, ns, "secret", func(format string, v ...any) {
		fmt.Fprintf(os.Stderr, "[helm] "+format+"\n", v...)
	}); err != nil {
		return nil, fmt.Errorf("initialising helm: %w", err)
	}
	return cfg, nil
}
