// Package helm tests the Helm chart charts/redline with Helm as a library: lint, rendering
// (golden files), the values schema, the chart's agreement with config/ and the manager
// binary, installing it into a real kube-apiserver (envtest), and its alerts under promtool.
//
// It is a module of its own so that Helm's dependency graph stays out of the product's go.mod.
package helm

import (
	"bytes"
	"fmt"
	"path/filepath"
	"runtime"
	"sort"
	"strings"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"
)

// ReleaseName and Namespace are what the tests install the chart as.
const (
	ReleaseName = "redline"
	Namespace   = "redline-system"
)

// RepoRoot is the repository's root directory (two levels above this file).
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// ChartDir is charts/redline.
func ChartDir() string { return filepath.Join(RepoRoot(), "charts", "redline") }

// LoadChart loads charts/redline from disk.
func LoadChart() (*chart.Chart, error) {
	ch, err := loader.Load(ChartDir())
	if err != nil {
		return nil, fmt.Errorf("loading chart %s: %w", ChartDir(), err)
	}
	return ch, nil
}

// KubeVersion is the cluster version rendering assumes (the chart needs 1.30+).
var KubeVersion = &chartutil.KubeVersion{Version: "v1.37.2", Major: "1", Minor: "37"}

// Render renders the chart as `helm template` does (client only, the schema validated) with
// vals and returns the manifest.
func Render(ch *chart.Chart, vals map[string]any) (string, error) {
	manifest, _, err := RenderWithNotes(ch, vals)
	return manifest, err
}

// RenderWithNotes is Render that also returns what helm install prints (templates/NOTES.txt).
func RenderWithNotes(ch *chart.Chart, vals map[string]any) (manifest, notes string, err error) {
	return RenderAt(ch, vals, KubeVersion)
}

// RenderAt is RenderWithNotes for a cluster of version kv (the chart's kubeVersion is checked
// against it, as helm install checks the cluster's).
func RenderAt(ch *chart.Chart, vals map[string]any, kv *chartutil.KubeVersion) (manifest, notes string, err error) {
	install := action.NewInstall(&action.Configuration{})
	install.DryRun = true
	install.ClientOnly = true
	install.ReleaseName = ReleaseName
	install.Namespace = Namespace
	install.KubeVersion = kv
	install.IncludeCRDs = true
	rel, err := install.Run(ch, vals)
	if err != nil {
		return "", "", fmt.Errorf("rendering chart: %w", err)
	}
	return rel.Manifest, rel.Info.Notes, nil
}

// Objects splits a rendered manifest into objects, sorted by kind, namespace and name.
func Objects(manifest string) ([]*unstructured.Unstructured, error) {
	var out []*unstructured.Unstructured
	for doc := range strings.SplitSeq(manifest, "\n---") {
		if strings.TrimSpace(strings.TrimPrefix(doc, "\n")) == "" {
			continue
		}
		m := map[string]any{}
		if err := yaml.Unmarshal([]byte(doc), &m); err != nil {
			return nil, fmt.Errorf("parsing rendered document %q: %w", firstLine(doc), err)
		}
		if len(m) == 0 {
			continue
		}
		out = append(out, &unstructured.Unstructured{Object: m})
	}
	sort.SliceStable(out, func(i, j int) bool { return objectKey(out[i]) < objectKey(out[j]) })
	return out, nil
}

func objectKey(o *unstructured.Unstructured) string {
	return o.GetKind() + "/" + o.GetNamespace() + "/" + o.GetName()
}

// Find returns the object of kind and name, or nil.
func Find(objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	for _, o := range objs {
		if o.GetKind() == kind && o.GetName() == name {
			return o
		}
	}
	return nil
}

func firstLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}

// ParseValues reads a values document.
func ParseValues(doc []byte) (map[string]any, error) {
	vals := map[string]any{}
	if err := yaml.Unmarshal(doc, &vals); err != nil {
		return nil, fmt.Errorf("parsing values: %w", err)
	}
	return vals, nil
}

// ToYAML marshals v, for messages and golden files.
func ToYAML(v any) string {
	b, err := yaml.Marshal(v)
	if err != nil {
		return fmt.Sprintf("<%v>", err)
	}
	return string(bytes.TrimSpace(b))
}
