package decide

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/redline-dev/redline/internal/keyscheme"
	"github.com/redline-dev/redline/internal/limiter"
	"github.com/redline-dev/redline/internal/sidecar/ruleset"
)

func logLines(t *testing.T, buf *bytes.Buffer) []map[string]any {
	t.Helper()
	var out []map[string]any
	for line := range strings.SplitSeq(strings.TrimSpace(buf.String()), "\n") {
		if line == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("not a JSON line: %q", line)
		}
		out = append(out, m)
	}
	return out
}

func TestDecisionLogKeepsItsModeAndNeverAValueWithoutTheOptIn(t *testing.T) {
	g := NewWithT(t)
	var buf bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&buf, nil))
	pol := &ruleset.Policy{Name: "checkout"}
	hashed := &ruleset.Rule{Policy: pol, Name: "per-key"}
	valued := &ruleset.Rule{Policy: pol, Name: "per-ip", ReportValues: true}
	shadow := &ruleset.Rule{Policy: pol, Name: "trial", Shadow: true}
	candidate := &ruleset.Rule{Policy: pol, Name: "per-key", CandidateOf: hashed, Shadow: true}
	key := keyscheme.Key("ns", "checkout", "per-key", "secret-key")
	refused := limiter.Result{OverLimit: true, RetryAfter: 1500 * time.Millisecond, Source: limiter.SourceRedis}
	admitted := limiter.Result{Allowed: true, Remaining: 4, Source: limiter.SourceLease}

	l, err := NewDecisionLog(log, DecisionLogRefused, 1, 100)
	g.Expect(err).NotTo(HaveOccurred())
	l.observe(hashed, key, []string{"secret-key"}, admitted)
	l.observe(hashed, key, []string{"secret-key"}, refused)
	l.observe(valued, key, []string{"10.0.0.7"}, refused)
	l.observe(shadow, key, []string{"secret-key"}, limiter.Result{Allowed: true, OverLimit: true, Source: limiter.SourceRedis})
	l.observe(candidate, key, []string{"secret-key"}, refused)
	lines := logLines(t, &buf)
	g.Expect(lines).To(HaveLen(3), "refusals only, and no candidate:\n%s", buf.String())
	g.Expect(lines[0]).To(Equal(map[string]any{
		"time": lines[0]["time"], "level": "INFO", "msg": "decision", "policy": "checkout", "rule": "per-key",
		"key": keyscheme.Hash(key), "refused": true, "overLimit": true, "remaining": 0.0, "retryAfterMs": 1500.0, "source": "redis",
	}))
	g.Expect(lines[1]).To(HaveKeyWithValue("value", "10.0.0.7"), "the rule opts in")
	g.Expect(lines[2]).To(And(HaveKeyWithValue("shadow", true), HaveKeyWithValue("refused", false), HaveKeyWithValue("overLimit", true)))
	g.Expect(buf.String()).NotTo(ContainSubstring("secret-key"))

	buf.Reset()
	all, err := NewDecisionLog(log, DecisionLogAll, 1, 100)
	g.Expect(err).NotTo(HaveOccurred())
	all.observe(hashed, key, nil, admitted)
	g.Expect(logLines(t, &buf)).To(ConsistOf(And(HaveKeyWithValue("refused", false), HaveKeyWithValue("source", "lease"), HaveKeyWithValue("remaining", 4.0))))
}

func TestDecisionLogIsSampledAndRateBounded(t *testing.T) {
	g := NewWithT(t)
	var buf bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&buf, nil))
	r := &ruleset.Rule{Policy: &ruleset.Policy{Name: "p"}, Name: "r"}
	refused := limiter.Result{OverLimit: true}

	l, err := NewDecisionLog(log, DecisionLogRefused, 1, 5)
	g.Expect(err).NotTo(HaveOccurred())
	for range 1000 {
		l.observe(r, "k", nil, refused)
	}
	n := len(logLines(t, &buf))
	g.Expect(n).To(BeNumerically(">=", 5), "the burst")
	g.Expect(int64(n)+l.Dropped()).To(Equal(int64(1000)), "every line past the rate is counted")
	g.Expect(l.Dropped()).To(BeNumerically(">=", 900))

	buf.Reset()
	half, err := NewDecisionLog(log, DecisionLogRefused, 0.5, 10_000)
	g.Expect(err).NotTo(HaveOccurred())
	draws := []float64{0.1, 0.7, 0.49, 0.5, 0.99, 0.0}
	half.draw = func() float64 { d := draws[0]; draws = draws[1:]; return d }
	for range 6 {
		half.observe(r, "k", nil, refused)
	}
	g.Expect(logLines(t, &buf)).To(HaveLen(3), "draws under the sample: 0.1, 0.49, 0.0")
	g.Expect(half.Dropped()).To(BeZero(), "a sampled-out line is not a dropped one")
}

func TestDecisionLogRefusesSettingsItCannotKeep(t *testing.T) {
	g := NewWithT(t)
	off, err := NewDecisionLog(slog.Default(), DecisionLogOff, 1, 10)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(off).To(BeNil())
	for _, c := range []struct {
		mode         string
		sample, rate float64
		want         string
	}{
		{"everything", 1, 10, `mode "everything"`},
		{DecisionLogAll, 0, 10, "sample 0"},
		{DecisionLogAll, 1.5, 10, "sample 1.5"},
		{DecisionLogAll, 1, 0, "rate 0"},
		{DecisionLogAll, 1, 1e6, "rate 1e+06"},
	} {
		_, err := NewDecisionLog(slog.Default(), c.mode, c.sample, c.rate)
		g.Expect(err).To(MatchError(ContainSubstring(c.want)), "%+v", c)
	}
}
