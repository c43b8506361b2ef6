package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	promv1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"github.com/prometheus/common/model"

	"github.com/redline-dev/redline/hack/demo/timeline"
	"github.com/redline-dev/redline/internal/testutil/promtest"
	"github.com/redline-dev/redline/internal/testutil/stack"
)

// The demo's Prometheus queries. Sidecar series get namespace and pod from their scrape
// target, as a PodMonitor gives them.
var (
	// cumulativeQuery is decisions of one result per pod since the sidecar started. A pod
	// without the series has made no such decision yet (the counter appears on first use).
	cumulativeQuery = func(result string) string {
		return fmt.Sprintf(`sum by (pod) (redline_sidecar_decisions_total{namespace=%q,result=%q})`, namespace, result)
	}
	// perSecondQuery is decisions of one result per second per pod, for the picture. The
	// inner sum is filled with 0 for pods that have not made such a decision yet (their
	// scrape target is up), so the burst that creates a counter is counted, not taken as
	// its starting value; irate over a 1 s subquery is then the increase in each second.
	perSecondQuery = func(result string) string {
		return fmt.Sprintf(`irate((%s or 0 * group by (pod) (up{namespace=%q}))[5s:1s])`, cumulativeQuery(result), namespace)
	}
	// fallbackQuery is decisions LocalFallback made, all pods.
	fallbackQuery = fmt.Sprintf(`sum(redline_sidecar_decisions_total{namespace=%q,source="fallback"})`, namespace)
	// breakerQuery is, per pod, 1 if its Redis circuit breaker was open at some scrape of
	// the last %d seconds.
	breakerQuery = func(seconds int) string {
		return fmt.Sprintf(`max by (pod) (max_over_time(redline_sidecar_breaker_open{namespace=%q}[%ds]))`, namespace, seconds)
	}
)

// Decision results as the sidecar's metric labels them.
var resultLabel = map[string]string{timeline.Admitted: "allowed", timeline.Refused: "refused"}

// snapshot is what Prometheus held at one moment: cumulative decisions per pod and fallback
// decisions.
type snapshot struct {
	at                time.Time
	admitted, refused map[string]float64
	fallback          float64
}

// observer is the Prometheus beside the stack and the demo's phases as it saw them.
type observer struct {
	srv    *promtest.Server
	pods   []string // in the order of the demo's proxies
	phases []timeline.Phase
	// cur is the phase under way (Name empty before the first), begun at last.
	cur  timeline.Phase
	last snapshot
}

// startObserver runs Prometheus scraping the manager's metrics and every sidecar's admin port.
func startObserver(ctx context.Context, dir, managerMetrics string, sidecars []*stack.Sidecar) (*observer, error) {
	targets := []promtest.Target{{Addr: managerMetrics, Labels: map[string]string{"namespace": "redline-system", "pod": "redline-manager"}}}
	o := &observer{}
	for _, sc := range sidecars {
		targets = append(targets, promtest.Target{Addr: strings.TrimPrefix(sc.AdminURL, "http://"),
			Labels: map[string]string{"namespace": namespace, "pod": sc.Pod.Name}})
		o.pods = append(o.pods, sc.Pod.Name)
	}
	srv, err := promtest.Start(ctx, dir, targets)
	if err != nil {
		return nil, err
	}
	o.srv = srv
	// Its first scrapes come a few seconds after start (target discovery settles first).
	if _, err := srv.WaitScraped(ctx, time.Now(), 30*time.Second); err != nil {
		return nil, errors.Join(err, srv.Stop())
	}
	return o, nil
}

// graphURL shows the picture's two queries in Prometheus's own graph page.
func (o *observer) graphURL() string {
	return o.srv.GraphURL(promtest.Panel{Expr: perSecondQuery(resultLabel[timeline.Admitted]), Range: "5m"},
		promtest.Panel{Expr: perSecondQuery(resultLabel[timeline.Refused]), Range: "5m"})
}

// begin ends the phase under way (if any) and starts phase name. Both wait until Prometheus
// has scraped every target after the last request of the phase, so each phase's decisions are
// counted in it; the caller sends nothing meanwhile.
func (o *observer) begin(ctx context.Context, name string) (*timeline.Phase, error) {
	ended, err := o.end(ctx)
	if err != nil {
		return nil, err
	}
	o.cur = timeline.Phase{Name: name, Start: o.last.at, Stats: newStats()}
	return ended, nil
}

// end closes the phase under way with what Prometheus returned for it and checks it; it
// returns the closed phase, or nil before the first.
func (o *observer) end(ctx context.Context) (*timeline.Phase, error) {
	if _, err := o.srv.WaitScraped(ctx, time.Now(), 15*time.Second); err != nil {
		return nil, err
	}
	// Every scrape up to now happened before the next phase's first request.
	s, err := o.snapshot(ctx, time.Now())
	if err != nil {
		return nil, err
	}
	prev := o.last
	o.last = s
	if o.cur.Name == "" {
		return nil, nil
	}
	p := o.cur
	p.End = s.at
	p.Stats.Admitted = minus(s.admitted, prev.admitted, o.pods)
	p.Stats.Refused = minus(s.refused, prev.refused, o.pods)
	p.Stats.Fallback = s.fallback - prev.fallback
	seconds := int(math.Ceil(p.End.Sub(p.Start).Seconds()))
	v, err := o.query(ctx, breakerQuery(seconds), p.End)
	if err != nil {
		return nil, err
	}
	for _, open := range v {
		p.Stats.BreakerOpen += open
	}
	o.phases = append(o.phases, p)
	return &o.phases[len(o.phases)-1], checkPhase(p, o.pods)
}

// count adds the outcomes of a load run through the sidecars to the phase under way.
func (o *observer) count(t stack.Tally) {
	if o == nil || o.cur.Name == "" {
		return
	}
	for i, c := range t.PerTarget {
		o.cur.Stats.ClientAdmitted[o.pods[i]] += c.Admitted
		o.cur.Stats.ClientRefused[o.pods[i]] += c.Limited
	}
}

// measured records r, the summary table's row just measured through the sidecars (t), as the
// phase under way's: the picture and demo.md count it apart from the probes around it.
func (o *observer) measured(r row, t stack.Tally) error {
	if o == nil || o.cur.Name == "" {
		return nil
	}
	if o.cur.Measured != nil {
		return fmt.Errorf("phase %s measures %q after %q: its label and demo.md have room for one row", o.cur.Name, r.name, o.cur.Measured.Name)
	}
	o.cur.Measured = &timeline.Measurement{Name: r.name, Sent: t.Sent, Admitted: t.Admitted, Refused: t.Limited}
	return nil
}

func (o *observer) snapshot(ctx context.Context, at time.Time) (snapshot, error) {
	s := snapshot{at: at}
	var err error
	if s.admitted, err = o.query(ctx, cumulativeQuery(resultLabel[timeline.Admitted]), at); err != nil {
		return s, err
	}
	if s.refused, err = o.query(ctx, cumulativeQuery(resultLabel[timeline.Refused]), at); err != nil {
		return s, err
	}
	fb, err := o.query(ctx, fallbackQuery, at)
	if err != nil {
		return s, err
	}
	s.fallback = fb[""]
	return s, nil
}

// query runs an instant query and returns its samples by pod ("" for a sum without labels).
func (o *observer) query(ctx context.Context, q string, at time.Time) (map[string]float64, error) {
	v, warnings, _, err := o.srv.API.Query(ctx, q, at)
	if err != nil {
		return nil, fmt.Errorf("prometheus query %s: %w", q, err)
	}
	if len(warnings) > 0 {
		return nil, fmt.Errorf("prometheus query %s: warnings %v", q, warnings)
	}
	return vectorByPod(q, v)
}

// timeline asks Prometheus for admitted and refused per second per pod over every phase.
func (o *observer) timeline(ctx context.Context, began time.Time) (*timeline.Data, error) {
	if len(o.phases) == 0 {
		return nil, errors.New("no phase has ended")
	}
	d := &timeline.Data{Began: began, Step: time.Second, Phases: o.phases}
	if info, err := o.srv.API.Buildinfo(ctx); err == nil {
		d.Prometheus = info.Version
	}
	// Whole seconds, so the 1 s steps line up with the subquery's and the per-second
	// increases add up to the phases' totals.
	r := promv1.Range{
		Start: o.phases[0].Start.Add(-2 * time.Second).Truncate(time.Second),
		End:   o.phases[len(o.phases)-1].End.Add(2 * time.Second).Truncate(time.Second),
		Step:  d.Step,
	}
	if wait := time.Until(r.End); wait > 0 {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(wait):
		}
	}
	for _, result := range []string{timeline.Admitted, timeline.Refused} {
		q := perSecondQuery(resultLabel[result])
		v, warnings, _, err := o.srv.API.QueryRange(ctx, q, r)
		if err != nil {
			return nil, fmt.Errorf("prometheus query_range %s: %w", q, err)
		}
		if len(warnings) > 0 {
			return nil, fmt.Errorf("prometheus query_range %s: warnings %v", q, warnings)
		}
		series, err := seriesFromMatrix(result, q, v, began)
		if err != nil {
			return nil, err
		}
		d.Series = append(d.Series, series...)
	}
	if err := d.Validate(); err != nil {
		return nil, fmt.Errorf("prometheus's answers: %w", err)
	}
	return d, checkSeriesTotals(d, o.pods)
}

// stop ends Prometheus.
func (o *observer) stop() error {
	if o == nil {
		return nil
	}
	return o.srv.Stop()
}

func newStats() timeline.Stats {
	return timeline.Stats{ClientAdmitted: map[string]int{}, ClientRefused: map[string]int{}}
}

// minus is after-before for each pod; a pod missing from a snapshot had made no decision.
func minus(after, before map[string]float64, pods []string) map[string]float64 {
	out := make(map[string]float64, len(pods))
	for _, p := range pods {
		out[p] = after[p] - before[p]
	}
	return out
}

// vectorByPod turns an instant query's answer into values by pod label.
func vectorByPod(q string, v model.Value) (map[string]float64, error) {
	vec, ok := v.(model.Vector)
	if !ok {
		return nil, fmt.Errorf("prometheus query %s returned a %s, not an instant vector", q, v.Type())
	}
	out := make(map[string]float64, len(vec))
	for _, s := range vec {
		pod := string(s.Metric["pod"])
		if _, dup := out[pod]; dup {
			return nil, fmt.Errorf("prometheus query %s returned pod %q twice", q, pod)
		}
		out[pod] = float64(s.Value)
	}
	return out, nil
}

// seriesFromMatrix turns a query_range answer into one series per pod.
func seriesFromMatrix(result, q string, v model.Value, began time.Time) ([]timeline.Series, error) {
	m, ok := v.(model.Matrix)
	if !ok {
		return nil, fmt.Errorf("prometheus query_range %s returned a %s, not a range vector", q, v.Type())
	}
	var out []timeline.Series
	for _, ss := range m {
		pod := string(ss.Metric["pod"])
		if pod == "" {
			return nil, fmt.Errorf("prometheus query_range %s returned a series without a pod label: %s", q, ss.Metric)
		}
		s := timeline.Series{Result: result, Pod: pod, Query: q, Points: make([]timeline.Point, len(ss.Values))}
		for i, p := range ss.Values {
			s.Points[i] = timeline.Point{T: p.Timestamp.Time().Sub(began).Seconds(), V: float64(p.Value)}
		}
		out = append(out, s)
	}
	return out, nil
}

// The demo's phases.
const (
	phaseBaseline = "baseline"
	phaseChange   = "policy change"
	phaseOutage   = "Redis outage"
	phaseBack     = "Redis back"
)
