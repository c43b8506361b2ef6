package helm

import (
	"bytes"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"

	. "github.com/onsi/gomega"
	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"sigs.k8s.io/yaml"
)

// promtool is Prometheus's promtool (Debian package prometheus; .ci/run installs it).
func promtool(t *testing.T) string {
	t.Helper()
	bin, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatalf("promtool is not on PATH: apt-get install prometheus (.ci/run does): %v", err)
	}
	return bin
}

// renderedRules renders the chart's PrometheusRule with the default thresholds.
func renderedRules(t *testing.T) *monitoringv1.PrometheusRule {
	t.Helper()
	return renderedRulesWith(t, nil)
}

// renderedRulesWith renders the chart's PrometheusRule with values of
// monitoring.prometheusRule set as in vals.
func renderedRulesWith(t *testing.T, vals map[string]any) *monitoringv1.PrometheusRule {
	t.Helper()
	g := NewWithT(t)
	ch, err := LoadChart()
	g.Expect(err).NotTo(HaveOccurred())
	rule := map[string]any{"enabled": true}
	maps.Copy(rule, vals)
	out, err := Render(ch, map[string]any{"monitoring": map[string]any{"prometheusRule": rule}})
	g.Expect(err).NotTo(HaveOccurred())
	objs, err := Objects(out)
	g.Expect(err).NotTo(HaveOccurred())
	return convert[monitoringv1.PrometheusRule](g, Find(objs, "PrometheusRule", "redline"))
}

// TestAlerts runs the chart's alerts through the real Prometheus tooling: promtool check
// rules, then promtool test rules with testdata/alerts_test.yaml, where each alert fires in
// one case and stays quiet in another. Every alert has a runbook line.
func TestAlerts(t *testing.T) {
	g := NewWithT(t)
	rule := renderedRules(t)
	dir := t.TempDir()
	groups, err := yaml.Marshal(map[string]any{"groups": rule.Spec.Groups})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(os.WriteFile(filepath.Join(dir, "rules.yaml"), groups, 0o644)).To(Succeed())
	tests, err := os.ReadFile(filepath.Join("testdata", "alerts_test.yaml"))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(os.WriteFile(filepath.Join(dir, "alerts_test.yaml"), tests, 0o644)).To(Succeed())

	run := func(args ...string) {
		cmd := exec.Command(promtool(t), args...)
		cmd.Dir = dir
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Run(); err != nil {
			t.Fatalf("promtool %v: %v\n%s", args, err, out.String())
		}
	}
	run("check", "rules", "rules.yaml")
	run("test", "rules", "alerts_test.yaml")

	// Each alert: a runbook, a firing case and a quiet case.
	var unit struct {
		Tests []struct {
			AlertRuleTest []struct {
				Alertname string           `json:"alertname"`
				ExpAlerts []map[string]any `json:"exp_alerts"`
			} `json:"alert_rule_test"`
		} `json:"tests"`
	}
	g.Expect(yaml.Unmarshal(tests, &unit)).To(Succeed())
	var fires, quiet []string
	for _, tc := range unit.Tests {
		for _, a := range tc.AlertRuleTest {
			if len(a.ExpAlerts) > 0 {
				fires = append(fires, a.Alertname)
			} else {
				quiet = append(quiet, a.Alertname)
			}
		}
	}
	var alerts []string
	for _, grp := range rule.Spec.Groups {
		for _, r := range grp.Rules {
			if r.Alert == "" {
				continue
			}
			alerts = append(alerts, r.Alert)
			g.Expect(r.Annotations).To(HaveKey("runbook"), "alert %s has no runbook line", r.Alert)
			g.Expect(slices.Contains(fires, r.Alert)).To(BeTrue(), "testdata/alerts_test.yaml has no case where %s fires", r.Alert)
			g.Expect(slices.Contains(quiet, r.Alert)).To(BeTrue(), "testdata/alerts_test.yaml has no case where %s stays quiet", r.Alert)
		}
	}
	g.Expect(alerts).To(HaveLen(10), "the alerts docs/operations/monitoring.md gives a runbook each")
}
