package promtest

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/common/model"
)

// TestScrapesTargetsWithTheirLabels runs the real prometheus against one target and reads the
// target's counter back through the HTTP API, with the target's labels and honor_labels.
func TestScrapesTargetsWithTheirLabels(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "promtest_things_total", Help: "Things."}, []string{"pod"})
	reg.MustRegister(c)
	// The series' own pod label wins over the target's (honor_labels).
	c.WithLabelValues("from-series").Add(7)
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p, err := Start(ctx, t.TempDir(), []Target{{
		Addr: strings.TrimPrefix(srv.URL, "http://"), Labels: map[string]string{"namespace": "ns", "pod": "from-target"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := p.Stop(); err != nil {
			t.Error(err)
		}
	}()
	at, err := p.WaitScraped(ctx, time.Now(), 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	v, _, _, err := p.API.Query(ctx, `promtest_things_total{namespace="ns"}`, at)
	if err != nil {
		t.Fatal(err)
	}
	vec, ok := v.(model.Vector)
	if !ok || len(vec) != 1 {
		t.Fatalf("query returned %v, want one sample", v)
	}
	if got := vec[0].Metric["pod"]; got != "from-series" {
		t.Errorf("pod label %q, want the series' own (honor_labels)", got)
	}
	if vec[0].Value != 7 {
		t.Errorf("value %v, want 7", vec[0].Value)
	}
	// The browser link leads to a graph page (Debian's build redirects to its classic UI,
	// keeping the query).
	resp, err := http.Get(p.GraphURL(Panel{Expr: "promtest_things_total", Range: "5m"}))
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Request.URL.Query().Get("g0.expr") != "promtest_things_total" {
		t.Errorf("graph link: %s at %s", resp.Status, resp.Request.URL)
	}
}

func TestGraphURLEncodesEachPanel(t *testing.T) {
	s := &Server{URL: "http://127.0.0.1:9090"}
	raw := s.GraphURL(Panel{Expr: `sum by (pod) (rate(x{a="b"}[5s]))`, Range: "5m"}, Panel{Expr: "up"})
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	if u.Path != "/graph" {
		t.Errorf("path %q, want /graph", u.Path)
	}
	q := u.Query()
	if got := q.Get("g0.expr"); got != `sum by (pod) (rate(x{a="b"}[5s]))` {
		t.Errorf("g0.expr = %q", got)
	}
	if q.Get("g0.range_input") != "5m" || q.Get("g1.expr") != "up" || q.Get("g1.tab") != "0" || q.Has("g1.range_input") {
		t.Errorf("query %v", q)
	}
}
