package timeline

import (
	"strings"
	"testing"
	"time"
)

func pts(vs ...float64) []Point {
	out := make([]Point, len(vs))
	for i, v := range vs {
		out[i] = Point{T: float64(i), V: v}
	}
	return out
}

// TestStackedAddsPodsInOrder: each pod's points are raised by the pods sorted before it, a
// missing time counts 0, and the top series is the total.
func TestStackedAddsPodsInOrder(t *testing.T) {
	d := &Data{Series: []Series{
		{Result: Admitted, Pod: "b", Points: pts(1, 2, 3)},
		{Result: Refused, Pod: "a", Points: pts(100)},
		{Result: Admitted, Pod: "a", Points: pts(10, 20)},
		{Result: Admitted, Pod: "c", Points: []Point{{T: 2, V: 5}}},
	}}
	s := d.Stacked(Admitted)
	if len(s) != 3 || s[0].Pod != "a" || s[1].Pod != "b" || s[2].Pod != "c" {
		t.Fatalf("pods %+v", s)
	}
	want := [][]float64{{10, 20, 0}, {11, 22, 3}, {11, 22, 8}}
	for i, w := range want {
		if len(s[i].Points) != len(w) {
			t.Fatalf("pod %s: %v", s[i].Pod, s[i].Points)
		}
		for j, v := range w {
			if s[i].Points[j] != (Point{T: float64(j), V: v}) {
				t.Errorf("pod %s point %d = %v, want %v at %d", s[i].Pod, j, s[i].Points[j], v, j)
			}
		}
	}
	if got := d.Pods(); strings.Join(got, ",") != "a,b,c" {
		t.Errorf("pods %v", got)
	}
}

func TestValidate(t *testing.T) {
	t0 := time.Unix(100, 0)
	good := func() *Data {
		return &Data{
			Phases: []Phase{{Name: "one", Start: t0, End: t0.Add(time.Second)}, {Name: "two", Start: t0.Add(time.Second), End: t0.Add(2 * time.Second)}},
			Series: []Series{{Result: Admitted, Pod: "a", Points: pts(1)}, {Result: Refused, Pod: "a", Points: pts(0)}},
		}
	}
	if err := good().Validate(); err != nil {
		t.Fatal(err)
	}
	cases := map[string]func(*Data){
		"no phases":             func(d *Data) { d.Phases = nil },
		"ends before it starts": func(d *Data) { d.Phases[0].End = t0 },
		"starts before":         func(d *Data) { d.Phases[1].Start = t0 },
		"no refused series":     func(d *Data) { d.Series = d.Series[:1] },
		"has no points":         func(d *Data) { d.Series[0].Points = nil },
	}
	for want, edit := range cases {
		d := good()
		edit(d)
		err := d.Validate()
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: got %v", want, err)
		}
	}
}

func TestPhaseTotal(t *testing.T) {
	p := Phase{Stats: Stats{Admitted: map[string]float64{"a": 2, "b": 3}, Refused: map[string]float64{"a": 7}}}
	if p.Total(Admitted) != 5 || p.Total(Refused) != 7 {
		t.Errorf("totals %v %v", p.Total(Admitted), p.Total(Refused))
	}
}

// TestBreakdownSplitsThePhaseIntoRowAndProbes: the summary table's row is counted apart from
// the probes around it, for each result, and a phase without a row is all probes.
func TestBreakdownSplitsThePhaseIntoRowAndProbes(t *testing.T) {
	p := Phase{Stats: Stats{Admitted: map[string]float64{"a": 106, "b": 106}, Refused: map[string]float64{"a": 60, "b": 55}},
		Measured: &Measurement{Name: "after the update", Sent: 150, Admitted: 50, Refused: 100}}
	if got, want := p.Breakdown(Admitted), (Breakdown{Result: Admitted, Total: 212, Row: p.Measured, InRow: 50, Probes: 162}); got != want {
		t.Errorf("admitted: %+v, want %+v", got, want)
	}
	if got, want := p.Breakdown(Refused), (Breakdown{Result: Refused, Total: 115, Row: p.Measured, InRow: 100, Probes: 15}); got != want {
		t.Errorf("refused: %+v, want %+v", got, want)
	}
	p.Measured = nil
	if got, want := p.Breakdown(Admitted), (Breakdown{Result: Admitted, Total: 212, Probes: 212}); got != want {
		t.Errorf("without a row: %+v, want %+v", got, want)
	}
}
