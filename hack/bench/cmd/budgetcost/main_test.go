package main

import (
	"bufio"
	"strings"
	"testing"
	"time"

	"github.com/redline-dev/redline/internal/tokens"
)

func TestPercentileIsNearestRank(t *testing.T) {
	var d []time.Duration
	for i := 100; i >= 1; i-- { // unsorted on purpose
		d = append(d, time.Duration(i))
	}
	for _, c := range []struct {
		q    float64
		want time.Duration
	}{{0.5, 50}, {0.99, 99}, {1, 100}, {0.001, 1}} {
		if got := percentile(d, c.q); got != c.want {
			t.Errorf("percentile(1..100, %v) = %v, want %v", c.q, got, c.want)
		}
	}
	if got := percentile([]time.Duration{7}, 0.99); got != 7 {
		t.Errorf("percentile of one value = %v, want it", got)
	}
	if d[0] != 100 {
		t.Error("percentile sorted its argument in place")
	}
}

func TestMedian(t *testing.T) {
	for _, c := range []struct {
		in   []float64
		want float64
	}{{[]float64{3, 1, 2}, 2}, {[]float64{4, 1, 3, 2}, 2.5}, {[]float64{7}, 7}} {
		if got := median(c.in); got != c.want {
			t.Errorf("median(%v) = %v, want %v", c.in, got, c.want)
		}
	}
}

// The settles counted are the labelled series asked for, summed; other metrics whose name
// starts the same, and comments, are not.
func TestSumSamples(t *testing.T) {
	text := `# HELP redline_sidecar_hold_settles_total x
redline_sidecar_hold_settles_total{policy="budget",result="settled",rule="tokens"} 12
redline_sidecar_hold_settles_total{policy="budget",result="failed",rule="tokens"} 5
redline_sidecar_hold_settles_total{policy="other",result="settled",rule="tokens"} 3
redline_sidecar_hold_settles_total_extra 100
go_goroutines 42
`
	sum := func(name, match string) float64 {
		v, err := sumSamples(bufio.NewScanner(strings.NewReader(text)), name, match)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	if got := sum("redline_sidecar_hold_settles_total", `result="settled"`); got != 15 {
		t.Errorf("settled = %v, want 15", got)
	}
	if got := sum("redline_sidecar_hold_settles_total", ""); got != 20 {
		t.Errorf("all settles = %v, want 20", got)
	}
	if got := sum("go_goroutines", ""); got != 42 {
		t.Errorf("go_goroutines = %v, want 42", got)
	}
	if got := sum("absent", ""); got != 0 {
		t.Errorf("absent = %v, want 0", got)
	}
}

// The latency section's bodies are the sizes it reports, and requests the budget path sizes
// (a body ScanRequest refused would hold the default and skip the work measured).
func TestLatencyBodiesAreTheirSizeAndSized(t *testing.T) {
	for _, size := range bodySizes {
		_, body := latencyCall(size)
		if len(body) != size {
			t.Errorf("body of %d bytes for size %d", len(body), size)
		}
		req, err := tokens.ScanRequest(body, tokens.OpenAIChat, false)
		if err != nil {
			t.Fatalf("ScanRequest of the %d-byte body: %v", size, err)
		}
		if req.OutputCap != 16 || req.PromptTokens < int64(size/8) {
			t.Errorf("size %d: sized as %+v", size, req)
		}
	}
}
