// Package timeline is what `make demo` keeps of Prometheus's view of the run, in
// results/demo.json: the demo's phases, and admitted and refused decisions per second per
// replica from Prometheus's query_range. The demo (product module) writes it; the picture
// (results/demo.png) is drawn from it by hack/bench's demoplot command, so the plotting
// library stays out of the product's go.mod.
package timeline

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"time"
)

// Results of the per-second series.
const (
	Admitted = "admitted"
	Refused  = "refused"
)

// Data is results/demo.json.
type Data struct {
	// Began is when the demo started; the picture's x axis counts seconds from it.
	Began time.Time `json:"began"`
	// Prometheus is the server's version, for the picture's caption.
	Prometheus string `json:"prometheus"`
	// Step is the query_range resolution.
	Step   time.Duration `json:"step"`
	Phases []Phase       `json:"phases"`
	// Series are one per result and pod.
	Series []Series `json:"series"`
}

// Phase is one part of the demo's story, between two moments at which Prometheus had
// scraped every target (so each phase's decisions are counted in that phase).
type Phase struct {
	Name  string    `json:"name"`
	Start time.Time `json:"start"`
	End   time.Time `json:"end"`
	// Stats is what Prometheus returned for the phase's key queries.
	Stats Stats `json:"stats"`
	// Measured is the row of the demo's summary table measured in this phase, nil for none.
	// The phase counts more than it: every probe sent around it too (see Breakdown).
	Measured *Measurement `json:"measured,omitempty"`
}

// Measurement is one row of the demo's summary table: requests sent with one fresh API key,
// at the measurements' pace, and what the replicas together answered.
type Measurement struct {
	Name     string `json:"name"`
	Sent     int    `json:"sent"`
	Admitted int    `json:"admitted"`
	Refused  int    `json:"refused"`
}

// Breakdown is what a phase's label in results/demo.png and its row in results/demo.md say
// of one result, so the two cannot disagree: every decision of the phase as Prometheus
// counted it (all pods, all keys), the part the summary table's row counts, and the rest,
// the probes: fresh keys sent one at a time until every replica enforces a limit (after the
// policy change, after Redis is back), which the summary table leaves out.
type Breakdown struct {
	Result string
	// Total is Prometheus's count of the phase (Phase.Total).
	Total float64
	// Row is the phase's summary table row; nil for a phase without one, and then Probes is
	// Total.
	Row *Measurement
	// InRow is Row's count of Result (its admitted or its refused).
	InRow int
	// Probes is Total less InRow.
	Probes float64
}

// Breakdown splits the phase's count of result into its summary table row and its probes.
func (p *Phase) Breakdown(result string) Breakdown {
	b := Breakdown{Result: result, Total: p.Total(result), Row: p.Measured}
	if p.Measured != nil {
		b.InRow = p.Measured.Admitted
		if result == Refused {
			b.InRow = p.Measured.Refused
		}
	}
	b.Probes = b.Total - float64(b.InRow)
	return b
}

// Stats are the per-phase answers of Prometheus (per pod where keyed by pod) next to what
// the demo's client counted.
type Stats struct {
	Admitted map[string]float64 `json:"admitted"`
	Refused  map[string]float64 `json:"refused"`
	// Fallback is decisions made by LocalFallback (source="fallback"), all pods.
	Fallback float64 `json:"fallback"`
	// BreakerOpen is how many pods had their Redis circuit breaker open at some scrape of
	// the phase.
	BreakerOpen float64 `json:"breakerOpen"`
	// ClientAdmitted and ClientRefused are what the demo's HTTP client saw (2xx, 429).
	ClientAdmitted map[string]int `json:"clientAdmitted"`
	ClientRefused  map[string]int `json:"clientRefused"`
}

// Series is one line of the picture.
type Series struct {
	Result string `json:"result"`
	Pod    string `json:"pod"`
	// Query is the PromQL expression it came from.
	Query  string  `json:"query"`
	Points []Point `json:"points"`
}

// Point is a value at a time; T is seconds since Data.Began.
type Point struct {
	T float64 `json:"t"`
	V float64 `json:"v"`
}

// Seconds is t on the picture's x axis.
func (d *Data) Seconds(t time.Time) float64 { return t.Sub(d.Began).Seconds() }

// Of returns the series of result, sorted by pod, so every panel colours pods alike.
func (d *Data) Of(result string) []Series {
	var out []Series
	for _, s := range d.Series {
		if s.Result == result {
			out = append(out, s)
		}
	}
	slices.SortFunc(out, func(a, b Series) int { return cmp.Compare(a.Pod, b.Pod) })
	return out
}

// Pods are the pods of every series, sorted.
func (d *Data) Pods() []string {
	var pods []string
	for _, s := range d.Series {
		if !slices.Contains(pods, s.Pod) {
			pods = append(pods, s.Pod)
		}
	}
	slices.Sort(pods)
	return pods
}

// Validate says what makes d unfit to draw: no phases, phases out of order, a series
// without points or outside the phases' span, a result with no series.
func (d *Data) Validate() error {
	if len(d.Phases) == 0 {
		return errors.New("no phases")
	}
	for i, p := range d.Phases {
		if !p.End.After(p.Start) {
			return fmt.Errorf("phase %q ends before it starts (%s to %s)", p.Name, p.Start, p.End)
		}
		if i > 0 && p.Start.Before(d.Phases[i-1].End) {
			return fmt.Errorf("phase %q starts before phase %q ends", p.Name, d.Phases[i-1].Name)
		}
	}
	for _, r := range []string{Admitted, Refused} {
		if len(d.Of(r)) == 0 {
			return fmt.Errorf("no %s series", r)
		}
	}
	for _, s := range d.Series {
		if len(s.Points) == 0 {
			return fmt.Errorf("%s series of pod %s has no points", s.Result, s.Pod)
		}
	}
	return nil
}

// Stacked returns the series of result, sorted by pod, each point raised by the same
// point of the pods before it, so that drawn top down with their areas filled they show
// each pod's share and the total. Series must have the same times (one query_range
// answer, one step); a pod missing a time counts 0 there.
func (d *Data) Stacked(result string) []Series {
	series := d.Of(result)
	var times []float64
	for _, s := range series {
		for _, p := range s.Points {
			if !slices.Contains(times, p.T) {
				times = append(times, p.T)
			}
		}
	}
	slices.Sort(times)
	below := make([]float64, len(times))
	out := make([]Series, len(series))
	for i, s := range series {
		at := make(map[float64]float64, len(s.Points))
		for _, p := range s.Points {
			at[p.T] = p.V
		}
		out[i] = Series{Result: s.Result, Pod: s.Pod, Query: s.Query, Points: make([]Point, len(times))}
		for j, t := range times {
			below[j] += at[t]
			out[i].Points[j] = Point{T: t, V: below[j]}
		}
	}
	return out
}

// Total is the sum of result over pods in phase p, from the instant queries.
func (p *Phase) Total(result string) float64 {
	m := p.Stats.Admitted
	if result == Refused {
		m = p.Stats.Refused
	}
	total := 0.0
	for _, v := range m {
		total += v
	}
	return total
}
