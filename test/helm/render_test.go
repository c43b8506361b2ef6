package helm

import (
	"flag"
	"os"
	"path/filepath"
	"testing"

	. "github.com/onsi/gomega"
	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/lint/support"
	"k8s.io/apimachinery/pkg/labels"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/golden")

func readValues(t *testing.T, name string) map[string]any {
	t.Helper()
	if name == "" {
		return map[string]any{}
	}
	b, err := os.ReadFile(filepath.Join("testdata", "values", name+".yaml"))
	if err != nil {
		t.Fatalf("reading values %s: %v", name, err)
	}
	vals, err := ParseValues(b)
	if err != nil {
		t.Fatal(err)
	}
	return vals
}

// TestLint runs helm lint (strict) on the chart with the default values and each test values
// file.
func TestLint(t *testing.T) {
	for _, name := range []string{"", "cert-manager", "everything"} {
		t.Run("values="+name, func(t *testing.T) {
			g := NewWithT(t)
			lint := action.NewLint()
			lint.Strict = true
			lint.Namespace = Namespace
			lint.KubeVersion = KubeVersion
			res := lint.Run([]string{ChartDir()}, readValues(t, name))
			var msgs []string
			for _, m := range res.Messages {
				if m.Severity >= support.WarningSev { // INFO (an icon is recommended) is advice
					msgs = append(msgs, m.Error())
				}
			}
			for _, err := range res.Errors {
				msgs = append(msgs, err.Error())
			}
			g.Expect(msgs).To(BeEmpty(), "helm lint --strict")
			g.Expect(res.TotalChartsLinted).To(Equal(1))
		})
	}
}

// TestGolden renders the chart and its NOTES.txt for the default values (self-signed
// certificates), the cert-manager mode and every optional object, and compares with
// testdata/golden (go test -update rewrites them).
func TestGolden(t *testing.T) {
	ch, err := LoadChart()
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"default", "cert-manager", "everything"} {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			vals := map[string]any{}
			if name != "default" {
				vals = readValues(t, name)
			}
			out, notes, err := RenderWithNotes(ch, vals)
			g.Expect(err).NotTo(HaveOccurred())
			for path, out := range map[string]string{
				filepath.Join("testdata", "golden", name+".yaml"):      out,
				filepath.Join("testdata", "golden", name+".notes.txt"): notes,
			} {
				if *update {
					g.Expect(os.WriteFile(path, []byte(out), 0o644)).To(Succeed())
				}
				want, err := os.ReadFile(path)
				g.Expect(err).NotTo(HaveOccurred(), "golden file missing: go test -run TestGolden -update")
				g.Expect(out).To(Equal(string(want)), "rendered chart differs from %s (go test ./... -run TestGolden -update after a deliberate change)", path)
			}
		})
	}
}

// TestSchemaRefusesBadValues: a typo or a wrong type fails rendering (and so helm install)
// with the schema's message, which names the field.
func TestSchemaRefusesBadValues(t *testing.T) {
	ch, err := LoadChart()
	if err != nil {
		t.Fatal(err)
	}
	for name, wants := range map[string][]string{
		"bad-typo": {"values don't meet the specifications of the schema", "additional properties 'replicas' not allowed"},
		"bad-type": {"at '/webhook/failurePolicy': value must be one of 'Ignore', 'Fail'", "at '/webhook/timeoutSeconds': got string, want integer"},
	} {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			_, err := Render(ch, readValues(t, name))
			g.Expect(err).To(HaveOccurred())
			for _, w := range wants {
				g.Expect(err.Error()).To(ContainSubstring(w))
			}
		})
	}
}

// TestNamespaceSelectorNeverMatchesReleaseNamespace: whatever selector a user gives, the
// release namespace, kube-system and kube-node-lease stay excluded.
func TestNamespaceSelectorNeverMatchesReleaseNamespace(t *testing.T) {
	g := NewWithT(t)
	ch, err := LoadChart()
	g.Expect(err).NotTo(HaveOccurred())
	for _, vals := range []map[string]any{
		{},
		readValues(t, "everything"),
		{"webhook": map[string]any{"namespaceSelector": map[string]any{"matchExpressions": []any{
			map[string]any{"key": "kubernetes.io/metadata.name", "operator": "In", "values": []any{Namespace, "kube-system", "shop"}},
		}}}},
	} {
		out, err := Render(ch, vals)
		g.Expect(err).NotTo(HaveOccurred())
		objs, err := Objects(out)
		g.Expect(err).NotTo(HaveOccurred())
		hook := Find(objs, "MutatingWebhookConfiguration", "redline-pod-injector")
		g.Expect(hook).NotTo(BeNil())
		sel := mustSelector(g, hook)
		for _, ns := range []string{Namespace, "kube-system", "kube-node-lease"} {
			g.Expect(sel.Matches(nsLabels(ns))).To(BeFalse(), "webhook would inject pods in %s: %s", ns, ToYAML(hook.Object["webhooks"]))
		}
		if len(vals) == 0 {
			g.Expect(sel.Matches(nsLabels("shop"))).To(BeTrue(), "the default selector injects every other namespace")
		}
	}
}

// TestCRDKeptByDefault: the CRD carries helm.sh/resource-policy: keep unless crds.keep is
// false, and is left out with crds.install false.
func TestCRDKeptByDefault(t *testing.T) {
	g := NewWithT(t)
	ch, err := LoadChart()
	g.Expect(err).NotTo(HaveOccurred())
	crdOf := func(vals map[string]any) map[string]string {
		out, err := Render(ch, vals)
		g.Expect(err).NotTo(HaveOccurred())
		objs, err := Objects(out)
		g.Expect(err).NotTo(HaveOccurred())
		crd := Find(objs, "CustomResourceDefinition", "ratelimitpolicies.redline.dev")
		if crd == nil {
			return nil
		}
		a := crd.GetAnnotations()
		if a == nil {
			a = map[string]string{}
		}
		return a
	}
	g.Expect(crdOf(map[string]any{})).To(HaveKeyWithValue("helm.sh/resource-policy", "keep"))
	g.Expect(crdOf(map[string]any{"crds": map[string]any{"keep": false}})).NotTo(HaveKey("helm.sh/resource-policy"))
	g.Expect(crdOf(map[string]any{"crds": map[string]any{"install": false}})).To(BeNil())
}

func nsLabels(ns string) labels.Set {
	return labels.Set{"kubernetes.io/metadata.name": ns}
}
