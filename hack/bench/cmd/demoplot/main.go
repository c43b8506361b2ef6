// Command demoplot draws results/demo.png from results/demo.json, which `make demo` writes
// from Prometheus's query_range: admitted and refused decisions per second, stacked per
// replica, across the demo's phases. Each phase's label counts its decisions as
// results/demo.md does (timeline.Breakdown); the legend has a column of its own, and a layout
// in which anything covers the bars (layout.go, chart.check) is refused, not drawn. It lives
// in hack/bench's module so that the plotting library stays out of the product's go.mod; the
// demo runs it (go run ./cmd/demoplot).
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"image/color"
	"math"
	"os"
	"strconv"

	"gonum.org/v1/plot"
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
	img := vgimg.New(pictureW, pictureH)
	c, err := layout(&d, draw.New(img))
	if err != nil {
		return err
	}
	if err := c.check(); err != nil {
		return fmt.Errorf("laying out %s: %w", out, err)
	}
	c.draw()
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
