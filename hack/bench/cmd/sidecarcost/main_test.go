package main

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/redline-dev/redline/internal/redisacl"
)

// TestPrintScriptsReadsTheTreesOwnScripts runs the printer in the working tree through the
// overlay, as the command does for both trees, and expects exactly what the manager loads for
// sidecars: a base whose scripts were read wrongly would be measured on NOSCRIPT fallbacks.
func TestPrintScriptsReadsTheTreesOwnScripts(t *testing.T) {
	root, err := filepath.Abs("../../../..")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	got, err := printScripts(ctx, root, t.TempDir())
	if err != nil {
		t.Fatalf("printScripts: %v", err)
	}
	want := redisacl.SidecarScripts()
	if len(got) != len(want) {
		t.Fatalf("printed %d scripts, the manager loads %d", len(got), len(want))
	}
	for i, s := range want {
		if got[i].Name != s.Name || got[i].Source != s.Source {
			t.Errorf("script %d: printed %q (%d bytes), want %q (%d bytes)", i, got[i].Name, len(got[i].Source), s.Name, len(s.Source))
		}
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
