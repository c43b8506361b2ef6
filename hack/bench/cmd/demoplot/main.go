// Command demoplot draws results/demo.png from results/demo.json, which `make demo` writes
// from Prometheus's query_range: admitted and refused decisions per second, stacked per
// replica, across the demo's phases. It lives in hack/bench's module so that the plotting
// library stays out of the product's go.mod; the demo runs it (go run ./cmd/demoplot).
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"image/color"
	"math"
	"os"
	"slices"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"

	"github.com/redline-dev/redline/hack/demo/timeline"
)

// palette colours the replicas.
var palette = []color.Color{
	color.RGBA{R: 0x4c, G: 0x72, B: 0xb0, A: 0xff},
	color.RGBA{R: 0xdd, G: 0x84, B: 0x52, A: 0xff},
	color.RGBA{R: 0x55, G: 0xa8, B: 0x68, A: 0xff},
	color.RGBA{R: 0x81, G: 0x72, B: 0xb3, A: 0xff},
	color.RGBA{R: 0x93, G: 0x78, B: 0x60, A: 0xff},
}

func main() {
	in := flag.String("in", "results/demo.json", "the demo's Prometheus series")
	out := flag.String("out", "results/demo.png", "the picture to write")
	flag.Parse()
	if err := run(*in, *out); err != nil {
		fmt.Fprintf(os.Stderr, "demoplot: %v\n", err)
		os.Exit(1)
	}
}

func run(in, out string) error {
	raw, err := os.ReadFile(in)
	if err != nil {
		return fmt.Errorf("reading %s: %w", in, err)
	}
	var d timeline.Data
	if err := json.Unmarshal(raw, &d); err != nil {
		return fmt.Errorf("parsing %s: %w", in, err)
	}
	if err := d.Validate(); err != nil {
		return fmt.Errorf("%s: %w", in, err)
	}
	var plots [][]*plot.Plot
	for _, result := range []string{timeline.Admitted, timeline.Refused} {
		p, err := panel(&d, result)
		if err != nil {
			return err
		}
		plots = append(plots, []*plot.Plot{p})
	}
	plots[0][0].Title.Text = fmt.Sprintf("make demo, as Prometheus %s saw it (query_range, step %s, scrapes every 1s)", d.Prometheus, d.Step)
	plots[0][0].X.Label.Text = ""

	const w, h = 13 * vg.Inch, 8 * vg.Inch
	img := vgimg.New(w, h)
	dc := draw.New(img)
	t := draw.Tiles{Rows: 2, Cols: 1, PadY: vg.Millimeter * 4,
		PadTop: vg.Millimeter * 2, PadBottom: vg.Millimeter * 2, PadLeft: vg.Millimeter * 2, PadRight: vg.Millimeter * 4}
	canvases := plot.Align(plots, t, dc)
	for i := range plots {
		plots[i][0].Draw(canvases[i][0])
	}
	f, err := os.Create(out)
	if err != nil {
		return fmt.Errorf("creating %s: %w", out, err)
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		_ = f.Close()
		return fmt.Errorf("writing %s: %w", out, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("closing %s: %w", out, err)
	}
	return nil
}

// panel draws result per second, stacked per pod, with the phases as shaded spans, each
// labelled with its name and its total from Prometheus's instant queries.
func panel(d *timeline.Data, result string) (*plot.Plot, error) {
	p := plot.New()
	p.Y.Label.Text = result + " decisions per second (stacked per replica)"
	p.X.Label.Text = "seconds since the demo started"
	p.Legend.Top, p.Legend.Left = true, false
	p.Legend.YOffs = -vg.Points(34) // below the phase labels
	stacked := d.Stacked(result)
	top := 0.0
	for _, s := range stacked {
		for _, pt := range s.Points {
			top = max(top, pt.V)
		}
	}
	top = max(top*1.6, 1) // room for the phase labels and the legend
	p.Y.Min, p.Y.Max = 0, top
	first, last := d.Seconds(d.Phases[0].Start)-2, d.Seconds(d.Phases[len(d.Phases)-1].End)+2
	p.X.Min, p.X.Max = first, last
	p.X.Tick.Marker = secondTicks{}

	// Phases: every other one shaded, a dashed line at each boundary, a label at the top.
	var labels plotter.XYLabels
	for i, ph := range d.Phases {
		x0, x1 := d.Seconds(ph.Start), d.Seconds(ph.End)
		if i%2 == 0 {
			band, err := plotter.NewPolygon(plotter.XYs{{X: x0, Y: 0}, {X: x1, Y: 0}, {X: x1, Y: top}, {X: x0, Y: top}})
			if err != nil {
				return nil, fmt.Errorf("charting phase %s: %w", ph.Name, err)
			}
			band.Color = color.Gray{Y: 0xee}
			band.Width = 0
			p.Add(band)
		}
		for _, x := range []float64{x0, x1} {
			l, err := plotter.NewLine(plotter.XYs{{X: x, Y: 0}, {X: x, Y: top}})
			if err != nil {
				return nil, fmt.Errorf("charting phase %s: %w", ph.Name, err)
			}
			l.Color = color.Gray{Y: 0x66}
			l.Dashes = []vg.Length{vg.Points(3), vg.Points(3)}
			p.Add(l)
		}
		labels.XYs = append(labels.XYs, plotter.XY{X: x0, Y: top * 0.97})
		labels.Labels = append(labels.Labels, fmt.Sprintf(" %s\n %.0f %s", ph.Name, ph.Total(result), result))
	}
	p.Add(plotter.NewGrid())

	// Top down: each pod's area covers the ones stacked below it up to its own height.
	for i, s := range slices.Backward(stacked) {
		xys := make(plotter.XYs, len(s.Points))
		for j, pt := range s.Points {
			xys[j] = plotter.XY{X: pt.T, Y: pt.V}
		}
		l, err := plotter.NewLine(xys)
		if err != nil {
			return nil, fmt.Errorf("charting %s of %s: %w", result, s.Pod, err)
		}
		c := palette[i%len(palette)]
		l.Color, l.FillColor = c, c
		l.StepStyle = plotter.PreStep // a point at t is the increase over the second before t
		p.Add(l)
	}
	for i, s := range stacked {
		sw, err := plotter.NewLine(plotter.XYs{{X: 0, Y: 0}})
		if err != nil {
			return nil, fmt.Errorf("charting the legend: %w", err)
		}
		sw.Color = palette[i%len(palette)]
		sw.Width = vg.Points(6)
		p.Legend.Add("pod "+s.Pod, sw)
	}
	lab, err := plotter.NewLabels(labels)
	if err != nil {
		return nil, fmt.Errorf("charting the phase labels: %w", err)
	}
	for i := range lab.TextStyle {
		lab.TextStyle[i].YAlign = draw.YTop
	}
	p.Add(lab)
	return p, nil
}

// secondTicks mark every second and label every other one: the phases last seconds.
type secondTicks struct{}

// Ticks implements plot.Ticker.
func (secondTicks) Ticks(lo, hi float64) []plot.Tick {
	var ticks []plot.Tick
	for s := math.Ceil(lo); s <= hi; s++ {
		t := plot.Tick{Value: s}
		if int(s)%2 == 0 {
			t.Label = strconv.Itoa(int(s))
		}
		ticks = append(ticks, t)
	}
	return ticks
}
