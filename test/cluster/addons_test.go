package cluster

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart/loader"
)

// The add-ons hack/cluster/addons.sh builds from Go modules (images and the charts their
// modules carry), at the versions it pins.
const (
	metricsServerVersion = "v0.9.0"
	certManagerVersion   = "v1.11.5"
	certManagerNS        = "cert-manager"
)

// addonsStore is where hack/cluster/addons.sh keeps the add-ons, set by imageArchives.
var addonsStore string

// addonArchives builds the add-ons (once: the script caches them) and returns their image
// archives, for up.sh to import.
func addonArchives() ([]string, error) {
	t0 := time.Now()
	store, err := runScript("addons.sh")
	if err != nil {
		return nil, err
	}
	logf("add-ons ready after %s", since(t0))
	addonsStore = store
	ms := filepath.Join(store, "metrics-server-"+metricsServerVersion)
	cm := filepath.Join(store, "cert-manager-"+certManagerVersion)
	out := []string{filepath.Join(ms, "metrics-server.tar")}
	for _, c := range []string{"controller", "cainjector", "webhook"} {
		out = append(out, filepath.Join(cm, c+".tar"))
	}
	for _, p := range out {
		if _, err := os.Stat(p); err != nil {
			return nil, fmt.Errorf("add-on image %s missing after hack/cluster/addons.sh: %w", p, err)
		}
	}
	return out, nil
}

// installMetricsServer installs metrics-server's own chart into kube-system, as a user would,
// with the image built here and the kubelet's self-signed serving certificate accepted (the
// kubelet of hack/cluster has no certificate signed by the cluster's CA).
func installMetricsServer(ctx context.Context) error {
	vals := map[string]any{
		"image": map[string]any{"repository": "redline.local/metrics-server", "tag": metricsServerVersion},
		"args":  []any{"--kubelet-insecure-tls"},
	}
	t0 := time.Now()
	if err := helmInstallDir(ctx, filepath.Join(addonsStore, "metrics-server-"+metricsServerVersion, "chart"),
		"metrics-server", "kube-system", vals); err != nil {
		return err
	}
	logf("metrics-server installed (helm install --wait) after %s", since(t0))
	return nil
}

// installCertManager installs cert-manager's chart (its CRDs included) into its namespace with
// the images built here.
func installCertManager(ctx context.Context) error {
	img := func(c string) map[string]any {
		return map[string]any{"repository": "redline.local/cert-manager-" + c, "tag": certManagerVersion}
	}
	vals := map[string]any{
		"installCRDs":     true,
		"image":           img("controller"),
		"cainjector":      map[string]any{"image": img("cainjector")},
		"webhook":         map[string]any{"image": img("webhook")},
		"startupapicheck": map[string]any{"enabled": false},
	}
	return helmInstallDir(ctx, filepath.Join(addonsStore, "cert-manager-"+certManagerVersion, "chart"),
		"cert-manager", certManagerNS, vals)
}

// helmInstallDir installs the chart in dir as release name into ns (created), as
// `helm install --create-namespace --wait` does.
func helmInstallDir(ctx context.Context, dir, name, ns string, vals map[string]any) error {
	cfg, err := helmConfigIn(ns)
	if err != nil {
		return err
	}
	ch, err := loader.Load(dir)
	if err != nil {
		return fmt.Errorf("loading the chart in %s: %w", dir, err)
	}
	install := action.NewInstall(cfg)
	install.ReleaseName, install.Namespace, install.CreateNamespace = name, ns, true
	install.Wait, install.Timeout = true, 5*time.Minute
	if _, err := install.RunWithContext(ctx, ch, vals); err != nil {
		return fmt.Errorf("helm install --wait %s: %w", name, err)
	}
	return nil
}
