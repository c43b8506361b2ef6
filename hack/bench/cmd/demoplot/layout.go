package main

import (
	"errors"
	"fmt"
	"image/color"
	"math"
	"slices"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"

	"github.com/redline-dev/redline/hack/demo/timeline"
)

// The picture's size, and the gaps its layout keeps.
const (
	pictureW, pictureH = 15 * vg.Inch, 8.5 * vg.Inch
	// margin is around the picture's edge and between the panels and the legend.
	margin = 3 * vg.Millimeter
	// labelInset is a phase label's distance from its band's left edge and from the top of
	// the data area; labelGap the least room between a label's last line and the bars below.
	labelInset = vg.Length(3)
	labelGap   = vg.Length(6)
)

// chart is the picture laid out: its two panels (admitted, refused), where each one's data
// area and each phase's label fall, and where the legend goes. Everything is in the picture's
// coordinates (points from its bottom left corner), so that a test can check what covers what
// without drawing a pixel.
type chart struct {
	plots []*plot.Plot
	// tiles are each panel's part of the picture; data their data areas.
	tiles []draw.Canvas
	data  []vg.Rectangle
	// labels are each panel's phase labels, in the order of the phases.
	labels [][]phaseLabel
	// legend names the pods' colours, once for both panels, right of them.
	legend     plot.Legend
	legendArea draw.Canvas
}

// phaseLabel is one phase's label in one panel.
type phaseLabel struct {
	text string
	// at is where the text is drawn from (its top left, labelStyle).
	at vg.Point
	// box is where the text falls; band the phase's span of the data area; bars the top of
	// the highest bar drawn in the band.
	box, band vg.Rectangle
	bars      vg.Length
}

// layout places the panels, the phase labels and the legend on c. The legend gets a column
// of its own right of the panels, so it covers neither bars nor labels; each panel's y axis
// is raised until the highest bar stays labelGap below the tallest phase label.
func layout(d *timeline.Data, c draw.Canvas) (*chart, error) {
	ch := &chart{legend: plot.NewLegend()}
	ch.legend.Top, ch.legend.Left = true, true
	for i, pod := range d.Pods() {
		sw, err := plotter.NewLine(plotter.XYs{{X: 0, Y: 0}})
		if err != nil {
			return nil, fmt.Errorf("charting the legend: %w", err)
		}
		sw.Color = palette[i%len(palette)]
		sw.Width = vg.Points(6)
		ch.legend.Add("pod "+pod, sw)
	}
	legendW := ch.legend.Rectangle(c).Size().X
	panels := draw.Crop(c, 0, -(legendW + 2*margin), 0, 0)

	results := []string{timeline.Admitted, timeline.Refused}
	texts := make([][]string, len(results))
	tops := make([]float64, len(results))
	var grid [][]*plot.Plot
	for i, result := range results {
		p, err := panel(d, result)
		if err != nil {
			return nil, err
		}
		for _, ph := range d.Phases {
			texts[i] = append(texts[i], labelText(&ph, result))
		}
		for _, s := range d.Stacked(result) {
			for _, pt := range s.Points {
				tops[i] = max(tops[i], pt.V)
			}
		}
		p.Y.Min, p.Y.Max = 0, max(tops[i], 1)
		ch.plots = append(ch.plots, p)
		grid = append(grid, []*plot.Plot{p})
	}
	ch.plots[0].Title.Text = fmt.Sprintf("make demo, as Prometheus %s saw it (query_range, step %s, scrapes every 1s)\n"+
		"Each phase's label: its decisions, all keys (the phase table of results/demo.md) = the summary table's row measured in it (one fresh key)\n"+
		"+ the probes around it (fresh keys sent one request at a time until every replica enforces a limit)", d.Prometheus, d.Step)
	ch.plots[0].X.Label.Text = ""
	tiles := draw.Tiles{Rows: len(results), Cols: 1, PadY: margin,
		PadTop: margin, PadBottom: margin, PadLeft: margin, PadRight: margin}

	// The data areas' heights do not depend on the y axes' ranges: one alignment gives the
	// room the labels take, the second places everything with the axes raised to leave it.
	for pass := range 2 {
		canvases := plot.Align(grid, tiles, panels)
		ch.tiles, ch.data, ch.labels = nil, nil, nil
		for i, p := range ch.plots {
			tile := canvases[i][0]
			dc := p.DataCanvas(tile)
			ch.tiles, ch.data = append(ch.tiles, tile), append(ch.data, dc.Rectangle)
			ch.labels = append(ch.labels, placeLabels(d, p, dc, texts[i], results[i]))
			if pass == 0 {
				lowest := dc.Max.Y
				for _, l := range ch.labels[i] {
					lowest = min(lowest, l.box.Min.Y)
				}
				// The bars may rise to labelGap below the lowest label's last line.
				room := lowest - labelGap - dc.Min.Y
				if room <= 0 {
					return nil, fmt.Errorf("the %s panel is %.0f points high, too low for its phase labels (%.0f)", results[i], dc.Size().Y, dc.Max.Y-lowest)
				}
				p.Y.Max = max(tops[i], 1) * float64(dc.Size().Y/room)
			}
		}
	}
	size := ch.legend.Rectangle(c).Size()
	top := ch.data[0].Max.Y
	ch.legendArea = draw.Canvas{Canvas: c.Canvas, Rectangle: vg.Rectangle{
		Min: vg.Point{X: c.Max.X - margin - size.X, Y: top - size.Y},
		Max: vg.Point{X: c.Max.X - margin, Y: top},
	}}
	return ch, nil
}

// check says what in the chart covers what it must not: the legend over a panel, a phase's
// label outside its band (over its neighbour's) or above the data area, or a label over the
// bars below it.
func (ch *chart) check() error {
	var errs []error
	for i, tile := range ch.tiles {
		if overlap(ch.legendArea.Rectangle, tile.Rectangle) {
			errs = append(errs, fmt.Errorf("the legend %v covers panel %d %v", ch.legendArea.Rectangle, i, tile.Rectangle))
		}
		for _, l := range ch.labels[i] {
			name, _, _ := strings.Cut(l.text, "\n")
			switch {
			case l.box.Min.X < l.band.Min.X || l.box.Max.X > l.band.Max.X:
				errs = append(errs, fmt.Errorf("panel %d: the label of phase %s (%.0f to %.0f points) does not fit its phase (%.0f to %.0f)",
					i, name, l.box.Min.X, l.box.Max.X, l.band.Min.X, l.band.Max.X))
			case l.box.Max.Y > ch.data[i].Max.Y:
				errs = append(errs, fmt.Errorf("panel %d: the label of phase %s rises above the data area", i, name))
			case l.box.Min.Y < l.bars:
				errs = append(errs, fmt.Errorf("panel %d: the label of phase %s reaches down to %.0f points, over its bars (up to %.0f)", i, name, l.box.Min.Y, l.bars))
			}
		}
	}
	return errors.Join(errs...)
}

// overlap says whether a and b share more than an edge.
func overlap(a, b vg.Rectangle) bool {
	return a.Min.X < b.Max.X && b.Min.X < a.Max.X && a.Min.Y < b.Max.Y && b.Min.Y < a.Max.Y
}

// countTicks label the y axis in whole decisions per second, five or so.
type countTicks struct{}

// Ticks implements plot.Ticker.
func (countTicks) Ticks(lo, hi float64) []plot.Tick {
	step := 1.0
	for (hi-lo)/step > 6 {
		switch s := step / math.Pow(10, math.Floor(math.Log10(step))); s {
		case 2:
			step *= 2.5
		default:
			step *= 2
		}
	}
	var ticks []plot.Tick
	for v := math.Ceil(lo/step) * step; v <= hi; v += step {
		ticks = append(ticks, plot.Tick{Value: v, Label: num(v)})
	}
	return ticks
}

// draw draws the chart onto the canvas it was laid out on.
func (ch *chart) draw() {
	for i, p := range ch.plots {
		p.Draw(ch.tiles[i])
	}
	ch.legend.Draw(ch.legendArea)
}

// labelText is a phase's label in the panel of result: what each of its numbers counts, from
// timeline.Breakdown, as results/demo.md's row of the phase has them.
func labelText(ph *timeline.Phase, result string) string {
	b := ph.Breakdown(result)
	lines := []string{ph.Name, num(b.Total) + " " + result}
	if b.Row != nil {
		lines = append(lines, fmt.Sprintf("= %d (table row)", b.InRow))
		return strings.Join(append(lines, "+ "+num(b.Probes)+" (probes)"), "\n")
	}
	return strings.Join(append(lines, "= "+num(b.Probes)+" (probes)"), "\n")
}

func num(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }

// labelStyle is the phase labels' text style.
func labelStyle() draw.TextStyle {
	l, _ := plotter.NewLabels(plotter.XYLabels{XYs: plotter.XYs{{}}, Labels: []string{""}})
	sty := l.TextStyle[0]
	sty.YAlign = draw.YTop
	return sty
}

// placeLabels puts each phase's label at the top left of its band in the data area dc of p.
func placeLabels(d *timeline.Data, p *plot.Plot, dc draw.Canvas, texts []string, result string) []phaseLabel {
	trX, trY := p.Transforms(&dc)
	sty := labelStyle()
	total := d.Stacked(result)
	out := make([]phaseLabel, len(d.Phases))
	for i, ph := range d.Phases {
		x0, x1 := d.Seconds(ph.Start), d.Seconds(ph.End)
		at := vg.Point{X: trX(x0) + labelInset, Y: dc.Max.Y - labelInset}
		out[i] = phaseLabel{
			text: texts[i],
			at:   at,
			box:  sty.Rectangle(texts[i]).Add(at),
			band: vg.Rectangle{Min: vg.Point{X: trX(x0), Y: dc.Min.Y}, Max: vg.Point{X: trX(x1), Y: dc.Max.Y}},
			bars: trY(highest(total, x0, x1, d.Step.Seconds())),
		}
	}
	return out
}

// highest is the top of the highest bar of the stacked series (the last is the total) drawn
// between x0 and x1. A point at t is a bar over the step before t (plotter.PreStep).
func highest(stacked []timeline.Series, x0, x1, step float64) float64 {
	if len(stacked) == 0 {
		return 0
	}
	top := 0.0
	for _, pt := range stacked[len(stacked)-1].Points {
		if pt.T > x0 && pt.T-step < x1 {
			top = max(top, pt.V)
		}
	}
	return top
}

// panel draws result per second, stacked per pod, over the phases and under their labels; its
// y axis's range is set by layout.
func panel(d *timeline.Data, result string) (*plot.Plot, error) {
	p := plot.New()
	p.Y.Label.Text = result + " decisions per second (stacked per replica)"
	p.X.Label.Text = "seconds since the demo started"
	p.X.Min, p.X.Max = d.Seconds(d.Phases[0].Start)-1, d.Seconds(d.Phases[len(d.Phases)-1].End)+1
	p.X.Tick.Marker = secondTicks{}
	p.Y.Tick.Marker = countTicks{}
	stacked := d.Stacked(result)
	p.Add(phases{d}, plotter.NewGrid())
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
	texts := make([]string, len(d.Phases))
	for i, ph := range d.Phases {
		texts[i] = labelText(&ph, result)
	}
	p.Add(phaseLabels{d: d, texts: texts, result: result})
	return p, nil
}

// phases draws the phases behind the bars, over the whole height of the data area: every
// other one shaded, a dashed line at each boundary.
type phases struct{ d *timeline.Data }

// Plot implements plot.Plotter.
func (ph phases) Plot(c draw.Canvas, p *plot.Plot) {
	trX, _ := p.Transforms(&c)
	dashed := draw.LineStyle{Color: color.Gray{Y: 0x66}, Width: vg.Points(1), Dashes: []vg.Length{vg.Points(3), vg.Points(3)}}
	for i, phase := range ph.d.Phases {
		x0, x1 := trX(ph.d.Seconds(phase.Start)), trX(ph.d.Seconds(phase.End))
		if i%2 == 0 {
			c.FillPolygon(color.Gray{Y: 0xee}, []vg.Point{{X: x0, Y: c.Min.Y}, {X: x1, Y: c.Min.Y}, {X: x1, Y: c.Max.Y}, {X: x0, Y: c.Max.Y}})
		}
		for _, x := range []vg.Length{x0, x1} {
			c.StrokeLine2(dashed, x, c.Min.Y, x, c.Max.Y)
		}
	}
}

// phaseLabels draws each phase's label where placeLabels puts it, so that what layout
// measured is what is drawn.
type phaseLabels struct {
	d      *timeline.Data
	texts  []string
	result string
}

// Plot implements plot.Plotter.
func (l phaseLabels) Plot(c draw.Canvas, p *plot.Plot) {
	sty := labelStyle()
	for _, pl := range placeLabels(l.d, p, c, l.texts, l.result) {
		c.FillText(sty, pl.at, pl.text)
	}
}
