package main

import (
	"testing"
	"time"

	"github.com/redline-dev/redline/internal/calendar"
	"github.com/redline-dev/redline/internal/limiter"
	"github.com/redline-dev/redline/internal/sidecar/ruleset"
)

// The explain table names each kind of limit as its policy does: per window, per calendar
// period in its zone, in flight with or without a queue, and the choice to let a request
// whose slot is lost finish.
func TestLimitText(t *testing.T) {
	month, err := calendar.New(calendar.Spec{Unit: calendar.Month, Zone: "Europe/Berlin"})
	if err != nil {
		t.Fatal(err)
	}
	day, err := calendar.New(calendar.Spec{Unit: calendar.Day})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		rule ruleset.Rule
		want string
	}{
		{ruleset.Rule{Limit: limiter.Limit{Algorithm: limiter.FixedWindow, Requests: 100, Window: time.Minute}}, "100/1m0s FixedWindow"},
		{ruleset.Rule{Limit: limiter.Limit{Algorithm: limiter.FixedWindow, Requests: 5000, Window: month.MaxLength(), Calendar: month}}, "5000/Month Europe/Berlin"},
		{ruleset.Rule{Limit: limiter.Limit{Algorithm: limiter.FixedWindow, Requests: 10, Window: day.MaxLength(), Calendar: day}}, "10/Day UTC"},
		{ruleset.Rule{InFlight: &limiter.InFlight{Max: 8}}, "8 in flight"},
		{ruleset.Rule{InFlight: &limiter.InFlight{Max: 8}, Queue: &ruleset.Queue{Size: 4, Timeout: 30 * time.Second}}, "8 in flight, queue 4 for 30s"},
		{ruleset.Rule{InFlight: &limiter.InFlight{Max: 2}, Queue: &ruleset.Queue{Size: 1, Timeout: 1500 * time.Millisecond}}, "2 in flight, queue 1 for 1.5s"},
		{ruleset.Rule{InFlight: &limiter.InFlight{Max: 8}, LetFinish: true}, "8 in flight, onSlotLost: Finish"},
		{ruleset.Rule{InFlight: &limiter.InFlight{Max: 8}, Queue: &ruleset.Queue{Size: 4, Timeout: 30 * time.Second}, LetFinish: true}, "8 in flight, queue 4 for 30s, onSlotLost: Finish"},
	} {
		if got := limitText(&tc.rule); got != tc.want {
			t.Errorf("limitText = %q, want %q", got, tc.want)
		}
	}
}
