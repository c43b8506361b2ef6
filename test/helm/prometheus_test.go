package helm

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	promapi "github.com/prometheus/client_golang/api"
	promv1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"github.com/prometheus/common/model"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	v1alpha1 "github.com/redline-dev/redline/api/v1alpha1"
	"github.com/redline-dev/redline/internal/testutil/redistest"
	"github.com/redline-dev/redline/internal/testutil/stack"
	"github.com/redline-dev/redline/test/helm/dashboards"
)

// The end-to-end query check: a real Prometheus (Debian's package) scrapes the manager and
// the sidecars of the local stack; every dashboard query and alert expression runs against it
// through its HTTP API and must return data in its phase.

const e2eNamespace = "shop"

var e2eLabels = map[string]string{"app": "shop"}

// e2eVars expands Grafana's variables for a 1 s scrape interval.
var e2eVars = strings.NewReplacer("$__rate_interval", "30s", "$namespace", ".*", "$policy", ".*")

func e2ePolicy(name, prefix string, mode v1alpha1.FailureMode, rule v1alpha1.Mode, requests int64) *v1alpha1.RateLimitPolicy {
	return &v1alpha1.RateLimitPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: e2eNamespace, Name: name},
		Spec: v1alpha1.RateLimitPolicySpec{
			TargetSelector: metav1.LabelSelector{MatchLabels: e2eLabels},
			FailureMode:    mode,
			Rules: []v1alpha1.Rule{{
				Name:      "per-client",
				Match:     &v1alpha1.RuleMatch{PathPrefix: prefix},
				Key:       []v1alpha1.KeyPart{{Header: "X-Client"}},
				Algorithm: v1alpha1.FixedWindow,
				Limit:     v1alpha1.Limit{Requests: requests, Window: metav1.Duration{Duration: time.Hour}},
				Mode:      rule,
			}},
		},
	}
}

// startPrometheus runs prometheus scraping targets (address -> labels) every second.
func startPrometheus(t *testing.T, dir string, targets map[string]map[string]string) promv1.API {
	t.Helper()
	bin := filepath.Join(filepath.Dir(promtool(t)), "prometheus")
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("prometheus is not installed beside promtool (apt-get install prometheus): %v", err)
	}
	var statics []map[string]any
	for addr, labels := range targets {
		statics = append(statics, map[string]any{"targets": []string{addr}, "labels": labels})
	}
	cfg, err := yaml.Marshal(map[string]any{
		"global": map[string]any{"scrape_interval": "1s", "evaluation_interval": "1s"},
		// honor_labels as the chart's ServiceMonitor has it: the manager's series name the
		// namespace they describe.
		"scrape_configs": []any{map[string]any{"job_name": "redline", "honor_labels": true, "static_configs": statics}},
	})
	if err != nil {
		t.Fatal(err)
	}
	cfgPath := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfgPath, cfg, 0o644); err != nil {
		t.Fatal(err)
	}
	port, err := redistest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	p, err := stack.StartProcess(dir, "prometheus", bin, []string{
		"--config.file=" + cfgPath, "--storage.tsdb.path=" + filepath.Join(dir, "tsdb"),
		"--web.listen-address=" + addr, "--log.level=warn",
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Stop(10 * time.Second) })
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get("http://" + addr + "/-/ready")
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if done, _ := p.Exited(); done || time.Now().After(deadline) {
			t.Fatalf("prometheus did not become ready at %s; log:\n%s", addr, p.LogTail(3000))
		}
		time.Sleep(100 * time.Millisecond)
	}
	c, err := promapi.NewClient(promapi.Config{Address: "http://" + addr})
	if err != nil {
		t.Fatal(err)
	}
	return promv1.NewAPI(c)
}

// check is one query and what its phase needs of it.
type check struct {
	what, query string
	positive    bool // some sample above 0, not only a series
}

// waitData polls q until it returns a sample (above 0 when positive), or fails after a minute.
func waitData(ctx context.Context, api promv1.API, c check) error {
	deadline := time.Now().Add(time.Minute)
	var last string
	for {
		v, _, _, err := api.Query(ctx, c.query, time.Now())
		if err != nil {
			last = err.Error()
		} else if vec, ok := v.(model.Vector); ok {
			last = fmt.Sprintf("%d series", len(vec))
			for _, s := range vec {
				if !c.positive || s.Value > 0 {
					return nil
				}
				last = "only zeros: " + vec.String()
			}
		} else {
			last = "not a vector: " + v.Type().String()
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("%s: %s returned no data within a minute (%s)", c.what, c.query, last)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// comparison is an alert's trailing threshold (" > 0.01", " > 1 * min(...)").
var comparison = regexp.MustCompile(`(?s)\s+(>|<|==)\s+[0-9.e+-]+(\s*\*.*)?\s*$`)

// startE2EStack starts the local stack (manager metrics on a loopback port), the policies
// and two injected pods' sidecars, and returns the sidecars' proxy URLs and the scrape
// targets (address -> the labels a PodMonitor or ServiceMonitor would give).
func startE2EStack(ctx context.Context, t *testing.T) (*stack.Stack, []string, map[string]map[string]string) {
	t.Helper()
	metricsPort, err := redistest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	st, err := stack.Start(ctx, stack.Options{ManagerArgs: []string{"--metrics-bind-address=127.0.0.1:" + strconv.Itoa(metricsPort)}})
	if st != nil {
		t.Cleanup(func() { _ = st.Stop() })
	}
	if err != nil {
		t.Fatalf("starting the local stack: %v", err)
	}
	if err := st.CreateNamespace(ctx, e2eNamespace); err != nil {
		t.Fatal(err)
	}
	policies := []*v1alpha1.RateLimitPolicy{
		e2ePolicy("open", "/open/", v1alpha1.FailureModeOpen, v1alpha1.Enforce, 1000),
		e2ePolicy("closed", "/closed/", v1alpha1.FailureModeClosed, v1alpha1.Enforce, 1000),
		e2ePolicy("fallback", "/fallback/", v1alpha1.FailureModeLocalFallback, v1alpha1.Enforce, 20),
		e2ePolicy("shadow", "/shadow/", v1alpha1.FailureModeOpen, v1alpha1.Shadow, 5),
	}
	for _, p := range policies {
		if err := st.ApplyPolicy(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range policies {
		if _, err := st.WaitProgrammed(ctx, e2eNamespace, p.Name, time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	app := stack.App{Namespace: e2eNamespace, Name: "shop", Replicas: 2, Labels: e2eLabels, UpstreamPort: 8080}
	if err := st.CreateDeployment(ctx, app); err != nil {
		t.Fatal(err)
	}
	pods, err := st.WaitPods(ctx, app, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	upstream, err := st.StartUpstream()
	if err != nil {
		t.Fatal(err)
	}
	sidecars, err := st.RunSidecars(ctx, pods, upstream.Addr)
	if err != nil {
		t.Fatal(err)
	}
	targets := map[string]map[string]string{
		"127.0.0.1:" + strconv.Itoa(metricsPort): {"namespace": Namespace, "pod": "redline-manager"},
	}
	var proxies []string
	for _, sc := range sidecars {
		targets[strings.TrimPrefix(sc.AdminURL, "http://")] = map[string]string{"namespace": e2eNamespace, "pod": sc.Pod.Name}
		proxies = append(proxies, sc.ProxyURL)
	}
	return st, proxies, targets
}

// TestPrometheusQueries runs the stack with three sidecars' worth of policies (Open, Closed,
// LocalFallback, and a Shadow rule), a real Prometheus scraping the manager and the sidecars,
// and checks every dashboard query and alert expression returns data: while healthy (a
// client over its limit, a Shadow rule refusing) and while Redis is down (fallback,
// fail-open, fail-closed, heartbeat errors).
func TestPrometheusQueries(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	st, proxies, targets := startE2EStack(ctx, t)
	api := startPrometheus(t, t.TempDir(), targets)
	send := func(ctx context.Context, prefix, key string, n int) stack.Tally {
		return stack.Send(ctx, proxies, n, 4, func(i int) stack.Request {
			return stack.Request{Path: fmt.Sprintf("%sitem/%d", prefix, i), Header: http.Header{"X-Client": {key}}}
		})
	}
	// load keeps traffic flowing under each prefix (one client key each) until stopped, so
	// rates over the last 30 s stay above zero while a phase's queries are checked.
	load := func(key string, prefixes ...string) (stop func()) {
		lctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() {
			defer close(done)
			for lctx.Err() == nil {
				for _, p := range prefixes {
					send(lctx, p, key, 10)
				}
				select {
				case <-lctx.Done():
				case <-time.After(200 * time.Millisecond):
				}
			}
		}()
		return func() { cancel(); <-done }
	}

	// Every alert's expression without its threshold names series that exist.
	rule := renderedRules(t)
	alertExpr := map[string]string{}
	var healthy []check
	for _, grp := range rule.Spec.Groups {
		for _, r := range grp.Rules {
			alertExpr[r.Alert] = strings.TrimSpace(r.Expr.String())
		}
	}

	// Phase 1: healthy; the fallback client goes over its limit, the Shadow rule refuses.
	if tl := send(ctx, "/fallback/", "heavy", 40); tl.Limited == 0 {
		t.Fatalf("the client over its limit was never refused: %+v", tl.Counts)
	}
	stopHealthy := load("heavy", "/open/", "/closed/", "/fallback/", "/shadow/")
	defer stopHealthy()
	for _, d := range dashboards.All() {
		for _, p := range d.Panels {
			for _, q := range p.Queries {
				healthy = append(healthy, check{what: d.Title + " / " + p.Title + " (" + q.Legend + ")", query: e2eVars.Replace(q.Expr)})
			}
		}
	}
	healthy = append(healthy,
		check{what: "refusals while a client is over its limit", query: `sum(rate(redline_sidecar_decisions_total{result="refused"}[30s]))`, positive: true},
		check{what: "shadow refusals", query: `sum(rate(redline_sidecar_decisions_total{result="shadow_refused"}[30s]))`, positive: true},
		check{what: "leases or Redis decisions", query: `sum(rate(redline_sidecar_decisions_total{source=~"redis|lease"}[30s]))`, positive: true},
		check{what: "the manager's connection budget", query: `max(redline_redis_connections_worst_case)`, positive: true},
	)
	for name, expr := range alertExpr {
		switch name {
		case "RedlineLocalFallback", "RedlineFailingOpen", "RedlineFailingClosed":
			continue // their series appear with the first such decision: checked while Redis is down
		}
		healthy = append(healthy, check{what: "alert " + name + " without its threshold", query: comparison.ReplaceAllString(expr, "")})
	}
	for _, c := range healthy {
		if err := waitData(ctx, api, c); err != nil {
			t.Error(err)
		}
	}
	if t.Failed() {
		return
	}

	// Phase 2: Redis down. Each failure mode decides, the breaker opens, heartbeats fail.
	stopHealthy()
	if err := st.Redis.Stop(); err != nil {
		t.Fatal(err)
	}
	stopOutage := load("outage", "/open/", "/closed/", "/fallback/")
	defer stopOutage()
	outage := []check{
		{what: "Overview / breaker open", query: `sum(redline_sidecar_breaker_open)`, positive: true},
		{what: "Overview / on local fallback", query: `sum(redline_sidecar_fallback_active)`, positive: true},
		{what: "decisions from the fallback", query: `sum(rate(redline_sidecar_decisions_total{source="fallback"}[30s]))`, positive: true},
		{what: "Redis errors", query: `sum(rate(redline_sidecar_redis_errors_total[30s]))`, positive: true},
	}
	for _, name := range []string{"RedlineLocalFallback", "RedlineFailingOpen", "RedlineFailingClosed", "RedlineHeartbeatsMissing"} {
		outage = append(outage, check{what: "alert " + name + " while Redis is down", query: alertExpr[name]})
	}
	for _, c := range outage {
		if err := waitData(ctx, api, c); err != nil {
			t.Error(err)
		}
	}
}
