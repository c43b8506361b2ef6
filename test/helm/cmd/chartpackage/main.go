// Command chartpackage packages charts/redline as `helm package` does (bin/chart/redline-<version>.tgz)
// and, with -push oci://<registry>/<repository>, pushes it as an OCI artifact as `helm push`
// does, with the credentials of Helm's registry config (`helm registry login`).
package main

import (
	"flag"
	"log/slog"
	"os"
	"path/filepath"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/helmpath"
	"helm.sh/helm/v3/pkg/registry"

	helmtest "github.com/redline-dev/redline/test/helm"
)

func main() {
	out := flag.String("out", filepath.Join(helmtest.RepoRoot(), "bin", "chart"), "directory of the packaged chart")
	push := flag.String("push", "", "oci://<registry>/<repository> to push the packaged chart to; empty: package only")
	flag.Parse()
	if err := os.MkdirAll(*out, 0o755); err != nil {
		fail("creating the output directory", err)
	}
	pkg := action.NewPackage()
	pkg.Destination = *out
	path, err := pkg.Run(helmtest.ChartDir(), nil)
	if err != nil {
		fail("packaging the chart", err)
	}
	slog.Info("chart packaged", "path", path)
	if *push == "" {
		return
	}
	client, err := registry.NewClient(registry.ClientOptCredentialsFile(helmpath.ConfigPath(registry.CredentialsFileBasename)))
	if err != nil {
		fail("the registry client", err)
	}
	p := action.NewPushWithOpts(action.WithPushConfig(&action.Configuration{RegistryClient: client}))
	if _, err := p.Run(path, *push); err != nil {
		fail("pushing the chart to "+*push, err)
	}
	slog.Info("chart pushed", "remote", *push)
}

func fail(what string, err error) {
	slog.Error(what, "err", err)
	os.Exit(1)
}
