package helm

import (
	"context"
	"fmt"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	promv1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"github.com/prometheus/common/model"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/redline-dev/redline/api/v1alpha1"
	"github.com/redline-dev/redline/internal/testutil/promtest"
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
				Match:     &v1alpha1.RuleMatch{Path: &v1alpha1.PathMatch{Type: v1alpha1.PathMatchPathPrefix, Value: prefix}},
				Key:       []v1alpha1.KeyPart{{Header: "X-Client"}},
				Algorithm: v1alpha1.FixedWindow,
				Limit:     v1alpha1.Limit{Requests: requests, Window: metav1.Duration{Duration: time.Hour}},
				Mode:      rule,
			}},
		},
	}
}

// usagePolicy limits /usage/ by requests in progress (with a queue) and by a calendar month,
// so that the in-flight and quota panels have their series.
func usagePolicy() *v1alpha1.RateLimitPolicy {
	p := e2ePolicy("usage", "/usage/", v1alpha1.FailureModeOpen, v1alpha1.Enforce, 1_000_000)
	r := &p.Spec.Rules[0]
	r.Limit = v1alpha1.Limit{Requests: 1_000_000, Calendar: &v1alpha1.CalendarWindow{Unit: v1alpha1.CalendarMonth}}
	slots := *r
	slots.Name, slots.Algorithm = "slots", ""
	slots.Limit = v1alpha1.Limit{InFlight: new(int64(1000)), Queue: &v1alpha1.InFlightQueue{Size: 10, Timeout: metav1.Duration{Duration: time.Second}}}
	p.Spec.Rules = append(p.Spec.Rules, slots)
	return p
}

// startPrometheus runs the real prometheus (promtest) scraping targets (address -> labels)
// and evaluating rules (a rule file's content; nil: none).
func startPrometheus(ctx context.Context, t *testing.T, dir string, targets map[string]map[string]string, rules []byte) promv1.API {
	t.Helper()
	var ts []promtest.Target
	for addr, labels := range targets {
		ts = append(ts, promtest.Target{Addr: addr, Labels: labels})
	}
	srv, err := promtest.StartWithRules(ctx, dir, ts, rules)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Stop() })
	return srv.API
}

// check is one query and what its phase needs of it.
type check struct {
	what, query string
	positive    bool // some sample above 0, not only a series
}

// waitData polls q until it returns a sample (above 0 when positive), or fails after a minute.
// It returns what the query returned then.
func waitData(ctx context.Context, api promv1.API, c check) (string, error) {
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
					return summary(vec), nil
				}
				last = "only zeros: " + vec.String()
			}
		} else {
			last = "not a vector: " + v.Type().String()
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return "", fmt.Errorf("%s: %s returned no data within a minute (%s)", c.what, c.query, last)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// summary is a vector as the run's log shows it: its series count and its first few samples.
func summary(vec model.Vector) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d series", len(vec))
	for i, s := range vec {
		if i == 3 {
			b.WriteString(" ...")
			break
		}
		fmt.Fprintf(&b, "; %s = %.4g", s.Metric, float64(s.Value))
	}
	return b.String()
}

// comparison is an alert's trailing threshold (" > 0.01", " > 1 * min(...)").
var comparison = regexp.MustCompile(`(?s)\s+(>|<|==)\s+[0-9.e+-]+(\s*\*.*)?\s*$`)

// startE2EStack starts the local stack (manager metrics on a loopback port), the policies
// and two injected pods' sidecars, and returns the sidecars' proxy URLs and the scrape
// targets (address -> the labels a PodMonitor or ServiceMonitor would give).
func startE2EStack(ctx context.Context, t *testing.T) (*stack.Stack, []*stack.Sidecar, map[string]map[string]string) {
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
		usagePolicy(),
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
	for _, sc := range sidecars {
		targets[strings.TrimPrefix(sc.AdminURL, "http://")] = map[string]string{"namespace": e2eNamespace, "pod": sc.Pod.Name}
	}
	return st, sidecars, targets
}

// TestPrometheusQueries runs the stack with two sidecars' worth of policies (Open, Closed,
// LocalFallback, and a Shadow rule) and a real Prometheus scraping the manager and the
// sidecars and evaluating the chart's alerts. Every dashboard query and alert expression
// returns data while healthy (a client over its limit, a Shadow rule refusing), no alert
// fires while healthy, and each alert fires in the phase made for it: Redis slow, the
// connection budget over, a configuration not reaching a pod, a refused reload, Redis down.
func TestPrometheusQueries(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	st, sidecars, targets := startE2EStack(ctx, t)
	api := startPrometheus(ctx, t, t.TempDir(), targets, firingRules(t))
	var proxies []string
	for _, sc := range sidecars {
		proxies = append(proxies, sc.ProxyURL)
	}
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
	stopHealthy := load("heavy", "/open/", "/closed/", "/fallback/", "/shadow/", "/usage/")
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
		if got, err := waitData(ctx, api, c); err != nil {
			t.Error(err)
		} else {
			t.Logf("healthy: %s: %s", c.what, got)
		}
	}
	if t.Failed() {
		return
	}

	// Every rule evaluates without error on the real server, and none fires while healthy.
	if err := waitRulesHealthy(ctx, api); err != nil {
		t.Fatal(err)
	}
	if f, err := firing(ctx, api); err != nil {
		t.Fatal(err)
	} else if len(f) > 0 {
		t.Errorf("alerts firing while everything is healthy: %v", f)
	}
	alerts := &alertRun{api: api, fired: map[string]bool{}}
	provokeAlerts(ctx, t, st, sidecars, alerts)

	// Last phase: Redis down. Each failure mode decides, the breaker opens, heartbeats fail.
	stopHealthy()
	if err := st.Redis.Stop(); err != nil {
		t.Fatal(err)
	}
	stopOutage := load("outage", "/open/", "/closed/", "/fallback/")
	defer stopOutage()
	outage := []check{
		{what: "Overview / breaker open", query: `sum(redline_sidecar_breaker_open)`, positive: true},
		{what: "Overview / open breakers by Redis shard (one Redis: shard all)", query: `sum(redline_sidecar_shard_breaker_open{shard="all"})`, positive: true},
		{what: "Overview / on local fallback", query: `sum(redline_sidecar_fallback_active)`, positive: true},
		{what: "decisions from the fallback", query: `sum(rate(redline_sidecar_decisions_total{source="fallback"}[30s]))`, positive: true},
		{what: "Redis errors", query: `sum(rate(redline_sidecar_redis_errors_total[30s]))`, positive: true},
	}
	for _, c := range outage {
		if got, err := waitData(ctx, api, c); err != nil {
			t.Error(err)
		} else {
			t.Logf("Redis down: %s: %s", c.what, got)
		}
	}
	for _, name := range []string{"RedlineLocalFallback", "RedlineFailingOpen", "RedlineFailingClosed", "RedlineHeartbeatsMissing", "RedlineRedisErrors"} {
		alerts.expect(ctx, t, name, model.LabelSet{"namespace": e2eNamespace})
	}

	// Redis comes back empty (no persistence): once the manager has set the namespace's user
	// and the scripts again, the sidecars restore what they had been granted in the window.
	if err := st.Redis.Start(); err != nil {
		t.Fatalf("starting Redis again: %v", err)
	}
	alerts.expect(ctx, t, "RedlineCountsRestored", model.LabelSet{"namespace": e2eNamespace})

	// No alert of the chart went untested.
	for name := range alertExpr {
		if !alerts.fired[name] {
			t.Errorf("alert %s never fired in the run: give it a phase", name)
		}
	}
}
