package decide

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync/atomic"

	"golang.org/x/time/rate"

	"github.com/redline-dev/redline/internal/keyscheme"
	"github.com/redline-dev/redline/internal/limiter"
	"github.com/redline-dev/redline/internal/sidecar/contract"
	"github.com/redline-dev/redline/internal/sidecar/ruleset"
)

// The decision log answers "why was this client refused?" from the sidecar's own log: one JSON
// line per decision it keeps, naming the policy, the rule, the key's hash (the one the policy's
// top keys show), what the limit said and where the decision came from. It is off unless asked
// for; it keeps the decisions of its mode (refusals only, or all), a sampled fraction of them,
// and at most a rate of lines per second over all of them, so a flood of refusals cannot flood
// the log: lines past the rate are counted (Dropped), not written. A key's readable value is
// written only for a rule whose topKeys is Values, the opt-in that lets values leave the
// sidecar at all; other lines carry the hash only.

// The decision log's modes.
const (
	DecisionLogOff     = contract.DecisionLogOff
	DecisionLogRefused = contract.DecisionLogRefused
	DecisionLogAll     = contract.DecisionLogAll
)

// DecisionLog writes sampled, rate-bounded decision lines. The zero value is not usable: see
// NewDecisionLog.
type DecisionLog struct {
	log     *slog.Logger
	all     bool
	sample  float64
	limit   *rate.Limiter
	dropped atomic.Int64
	// draw returns a number in [0, 1) for sampling (rand.Float64; tests fix it).
	draw func() float64
}

// NewDecisionLog returns the log of mode (DecisionLogOff: nil, no log) that keeps a sample
// fraction (0 < sample <= 1) of the decisions of its mode, at most perSecond lines a second
// (a burst of as many). Lines go to log at Info.
func NewDecisionLog(log *slog.Logger, mode string, sample, perSecond float64) (*DecisionLog, error) {
	switch mode {
	case "", DecisionLogOff:
		return nil, nil
	case DecisionLogRefused, DecisionLogAll:
	default:
		return nil, fmt.Errorf("decision log mode %q: want %s, %s or %s", mode, DecisionLogOff, DecisionLogRefused, DecisionLogAll)
	}
	if !(sample > 0 && sample <= 1) {
		return nil, fmt.Errorf("decision log sample %v: want a fraction in (0, 1]", sample)
	}
	if !(perSecond >= 1 && perSecond <= 10_000) {
		return nil, fmt.Errorf("decision log rate %v: want 1 to 10000 lines a second", perSecond)
	}
	return &DecisionLog{
		log: log, all: mode == DecisionLogAll, sample: sample,
		limit: rate.NewLimiter(rate.Limit(perSecond), int(perSecond)), draw: rand.Float64,
	}, nil
}

// Dropped is how many lines the rate bound kept out of the log.
func (l *DecisionLog) Dropped() int64 { return l.dropped.Load() }

// observe writes one decision's line, if its mode, the sample and the rate keep it. Candidates
// are not decisions of the request and are left out.
func (l *DecisionLog) observe(r *ruleset.Rule, key string, parts []string, res limiter.Result) {
	if r.CandidateOf != nil || !l.all && !res.OverLimit {
		return
	}
	if l.sample < 1 && l.draw() >= l.sample {
		return
	}
	if !l.limit.Allow() {
		l.dropped.Add(1)
		return
	}
	attrs := []slog.Attr{
		slog.String("policy", r.Policy.Name), slog.String("rule", r.Name), slog.String("key", keyscheme.Hash(key)),
		slog.Bool("refused", res.OverLimit && !r.Shadow), slog.Bool("overLimit", res.OverLimit),
		slog.Int64("remaining", res.Remaining), slog.Int64("retryAfterMs", res.RetryAfter.Milliseconds()),
		slog.String("source", res.Source.String()),
	}
	if r.Shadow {
		attrs = append(attrs, slog.Bool("shadow", true))
	}
	if r.ReportValues {
		attrs = append(attrs, slog.String("value", truncateValue(strings.Join(parts, " "))))
	}
	l.log.LogAttrs(context.Background(), slog.LevelInfo, "decision", attrs...)
}

// truncateValue cuts a key's readable value to what top keys show of it (64 bytes).
func truncateValue(s string) string {
	const most = 64
	if len(s) <= most {
		return s
	}
	return s[:most]
}
