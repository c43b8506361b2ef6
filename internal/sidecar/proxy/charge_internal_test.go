package proxy

import (
	"testing"

	"github.com/redline-dev/redline/internal/sidecar/meter"
	"github.com/redline-dev/redline/internal/tokens"
)

// TestChargeCountsWhatPassed: a whole response's report counts as it is; one that reported
// nothing, or was cut after a partial report, is charged at least its input and the text
// that passed through it; with nothing reported and nothing streamed, onError decides.
func TestChargeCountsWhatPassed(t *testing.T) {
	b := &budget{prompt: 10}
	for _, tt := range []struct {
		name  string
		o     meter.Outcome
		used  int64
		known bool
	}{
		{"whole report", meter.Outcome{Usage: tokens.Usage{Input: 10, Output: 20}, Found: true, Complete: true, Streamed: 500}, 30, true},
		{"cost header", meter.Outcome{Usage: tokens.Usage{Total: 7}, Found: true, FromHeader: true, Streamed: 500}, 7, true},
		{"no report, streamed", meter.Outcome{Complete: true, Streamed: 5000}, 5010, true},
		{"cut after message_start", meter.Outcome{Usage: tokens.Usage{Input: 40, Output: 1}, Found: true, Streamed: 150}, 190, true},
		{"cut, report above the stream", meter.Outcome{Usage: tokens.Usage{Input: 40, Output: 900}, Found: true, Streamed: 150}, 940, true},
		{"nothing at all", meter.Outcome{}, 0, false},
	} {
		used, known := b.charge(tt.o)
		if used != tt.used || known != tt.known {
			t.Errorf("%s: charge = %d, %v; want %d, %v", tt.name, used, known, tt.used, tt.known)
		}
	}
}
