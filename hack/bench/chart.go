package main

import (
	"fmt"
	"image/color"
	"os"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// palette colours the groups of bars.
var palette = []color.Color{
	color.RGBA{R: 0x4c, G: 0x72, B: 0xb0, A: 0xff},
	color.RGBA{R: 0xdd, G: 0x84, B: 0x52, A: 0xff},
	color.RGBA{R: 0x55, G: 0xa8, B: 0x68, A: 0xff},
	color.RGBA{R: 0xc4, G: 0x4e, B: 0x52, A: 0xff},
}

// drawChart writes a PNG with three panels: decisions per second of each face by concurrency
// against the Redis ceiling, their p99 latency, and admitted/limit per algorithm and replica count.
func drawChart(path string, r *Report) error {
	var concs []int
	for _, f := range r.Faces {
		if f.Face == faces[0] {
			concs = append(concs, f.Concurrency)
		}
	}
	thr, err := faceBars(r, concs, "decisions per second (closed loop)", "per second", func(f FaceCell) float64 { return f.PerSec })
	if err != nil {
		return err
	}
	if c := r.ceiling(); c > 0 {
		if err := hline(thr, c, len(faces), fmt.Sprintf("ceiling, redis-benchmark -P 16: %.0f/s", c)); err != nil {
			return err
		}
		thr.Y.Max = max(thr.Y.Max, c) * 1.3
	}
	lat, err := faceBars(r, concs, "p99 latency", "milliseconds", func(f FaceCell) float64 { return f.P99.Seconds() * 1000 })
	if err != nil {
		return err
	}
	acc, err := accuracyBars(r)
	if err != nil {
		return err
	}
	const w, h = 15 * vg.Inch, 5 * vg.Inch
	img := vgimg.New(w, h)
	dc := draw.New(img)
	t := draw.Tiles{Rows: 1, Cols: 3, PadX: vg.Millimeter * 4, PadY: vg.Millimeter * 4,
		PadTop: vg.Millimeter * 2, PadBottom: vg.Millimeter * 2, PadLeft: vg.Millimeter * 2, PadRight: vg.Millimeter * 2}
	plots := [][]*plot.Plot{{thr, lat, acc}}
	canvases := plot.Align(plots, t, dc)
	for j, p := range plots[0] {
		p.Draw(canvases[0][j])
	}
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("creating %s: %w", path, err)
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		_ = f.Close()
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("closing %s: %w", path, err)
	}
	return nil
}

// faceBars groups one bar per concurrency level over each face.
func faceBars(r *Report, concs []int, title, ylabel string, value func(FaceCell) float64) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text, p.Y.Label.Text = title, ylabel
	p.Legend.Top, p.Legend.Left = true, true
	width := vg.Points(60 / float64(max(len(concs), 1)))
	var top float64
	for i, n := range concs {
		vals := make(plotter.Values, len(faces))
		for j, face := range faces {
			for _, f := range r.Faces {
				if f.Face == face && f.Concurrency == n {
					vals[j] = value(f)
					top = max(top, vals[j])
				}
			}
		}
		bars, err := plotter.NewBarChart(vals, width)
		if err != nil {
			return nil, fmt.Errorf("charting %s: %w", title, err)
		}
		bars.Color = palette[i%len(palette)]
		bars.LineStyle.Width = 0
		bars.Offset = width * vg.Length(float64(i)-float64(len(concs)-1)/2)
		p.Add(bars)
		p.Legend.Add(strconv.Itoa(n)+" clients", bars)
	}
	p.NominalX("direct", "proxy", "/v1/check", "RLS (gRPC)")
	p.X.Label.Text = "face (direct: the upstream without Redline)"
	p.Y.Min, p.Y.Max = 0, top*1.3 // room for the legend
	p.Y.Tick.Marker = wholeTicks{}
	p.Add(plotter.NewGrid())
	return p, nil
}

// wholeTicks are the default ticks labelled without decimals.
type wholeTicks struct{}

// Ticks implements plot.Ticker.
func (wholeTicks) Ticks(lo, hi float64) []plot.Tick {
	ticks := plot.DefaultTicks{}.Ticks(lo, hi)
	for i := range ticks {
		if ticks[i].Label != "" {
			ticks[i].Label = strconv.FormatFloat(ticks[i].Value, 'f', -1, 64)
		}
	}
	return ticks
}

// hline draws a dashed horizontal line at y across n nominal x positions.
func hline(p *plot.Plot, y float64, n int, label string) error {
	l, err := plotter.NewLine(plotter.XYs{{X: -0.5, Y: y}, {X: float64(n) - 0.5, Y: y}})
	if err != nil {
		return fmt.Errorf("charting a line: %w", err)
	}
	l.Color = color.Black
	l.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
	p.Add(l)
	p.Legend.Add(label, l)
	return nil
}

// accuracyBars shows admitted/limit per algorithm, one bar per replica count, against 1.
func accuracyBars(r *Report) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text, p.Y.Label.Text = "admitted / limit across replicas (1 = exact)", "admitted / limit"
	p.Legend.Top, p.Legend.Left = true, true
	var counts []int
	for _, a := range r.Accuracy {
		if a.Algorithm == algorithms[0] {
			counts = append(counts, a.Replicas)
		}
	}
	width := vg.Points(60 / float64(max(len(counts), 1)))
	for i, n := range counts {
		vals := make(plotter.Values, len(algorithms))
		for j, alg := range algorithms {
			for _, a := range r.Accuracy {
				if a.Algorithm == alg && a.Replicas == n {
					vals[j] = float64(a.Admitted) / float64(a.Limit)
				}
			}
		}
		bars, err := plotter.NewBarChart(vals, width)
		if err != nil {
			return nil, fmt.Errorf("charting accuracy: %w", err)
		}
		bars.Color = palette[i%len(palette)]
		bars.LineStyle.Width = 0
		bars.Offset = width * vg.Length(float64(i)-float64(len(counts)-1)/2)
		p.Add(bars)
		p.Legend.Add(strconv.Itoa(n)+" replicas", bars)
	}
	if err := hline(p, 1, len(algorithms), "limit"); err != nil {
		return nil, err
	}
	p.Y.Min, p.Y.Max = 0, 1.5
	names := make([]string, len(algorithms))
	for i, a := range algorithms {
		names[i] = strings.Replace(strings.Replace(a, "Window", "\nWindow", 1), "Bucket", "\nBucket", 1)
	}
	p.NominalX(names...)
	p.Add(plotter.NewGrid())
	return p, nil
}
