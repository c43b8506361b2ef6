package main

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/model"

	"github.com/redline-dev/redline/hack/demo/timeline"
)

var testPods = []string{"a", "b"}

// healthyPhase is a phase in which Prometheus counted exactly what the client saw.
func healthyPhase(name string) timeline.Phase {
	return timeline.Phase{Name: name, Stats: timeline.Stats{
		Admitted: map[string]float64{"a": 5, "b": 4}, Refused: map[string]float64{"a": 1, "b": 0},
		ClientAdmitted: map[string]int{"a": 5, "b": 4}, ClientRefused: map[string]int{"a": 1, "b": 0},
	}}
}

func TestCheckPhaseAcceptsWhatTheClientSaw(t *testing.T) {
	if err := checkPhase(healthyPhase(phaseBaseline), testPods); err != nil {
		t.Fatal(err)
	}
	out := healthyPhase(phaseOutage)
	out.Stats.Fallback, out.Stats.BreakerOpen = 10, 2
	if err := checkPhase(out, testPods); err != nil {
		t.Fatal(err)
	}
}

// TestCheckPhaseFailsWithoutData: each way Prometheus can return too little for a phase makes
// the demo fail, naming the phase and what is missing.
func TestCheckPhaseFailsWithoutData(t *testing.T) {
	cases := map[string]struct {
		phase string
		edit  func(*timeline.Stats)
		want  string
	}{
		"no admitted series for a pod": {phaseBaseline, func(s *timeline.Stats) { delete(s.Admitted, "b") }, "pod b: Prometheus counts 0 admitted, the client 4"},
		"refused short":                {phaseChange, func(s *timeline.Stats) { s.Refused["a"] = 0 }, "pod a: Prometheus counts 0 refused, the client 1"},
		"pod without traffic": {phaseBack, func(s *timeline.Stats) {
			s.Admitted["b"], s.ClientAdmitted["b"] = 0, 0
		}, "the client sent no request through pod b"},
		"outage without fallback":    {phaseOutage, func(s *timeline.Stats) { s.BreakerOpen = 2 }, "no fallback decisions"},
		"outage with one breaker":    {phaseOutage, func(s *timeline.Stats) { s.Fallback, s.BreakerOpen = 3, 1 }, "the breaker was open on 1 of 2 pods"},
		"fallback with Redis up":     {phaseBaseline, func(s *timeline.Stats) { s.Fallback = 1 }, "1 fallback decisions and 0 open breakers with Redis up"},
		"breaker open with Redis up": {phaseChange, func(s *timeline.Stats) { s.BreakerOpen = 1 }, "0 fallback decisions and 1 open breakers"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			p := healthyPhase(c.phase)
			c.edit(&p.Stats)
			err := checkPhase(p, testPods)
			if err == nil {
				t.Fatal("accepted")
			}
			if !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), c.phase) {
				t.Errorf("error %q does not say %q for phase %q", err, c.want, c.phase)
			}
		})
	}
}

func series(result, pod string, vs ...float64) timeline.Series {
	s := timeline.Series{Result: result, Pod: pod}
	for i, v := range vs {
		s.Points = append(s.Points, timeline.Point{T: float64(i), V: v})
	}
	return s
}

func TestCheckSeriesTotals(t *testing.T) {
	p := healthyPhase(phaseBaseline)
	d := &timeline.Data{Phases: []timeline.Phase{p, p}, Series: []timeline.Series{
		series(timeline.Admitted, "a", 0, 6, 4), series(timeline.Admitted, "b", 8),
		series(timeline.Refused, "a", 2), series(timeline.Refused, "b", 0, 0),
	}}
	if err := checkSeriesTotals(d, testPods); err != nil {
		t.Fatal(err)
	}
	d.Series[1] = series(timeline.Admitted, "b", 7)
	d.Series = d.Series[:3]
	err := checkSeriesTotals(d, testPods)
	if err == nil {
		t.Fatal("accepted a short series and a missing one")
	}
	for _, want := range []string{"admitted per second of pod b adds up to 7.0, the phases to 8", "no refused series for pod b"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
}

func TestSeriesFromMatrix(t *testing.T) {
	began := time.Unix(1000, 0)
	m := model.Matrix{{
		Metric: model.Metric{"pod": "p1"},
		Values: []model.SamplePair{{Timestamp: model.TimeFromUnix(1002), Value: 3}, {Timestamp: model.TimeFromUnix(1003), Value: 0}},
	}}
	s, err := seriesFromMatrix(timeline.Refused, "q", m, began)
	if err != nil {
		t.Fatal(err)
	}
	if len(s) != 1 || s[0].Pod != "p1" || s[0].Result != timeline.Refused || s[0].Query != "q" ||
		len(s[0].Points) != 2 || s[0].Points[0] != (timeline.Point{T: 2, V: 3}) || s[0].Points[1] != (timeline.Point{T: 3, V: 0}) {
		t.Errorf("got %+v", s)
	}
	if _, err := seriesFromMatrix(timeline.Refused, "q", model.Matrix{{Metric: model.Metric{"job": "x"}}}, began); err == nil {
		t.Error("accepted a series without a pod label")
	}
	if _, err := seriesFromMatrix(timeline.Refused, "q", model.Vector{}, began); err == nil {
		t.Error("accepted an instant vector")
	}
}

func TestVectorByPod(t *testing.T) {
	v, err := vectorByPod("q", model.Vector{{Metric: model.Metric{"pod": "a"}, Value: 2}, {Metric: model.Metric{}, Value: 7}})
	if err != nil {
		t.Fatal(err)
	}
	if v["a"] != 2 || v[""] != 7 || len(v) != 2 {
		t.Errorf("got %v", v)
	}
	if _, err := vectorByPod("q", model.Vector{{Metric: model.Metric{"pod": "a"}}, {Metric: model.Metric{"pod": "a"}}}); err == nil {
		t.Error("accepted a pod twice")
	}
	if _, err := vectorByPod("q", model.Matrix{}); err == nil {
		t.Error("accepted a matrix")
	}
}

func TestMinusCountsMissingPodsAsZero(t *testing.T) {
	got := minus(map[string]float64{"a": 5, "b": 3}, map[string]float64{"a": 2}, testPods)
	if got["a"] != 3 || got["b"] != 3 || len(got) != 2 {
		t.Errorf("got %v", got)
	}
}

// TestQueriesFillPodsWithoutDecisions: the per-second query keeps a pod's first burst by
// filling the cumulative sum with 0 from the pod's up series, and asks for the sidecar's
// result label, not the picture's word for it.
func TestQueriesFillPodsWithoutDecisions(t *testing.T) {
	q := perSecondQuery(resultLabel[timeline.Admitted])
	for _, want := range []string{`result="allowed"`, `or 0 * group by (pod) (up{namespace="shop"})`, `[5s:1s]`} {
		if !strings.Contains(q, want) {
			t.Errorf("%s lacks %s", q, want)
		}
	}
	if got := breakerQuery(7); !strings.Contains(got, "[7s]") {
		t.Errorf("breaker query %s", got)
	}
}

// TestMarkdownListsEveryPhase: demo.md holds the summary table as make demo prints it, and
// each phase's count split as the picture's label splits it: the table's row measured in the
// phase, and the probes around it.
func TestMarkdownListsEveryPhase(t *testing.T) {
	d := &timeline.Data{Began: time.Unix(0, 0), Step: time.Second, Prometheus: "2.42.0"}
	for _, name := range []string{phaseBaseline, phaseOutage} {
		p := healthyPhase(name)
		p.Start, p.End = time.Unix(10, 0), time.Unix(12, 0)
		d.Phases = append(d.Phases, p)
	}
	d.Phases[0].Measured = &timeline.Measurement{Name: "Redline (shared counter)", Sent: 6, Admitted: 3, Refused: 1}
	d.Series = []timeline.Series{{Result: timeline.Admitted, Pod: "a", Points: []timeline.Point{{T: 11, V: 5}, {T: 20, V: 9}}}}
	rows := []row{
		{name: "in-memory limiter x3 (naive)", limit: 3, window: time.Minute, replicas: 2, sent: 6, admitted: 6, callsPerDecision: -1},
		{name: "Redline (shared counter)", limit: 3, window: time.Minute, replicas: 2, sent: 6, admitted: 3, callsPerDecision: 0.5},
	}
	md := markdown(d, testPods, rows, "")
	for _, want := range []string{
		"|  | limit | replicas | sent | admitted | over-admission | Redis calls/decision |\n|---|--:|--:|--:|--:|--:|--:|\n",
		"| in-memory limiter x3 (naive) | 3/1min | 2 | 6 | 6 | +100% | - (no Redis) |\n",
		"| Redline (shared counter) | 3/1min | 2 | 6 | 3 | none | 0.50 |\n",
		"| baseline | 2.0 | 5 + 4 = 9 | 3 of 6 | 6 | 5 + 4 | 1 + 0 = 1 | 1 of 6 | 0 | 1 + 0 | 0 | 0 of 2 | 5 | 0 |\n",
		"| Redis outage | 2.0 | 5 + 4 = 9 | - | 9 | 5 + 4 | 1 + 0 = 1 | - | 1 | 1 + 0 |",
		"`" + fallbackQuery + "`",
		"[Ns]",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("demo.md lacks %q:\n%s", want, md)
		}
	}
}
