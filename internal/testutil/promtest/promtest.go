// Package promtest runs a real Prometheus server (Debian's prometheus package, or any
// prometheus binary) on a loopback port, scraping static targets every second, for the demo
// and for tests that check what Prometheus sees of Redline's metrics.
package promtest

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	promapi "github.com/prometheus/client_golang/api"
	promv1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"sigs.k8s.io/yaml"

	"github.com/redline-dev/redline/internal/testutil/proc"
	"github.com/redline-dev/redline/internal/testutil/redistest"
)

// ScrapeInterval is how often every target is scraped (and rules evaluated).
const ScrapeInterval = time.Second

// ErrNotInstalled is returned by Binary when no prometheus binary can be found.
var ErrNotInstalled = errors.New("prometheus is not installed: apt-get install prometheus (Debian, Ubuntu), " +
	"or put a prometheus binary on PATH or in $PROMETHEUS")

// Binary returns the path of the prometheus server: $PROMETHEUS when set, else prometheus on
// PATH, else an error wrapping ErrNotInstalled.
func Binary() (string, error) {
	if p := os.Getenv("PROMETHEUS"); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("$PROMETHEUS=%s: %w (%w)", p, err, ErrNotInstalled)
		}
		return p, nil
	}
	p, err := exec.LookPath("prometheus")
	if err != nil {
		return "", fmt.Errorf("%w (%w)", ErrNotInstalled, err)
	}
	return p, nil
}

// Target is one static scrape target: a host:port serving /metrics and the labels Prometheus
// gives its series (as a ServiceMonitor or PodMonitor would: namespace, pod).
type Target struct {
	Addr   string
	Labels map[string]string
}

// Server is a running Prometheus.
type Server struct {
	// URL is its base URL (http://127.0.0.1:PORT).
	URL string
	// API is its HTTP API.
	API promv1.API
	// Proc is the process; its log is Proc.LogPath.
	Proc *proc.Process
}

// Start runs prometheus from Binary with its configuration and TSDB in dir, scraping targets
// every ScrapeInterval with honor_labels (the manager's series name the namespace they
// describe, as with the chart's ServiceMonitor), and waits until it is ready. The caller
// must call Stop.
func Start(ctx context.Context, dir string, targets []Target) (*Server, error) {
	return StartWithRules(ctx, dir, targets, nil)
}

// StartWithRules is Start with a rule file's content (alerting and recording rules, evaluated
// every ScrapeInterval); nil loads none.
func StartWithRules(ctx context.Context, dir string, targets []Target, rules []byte) (*Server, error) {
	bin, err := Binary()
	if err != nil {
		return nil, err
	}
	statics := make([]map[string]any, 0, len(targets))
	for _, t := range targets {
		statics = append(statics, map[string]any{"targets": []string{t.Addr}, "labels": t.Labels})
	}
	conf := map[string]any{
		"global": map[string]any{"scrape_interval": ScrapeInterval.String(), "evaluation_interval": ScrapeInterval.String()},
		"scrape_configs": []any{map[string]any{
			"job_name": "redline", "honor_labels": true, "static_configs": statics,
		}},
	}
	if rules != nil {
		rulesPath := filepath.Join(dir, "rules.yaml")
		if err := os.WriteFile(rulesPath, rules, 0o644); err != nil {
			return nil, fmt.Errorf("writing the prometheus rules: %w", err)
		}
		conf["rule_files"] = []string{rulesPath}
	}
	cfg, err := yaml.Marshal(conf)
	if err != nil {
		return nil, fmt.Errorf("encoding the prometheus configuration: %w", err)
	}
	cfgPath := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfgPath, cfg, 0o644); err != nil {
		return nil, fmt.Errorf("writing the prometheus configuration: %w", err)
	}
	port, err := redistest.FreePort()
	if err != nil {
		return nil, fmt.Errorf("choosing the prometheus port: %w", err)
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	p, err := proc.Start(dir, "prometheus", bin, []string{
		"--config.file=" + cfgPath, "--storage.tsdb.path=" + filepath.Join(dir, "prometheus-tsdb"),
		"--web.listen-address=" + addr, "--log.level=warn",
	}, nil)
	if err != nil {
		return nil, err
	}
	s := &Server{URL: "http://" + addr, Proc: p}
	if err := s.waitReady(ctx); err != nil {
		return nil, errors.Join(err, s.Stop())
	}
	c, err := promapi.NewClient(promapi.Config{Address: s.URL})
	if err != nil {
		return nil, errors.Join(fmt.Errorf("creating the prometheus client: %w", err), s.Stop())
	}
	s.API = promv1.NewAPI(c)
	return s, nil
}

// waitReady polls /-/ready for up to 30 s.
func (s *Server) waitReady(ctx context.Context) error {
	if err := s.Proc.WaitHTTP(ctx, s.URL+"/-/ready", 30*time.Second, 100*time.Millisecond); err != nil {
		return fmt.Errorf("waiting for prometheus to be ready: %w", err)
	}
	return nil
}

// Stop ends Prometheus (SIGTERM, then SIGKILL after 10 s).
func (s *Server) Stop() error { return s.Proc.Stop(10 * time.Second) }

// WaitScraped waits until every active target has been scraped successfully after t, so
// that queries evaluated at or after the returned time see what the targets served at t. It
// returns the latest of those scrape times.
func (s *Server) WaitScraped(ctx context.Context, t time.Time, timeout time.Duration) (time.Time, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		res, err := s.API.Targets(ctx)
		last, pending := t, ""
		if err != nil {
			pending = err.Error()
		} else if len(res.Active) == 0 {
			pending = "no active targets"
		}
		for _, a := range res.Active {
			if a.Health != promv1.HealthGood || !a.LastScrape.After(t) {
				pending = fmt.Sprintf("%s: health %s, last scrape %s, error %q", a.ScrapeURL, a.Health,
					a.LastScrape.Format(time.RFC3339Nano), a.LastError)
				break
			}
			if a.LastScrape.After(last) {
				last = a.LastScrape
			}
		}
		if pending == "" {
			return last, nil
		}
		select {
		case <-ctx.Done():
			return time.Time{}, fmt.Errorf("waiting for prometheus to scrape every target after %s: %s: %w",
				t.Format(time.RFC3339Nano), pending, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Panel is one expression of a graph page.
type Panel struct {
	Expr string
	// Range is the graph's time range ("5m").
	Range string
}

// GraphURL is the URL of Prometheus's graph page showing panels, for a browser.
func (s *Server) GraphURL(panels ...Panel) string {
	q := url.Values{}
	for i, p := range panels {
		g := "g" + strconv.Itoa(i) + "."
		q.Set(g+"expr", p.Expr)
		q.Set(g+"tab", "0") // the graph, not the table
		if p.Range != "" {
			q.Set(g+"range_input", p.Range)
		}
	}
	return s.URL + "/graph?" + q.Encode()
}
