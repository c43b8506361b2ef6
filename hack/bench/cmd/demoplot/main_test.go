package main

import (
	"encoding/json"
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redline-dev/redline/hack/demo/timeline"
)

func writeData(t *testing.T, d *timeline.Data) string {
	t.Helper()
	raw, err := json.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "demo.json")
	if err := os.WriteFile(path, raw, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestRunDrawsAPNG(t *testing.T) {
	began := time.Unix(1000, 0)
	d := &timeline.Data{Began: began, Step: time.Second, Prometheus: "2.42.0", Phases: []timeline.Phase{
		{Name: "baseline", Start: began.Add(2 * time.Second), End: began.Add(5 * time.Second),
			Stats: timeline.Stats{Admitted: map[string]float64{"p-a": 3}, Refused: map[string]float64{"p-a": 1}}},
		{Name: "Redis outage", Start: began.Add(5 * time.Second), End: began.Add(8 * time.Second)},
	}}
	for _, r := range []string{timeline.Admitted, timeline.Refused} {
		for _, pod := range []string{"p-b", "p-a"} {
			d.Series = append(d.Series, timeline.Series{Result: r, Pod: pod,
				Points: []timeline.Point{{T: 1, V: 0}, {T: 3, V: 2}, {T: 4, V: 1}, {T: 9, V: 0}}})
		}
	}
	out := filepath.Join(t.TempDir(), "demo.png")
	if err := run(writeData(t, d), out); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatalf("demo.png is not a PNG: %v", err)
	}
	if b := img.Bounds(); b.Dx() < 1000 || b.Dy() < 600 {
		t.Errorf("picture is %v, too small to read", b)
	}
}

func TestRunRefusesDataWithoutPhases(t *testing.T) {
	err := run(writeData(t, &timeline.Data{}), filepath.Join(t.TempDir(), "demo.png"))
	if err == nil || !strings.Contains(err.Error(), "no phases") {
		t.Fatalf("got %v", err)
	}
}
