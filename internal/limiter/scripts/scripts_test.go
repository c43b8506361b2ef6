package scripts_test

import (
	"context"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"github.com/redis/go-redis/v9"

	"github.com/redline-dev/redline/internal/limiter"
	"github.com/redline-dev/redline/internal/limiter/scripts"
	"github.com/redline-dev/redline/internal/redisconn"
	"github.com/redline-dev/redline/internal/testutil/redistest/redisclient"
)

var echo = scripts.New("Echo", "return {tonumber(ARGV[1]), #KEYS}")

func evals(ctx context.Context, n int) []redis.Cmder {
	cmds := make([]redis.Cmder, n)
	for i := range cmds {
		cmds[i] = scripts.EvalSha(ctx, echo, []string{"k"}, i)
	}
	return cmds
}

func results(g *WithT, cmds []redis.Cmder) []any {
	out := make([]any, len(cmds))
	for i, c := range cmds {
		v, err := c.(*redis.Cmd).Slice()
		g.Expect(err).NotTo(HaveOccurred())
		out[i] = v
	}
	return out
}

// A script Redis does not hold is loaded once and every command that met NOSCRIPT runs again.
func TestExecLoadsAfterNoScript(t *testing.T) {
	g := NewWithT(t)
	c := redisclient.Fresh(t, redisconn.Options{})
	ctx := context.Background()
	for _, n := range []int{1, 3} {
		g.Expect(c.ScriptFlush(ctx).Err()).To(Succeed())
		cmds := evals(ctx, n)
		got := scripts.Exec(ctx, c, cmds, []scripts.Script{echo})
		g.Expect(got).To(Equal(scripts.Counts{RoundTrips: 2, Loads: 1}), "%d commands", n)
		want := make([]any, n)
		for i := range want {
			want[i] = []any{int64(i), int64(1)}
		}
		g.Expect(results(g, cmds)).To(Equal(want))

		cmds = evals(ctx, n)
		g.Expect(scripts.Exec(ctx, c, cmds, []scripts.Script{echo})).To(Equal(scripts.Counts{RoundTrips: 1}), "loaded scripts cost one round trip")
		g.Expect(results(g, cmds)).To(Equal(want))
	}
}

// flushAfterLoad flushes the scripts right after every SCRIPT LOAD, the race a flush loop in
// production can hit between the load and the retry.
type flushAfterLoad struct{ admin redis.UniversalClient }

func (h flushAfterLoad) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h flushAfterLoad) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if cmd.Name() == "script" {
			_ = h.admin.ScriptFlush(ctx).Err()
		}
		return err
	}
}
func (h flushAfterLoad) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// Scripts flushed again between the load and the retry: the body goes with EVAL, the command
// keeps its type, and nothing fails.
func TestExecEvalsWhenFlushedAgain(t *testing.T) {
	g := NewWithT(t)
	c := redisclient.Fresh(t, redisconn.Options{})
	ctx := context.Background()
	admin, err := redisconn.NewClient("redis://"+c.(*redis.Client).Options().Addr, redisconn.Options{ReadTimeout: 5 * time.Second})
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { _ = admin.Close() })
	c.AddHook(flushAfterLoad{admin: admin})

	cmds := evals(ctx, 2)
	got := scripts.Exec(ctx, c, cmds, []scripts.Script{echo})
	g.Expect(got).To(Equal(scripts.Counts{RoundTrips: 3, Loads: 1}))
	g.Expect(cmds[0].Name()).To(Equal("eval"))
	g.Expect(results(g, cmds)).To(Equal([]any{[]any{int64(0), int64(1)}, []any{int64(1), int64(1)}}))
	g.Expect(c.ScriptExists(ctx, echo.SHA).Val()).To(Equal([]bool{true}), "EVAL cached the script again")
}

// A command whose script Exec was not given cannot be healed: it fails, saying so.
func TestExecUnknownScript(t *testing.T) {
	g := NewWithT(t)
	c := redisclient.Fresh(t, redisconn.Options{})
	ctx := context.Background()
	cmds := evals(ctx, 1)
	g.Expect(scripts.Exec(ctx, c, cmds, nil)).To(Equal(scripts.Counts{RoundTrips: 1}))
	g.Expect(cmds[0].Err()).To(MatchError(ContainSubstring("no source")))
}

// Load puts every algorithm's script into Redis under the SHA the limiter sends; Missing sees
// what a flush took away.
func TestLoadAndMissing(t *testing.T) {
	g := NewWithT(t)
	c := redisclient.Fresh(t, redisconn.Options{})
	ctx := context.Background()
	g.Expect(scripts.Missing(ctx, c)).To(HaveLen(len(limiter.Algorithms)))
	shas, err := scripts.Load(ctx, c)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(shas).To(HaveLen(len(limiter.Algorithms)))
	for _, alg := range limiter.Algorithms {
		s, ok := scripts.For(string(alg))
		g.Expect(ok).To(BeTrue(), "a script for %s", alg)
		g.Expect(shas).To(HaveKeyWithValue(string(alg), s.SHA))
	}
	g.Expect(scripts.Missing(ctx, c)).To(BeEmpty())
	g.Expect(c.ScriptFlush(ctx).Err()).To(Succeed())
	g.Expect(scripts.Missing(ctx, c)).To(Equal([]string{"FixedWindow", "SlidingWindowCounter", "SlidingWindowLog", "TokenBucket"}))
}

// The window state's scripts carry the shares' opening and closing inline, once each, and no
// include line reaches Redis.
func TestScriptsIncludeTheirFragments(t *testing.T) {
	g := NewWithT(t)
	window := []scripts.Script{scripts.LeaseReturn(), scripts.HoldSettle()}
	for _, name := range []string{"FixedWindow", "SlidingWindowCounter"} {
		s, ok := scripts.For(name)
		g.Expect(ok).To(BeTrue(), name)
		window = append(window, s)
	}
	for _, s := range window {
		g.Expect(s.Source).NotTo(ContainSubstring("--!include"), s.Name)
		g.Expect(strings.Count(s.Source, "local TAGS = 4096")).To(Equal(1), "%s opens the shares once", s.Name)
		g.Expect(strings.Count(s.Source, "if add ~= 0 or restored ~= 0 or hold_changed or carry ~= 0 then")).To(Equal(1), "%s closes them once", s.Name)
	}
	for _, name := range []string{"SlidingWindowLog", "TokenBucket"} {
		s, _ := scripts.For(name)
		g.Expect(s.Source).NotTo(ContainSubstring("TAGS"), "%s keeps no shares", name)
	}
	// Every reserving script bounds its key's open holds once, and every settle and reserve
	// sweeps once.
	for _, s := range scripts.All() {
		g.Expect(s.Source).NotTo(ContainSubstring("--!include"), s.Name)
		g.Expect(strings.Count(s.Source, "local hb_retry, hb_open = 0, 0")).To(Equal(1), "%s bounds its open holds once", s.Name)
		g.Expect(strings.Count(s.Source, "local hs_recs = ")).To(Equal(1), "%s sweeps once", s.Name)
	}
	// A calendar window's decision, reserve and settle keep its periods' shares, opened and
	// closed once each.
	for _, s := range []scripts.Script{scripts.CalendarWindow(), scripts.CalendarReserve(), scripts.CalendarSettle()} {
		g.Expect(s.Source).NotTo(ContainSubstring("--!include"), s.Name)
		g.Expect(strings.Count(s.Source, "local hold_changed, marked, held, fresh, stamp = ")).To(Equal(1), "%s opens the shares once", s.Name)
		g.Expect(strings.Count(s.Source, "if add + restored ~= 0 then")).To(Equal(1), "%s closes them once", s.Name)
	}
	for _, s := range []scripts.Script{scripts.HoldSettle(), scripts.HoldSettleTokenBucket(), scripts.HoldSettleSlidingWindowLog()} {
		g.Expect(s.Source).NotTo(ContainSubstring("--!include"), s.Name)
		g.Expect(strings.Count(s.Source, "local hs_recs = ")).To(Equal(1), "%s sweeps once", s.Name)
		g.Expect(s.Source).NotTo(ContainSubstring("hb_retry"), "%s grants nothing to bound", s.Name)
	}
}
