package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/recorder"

	"github.com/redline-dev/redline/hack/demo/timeline"
)

// demoLike is a run shaped like make demo's: four phases of 2.6 to 5 s, three pods, bars as
// high as the phases' totals allow, and each phase's summary table row.
func demoLike() *timeline.Data {
	began := time.Unix(1000, 0)
	at := func(s float64) time.Time { return began.Add(time.Duration(s * float64(time.Second))) }
	pods := []string{"checkout-69f447cfd8-55q2p", "checkout-69f447cfd8-jb6rp", "checkout-69f447cfd8-njsb4"}
	phase := func(name string, from, to float64, admitted, refused float64, row *timeline.Measurement) timeline.Phase {
		st := timeline.Stats{Admitted: map[string]float64{}, Refused: map[string]float64{}}
		for _, p := range pods {
			st.Admitted[p], st.Refused[p] = admitted/3, refused/3
		}
		return timeline.Phase{Name: name, Start: at(from), End: at(to), Stats: st, Measured: row}
	}
	d := &timeline.Data{Began: began, Step: time.Second, Prometheus: "2.42.0+ds", Phases: []timeline.Phase{
		phase("baseline", 16.8, 20.7, 300, 600, &timeline.Measurement{Name: "Redline (shared counter)", Sent: 300, Admitted: 100, Refused: 200}),
		phase("policy change", 20.7, 23.3, 636, 345, &timeline.Measurement{Name: "Redline after the update", Sent: 150, Admitted: 50, Refused: 100}),
		phase("Redis outage", 23.3, 28.4, 48, 102, &timeline.Measurement{Name: "Redline, Redis down (LocalFallback)", Sent: 150, Admitted: 48, Refused: 102}),
		phase("Redis back", 28.4, 31.7, 876, 459, &timeline.Measurement{Name: "Redline, Redis back", Sent: 150, Admitted: 50, Refused: 100}),
	}}
	for _, r := range []string{timeline.Admitted, timeline.Refused} {
		for i, p := range pods {
			var pts []timeline.Point
			for s := 15.0; s <= 33; s++ {
				v := 0.0
				if s == 22 || s == 30 {
					v = 80 + float64(i) // the probes' bursts, right under the labels
				}
				pts = append(pts, timeline.Point{T: s, V: v})
			}
			d.Series = append(d.Series, timeline.Series{Result: r, Pod: p, Points: pts})
		}
	}
	return d
}

// layOut lays d out on a canvas that records instead of drawing, the picture's size.
func layOut(t *testing.T, d *timeline.Data) *chart {
	t.Helper()
	ch, err := layout(d, draw.NewCanvas(&recorder.Canvas{}, pictureW, pictureH))
	if err != nil {
		t.Fatal(err)
	}
	return ch
}

// TestLabelsSayWhatTheyCount: each phase's label gives its total, as Prometheus counted it and
// results/demo.md lists it, split into the summary table's row and the probes around it.
func TestLabelsSayWhatTheyCount(t *testing.T) {
	d := demoLike()
	ch := layOut(t, d)
	want := [][]string{
		{"baseline\n300 admitted\n= 100 (table row)\n+ 200 (probes)", "policy change\n636 admitted\n= 50 (table row)\n+ 586 (probes)",
			"Redis outage\n48 admitted\n= 48 (table row)\n+ 0 (probes)", "Redis back\n876 admitted\n= 50 (table row)\n+ 826 (probes)"},
		{"baseline\n600 refused\n= 200 (table row)\n+ 400 (probes)", "policy change\n345 refused\n= 100 (table row)\n+ 245 (probes)",
			"Redis outage\n102 refused\n= 102 (table row)\n+ 0 (probes)", "Redis back\n459 refused\n= 100 (table row)\n+ 359 (probes)"},
	}
	for i := range want {
		for j, w := range want[i] {
			if got := ch.labels[i][j].text; got != w {
				t.Errorf("panel %d, phase %d: label %q, want %q", i, j, got, w)
			}
		}
	}
	d.Phases[0].Measured = nil
	if got, want := labelText(&d.Phases[0], timeline.Admitted), "baseline\n300 admitted\n= 300 (probes)"; got != want {
		t.Errorf("a phase without a table row: %q, want %q", got, want)
	}
	if !strings.Contains(ch.plots[0].Title.Text, "the phase table of results/demo.md") || !strings.Contains(ch.plots[0].Title.Text, "the summary table's row") {
		t.Errorf("the caption does not say what the labels count: %q", ch.plots[0].Title.Text)
	}
}

// TestLegendAndLabelsCoverNoBars: the legend sits right of both panels, and each phase's label
// inside its own phase, below the top of the data area and above the bars under it.
func TestLegendAndLabelsCoverNoBars(t *testing.T) {
	ch := layOut(t, demoLike())
	if err := ch.check(); err != nil {
		t.Fatal(err)
	}
	for i, data := range ch.data {
		if ch.legendArea.Min.X < ch.tiles[i].Max.X {
			t.Errorf("the legend starts at %.0f points, inside panel %d (to %.0f)", ch.legendArea.Min.X, i, ch.tiles[i].Max.X)
		}
		for j, l := range ch.labels[i] {
			if l.box.Min.Y < l.bars || l.box.Min.X < l.band.Min.X || l.box.Max.X > l.band.Max.X || l.box.Max.Y > data.Max.Y {
				t.Errorf("panel %d, phase %d: label %v, its phase %v, bars to %.0f", i, j, l.box, l.band, l.bars)
			}
		}
		// The probes' burst of the policy change reaches into the label's column: the axis is
		// raised until it clears the label.
		if l := ch.labels[i][1]; l.box.Min.Y-l.bars < labelGap-0.5 {
			t.Errorf("panel %d: the policy change's label ends %.1f points above its bars, want %.0f", i, l.box.Min.Y-l.bars, labelGap)
		}
	}
}

// TestCheckFindsWhatCovers: a phase too short for its label, and a legend moved over a panel,
// are reported.
func TestCheckFindsWhatCovers(t *testing.T) {
	d := demoLike()
	d.Phases[1].End = d.Phases[1].Start.Add(300 * time.Millisecond)
	d.Phases[2].Start = d.Phases[1].End
	err := layOut(t, d).check()
	if err == nil || !strings.Contains(err.Error(), "the label of phase policy change") || !strings.Contains(err.Error(), "does not fit its phase") {
		t.Errorf("a 0.3 s phase: %v", err)
	}
	ch := layOut(t, demoLike())
	ch.legendArea.Rectangle = ch.data[1]
	if err := ch.check(); err == nil || !strings.Contains(err.Error(), "the legend") {
		t.Errorf("a legend over the refused panel: %v", err)
	}
}

// TestCommittedPictureIsLaidOutClear: results/demo.json, which results/demo.png is drawn from,
// lays out with nothing covering the bars, and its labels carry demo.md's numbers.
func TestCommittedPictureIsLaidOutClear(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("..", "..", "..", "..", "results", "demo.json"))
	if err != nil {
		t.Fatalf("reading the demo's results (make demo writes them): %v", err)
	}
	var d timeline.Data
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatal(err)
	}
	if err := d.Validate(); err != nil {
		t.Fatal(err)
	}
	ch := layOut(t, &d)
	if err := ch.check(); err != nil {
		t.Fatal(err)
	}
	for i, result := range []string{timeline.Admitted, timeline.Refused} {
		for j := range d.Phases {
			p := &d.Phases[j]
			if p.Measured == nil {
				t.Errorf("phase %s has no summary table row (results/demo.json predates the rows: run make demo)", p.Name)
				continue
			}
			b := p.Breakdown(result)
			for _, want := range []string{num(b.Total) + " " + result + "\n", "= " + num(float64(b.InRow)) + " (table row)", "+ " + num(b.Probes) + " (probes)"} {
				if !strings.Contains(ch.labels[i][j].text, want) {
					t.Errorf("phase %s: label %q lacks %q", p.Name, ch.labels[i][j].text, want)
				}
			}
		}
	}
}
