package decide

import (
	"testing"
	"time"

	"github.com/redline-dev/redline/internal/limiter"
	"github.com/redline-dev/redline/internal/sidecar/ruleset"
)

func costRule(alg limiter.Algorithm, requests, burst int64, c ruleset.Cost) *ruleset.Rule {
	return &ruleset.Rule{Limit: limiter.Limit{Algorithm: alg, Requests: requests, Burst: burst, Window: time.Minute}, Cost: &c}
}

func TestReserveBounds(t *testing.T) {
	c := ruleset.Cost{DefaultHold: 500, MinOutput: 16, Timeout: time.Minute}
	fw := costRule(limiter.FixedWindow, 10_000, 0, c)
	tb := costRule(limiter.TokenBucket, 10_000, 2_000, c)
	small := costRule(limiter.FixedWindow, 100, 0, c)
	for _, tc := range []struct {
		name   string
		rule   *ruleset.Rule
		need   Need
		lo, hi int64
	}{
		{"unsized holds the default hold", fw, Need{}, 500, 500},
		{"unsized holds at most the capacity", small, Need{}, 100, 100},
		{"a cap: prompt plus cap", fw, Need{Sized: true, Prompt: 100, Output: 400}, 116, 500},
		{"no cap: all the limit can give", fw, Need{Sized: true, Prompt: 100}, 116, 10_000},
		{"no cap on a bucket: its burst", tb, Need{Sized: true, Prompt: 100}, 116, 2_000},
		{"a cap over the capacity", fw, Need{Sized: true, Prompt: 100, Output: 1 << 40}, 116, 10_000},
		{"a minimum over the capacity stays: the limiter refuses it as never admissible", small, Need{Sized: true, Prompt: 1_000}, 1_016, 1_016},
		{"a prompt that would wrap saturates", fw, Need{Sized: true, Prompt: 1<<63 - 1, Output: 1 << 62}, 1<<63 - 1, 1<<63 - 1},
		{"an empty prompt with no minimum output still holds one", costRule(limiter.FixedWindow, 10, 0, ruleset.Cost{DefaultHold: 1}), Need{Sized: true}, 1, 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lo, hi := bounds(tc.rule, tc.need)
			if lo != tc.lo || hi != tc.hi {
				t.Fatalf("bounds = [%d, %d], want [%d, %d]", lo, hi, tc.lo, tc.hi)
			}
		})
	}
}

func TestSettledCost(t *testing.T) {
	used := &ruleset.Cost{}
	zero := &ruleset.Cost{ZeroOnError: true}
	for _, tc := range []struct {
		name          string
		c             *ruleset.Cost
		used          int64
		known, failed bool
		want          int64
	}{
		{"known usage", used, 300, true, false, 300},
		{"known usage of a failed request, OnError Used", used, 120, true, true, 120},
		{"unknown usage of a failed request, OnError Used: the whole hold", used, 0, false, true, 1000},
		{"a failed request, OnError Zero", zero, 120, true, true, 0},
		{"a response that ended without its cost: the whole hold", zero, 0, false, false, 1000},
		{"a negative usage is none", used, -5, true, false, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := settledCost(tc.c, 1000, tc.used, tc.known, tc.failed); got != tc.want {
				t.Fatalf("settledCost = %d, want %d", got, tc.want)
			}
		})
	}
}
