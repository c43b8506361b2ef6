package helm

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	. "github.com/onsi/gomega"

	"github.com/redline-dev/redline/test/helm/dashboards"
)

// TestDashboardsGenerated: charts/redline/dashboards holds exactly the JSON the dashboards
// code writes (run `make dashboards` after changing test/helm/dashboards).
func TestDashboardsGenerated(t *testing.T) {
	dir := filepath.Join(ChartDir(), "dashboards")
	var want []string
	for _, d := range dashboards.All() {
		want = append(want, d.File+".json")
		b, err := d.JSON()
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(filepath.Join(dir, d.File+".json"))
		if err != nil {
			t.Errorf("charts/redline/dashboards/%s.json is missing: run `make dashboards`", d.File)
			continue
		}
		if string(got) != string(b) {
			t.Errorf("charts/redline/dashboards/%s.json is not what test/helm/dashboards writes: run `make dashboards` and commit it", d.File)
		}
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if !slices.Contains(want, e.Name()) {
			t.Errorf("charts/redline/dashboards/%s is not written by test/helm/dashboards: remove it or add its dashboard", e.Name())
		}
	}
}

// TestDashboardsShipped: with monitoring.dashboards.enabled each dashboard is a ConfigMap
// with the Grafana sidecar's label, holding the JSON; every query is valid PromQL to promtool
// (checked by TestDashboardQueriesParse).
func TestDashboardsShipped(t *testing.T) {
	g := NewWithT(t)
	ch, err := LoadChart()
	g.Expect(err).NotTo(HaveOccurred())
	out, err := Render(ch, map[string]any{"monitoring": map[string]any{"dashboards": map[string]any{"enabled": true}}})
	g.Expect(err).NotTo(HaveOccurred())
	objs, err := Objects(out)
	g.Expect(err).NotTo(HaveOccurred())
	for _, d := range dashboards.All() {
		cm := Find(objs, "ConfigMap", "redline-dashboard-"+d.File)
		g.Expect(cm).NotTo(BeNil(), "ConfigMap of dashboard %s", d.File)
		g.Expect(cm.GetLabels()).To(HaveKeyWithValue("grafana_dashboard", "1"))
		data, _ := cm.Object["data"].(map[string]any)
		want, err := d.JSON()
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(data[d.File+".json"]).To(Equal(strings.TrimSuffix(string(want), "\n")))
	}
	out, err = Render(ch, map[string]any{})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(out).NotTo(ContainSubstring("redline-dashboard-"), "dashboards are off by default")
}

// grafanaVars stands in for Grafana's variables, as Grafana would expand them with "All".
var grafanaVars = strings.NewReplacer("$__rate_interval", "2m", "$namespace", ".*", "$policy", ".*")

// TestDashboardQueriesParse: every panel query is valid PromQL to the real Prometheus
// (promtool check rules, each query a recording rule).
func TestDashboardQueriesParse(t *testing.T) {
	g := NewWithT(t)
	var rules []map[string]any
	for _, d := range dashboards.All() {
		g.Expect(d.Panels).NotTo(BeEmpty())
		for i, p := range d.Panels {
			g.Expect(p.Queries).NotTo(BeEmpty(), "panel %q", p.Title)
			for j, q := range p.Queries {
				rules = append(rules, map[string]any{
					"record": strings.ReplaceAll(d.File, "-", "_") + ":panel" + string(rune('a'+i)) + string(rune('a'+j)),
					"expr":   grafanaVars.Replace(q.Expr),
				})
			}
		}
	}
	dir := t.TempDir()
	doc := ToYAML(map[string]any{"groups": []any{map[string]any{"name": "dashboards", "rules": rules}}})
	g.Expect(os.WriteFile(filepath.Join(dir, "queries.yaml"), []byte(doc), 0o644)).To(Succeed())
	out, err := exec.Command(promtool(t), "check", "rules", filepath.Join(dir, "queries.yaml")).CombinedOutput()
	g.Expect(err).NotTo(HaveOccurred(), "promtool check rules on the dashboards' queries:\n%s", out)
}

// TestOverviewShowsEveryAlertSignal: every metric an alert of the chart's PrometheusRule reads is
// queried by a panel of the Overview dashboard, as the monitoring page promises.
func TestOverviewShowsEveryAlertSignal(t *testing.T) {
	metric := regexp.MustCompile(`redline_[a-z_]+`)
	var queried []string
	for _, d := range dashboards.All() {
		if d.File != "redline-overview" {
			continue
		}
		for _, p := range d.Panels {
			for _, q := range p.Queries {
				queried = append(queried, metric.FindAllString(q.Expr, -1)...)
			}
		}
	}
	if len(queried) == 0 {
		t.Fatal("no Overview dashboard, or no redline_ metric in its queries")
	}
	rules := renderedRules(t)
	n := 0
	for _, gr := range rules.Spec.Groups {
		for _, r := range gr.Rules {
			for _, m := range metric.FindAllString(r.Expr.String(), -1) {
				n++
				// A histogram's _count is shown through its _bucket quantiles.
				base := strings.TrimSuffix(strings.TrimSuffix(m, "_count"), "_bucket")
				if !slices.Contains(queried, m) && !slices.Contains(queried, base+"_bucket") {
					t.Errorf("alert %s reads %s, which no Overview panel queries", r.Alert, m)
				}
			}
		}
	}
	if n == 0 {
		t.Fatal("no redline_ metric in the rendered alerts")
	}
}
