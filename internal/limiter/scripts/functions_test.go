package scripts_test

// Redis Functions (FUNCTION LOAD + FCALL, Redis 7) against the scripts (SCRIPT LOAD + EVALSHA)
// for the two window algorithms, on a real redis-server: the facts the decision to keep
// EVALSHA rests on (docs/design/failover-shares.md, issue 25), held by tests, and the cost per
// call side by side:
//
//	go test ./internal/limiter/scripts -run Functions -bench ScriptVsFunction -benchtime 20000x -count 5
//
// The library is the limiter's own script sources, each wrapped as a function taking KEYS and
// ARGV: what a switch would load, not a rewrite.

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"github.com/redis/go-redis/v9"

	"github.com/redline-dev/redline/internal/limiter/scripts"
	"github.com/redline-dev/redline/internal/redisacl"
	"github.com/redline-dev/redline/internal/testutil/redistest"
)

// windowAlgorithms are the scripts compared, with the function name each gets in the library.
var windowAlgorithms = []struct{ name, function string }{
	{"FixedWindow", "redline_fixed_window"},
	{"SlidingWindowCounter", "redline_sliding_window_counter"},
}

const functionLibrary = "redline_bench"

// librarySource wraps every window script as a function of the library: the chunk becomes the
// body of a function whose parameters are named KEYS and ARGV, as the scripts read them.
func librarySource(t testing.TB) string {
	var b strings.Builder
	b.WriteString("#!lua name=" + functionLibrary + "\n")
	for _, a := range windowAlgorithms {
		s, ok := scripts.For(a.name)
		if !ok {
			t.Fatalf("no script %s", a.name)
		}
		fmt.Fprintf(&b, "local function %s(KEYS, ARGV)\n%s\nend\nredis.register_function('%[1]s', %[1]s)\n", a.function, s.Source)
	}
	return b.String()
}

// windowArgs are one grant's arguments as the limiter sends them: a limit no benchmark reaches,
// a one-minute window, cost and lease of one, no deadline, a replica id keeping its share, no
// known shares yet, no hold.
func windowArgs() []any {
	return []any{1_000_000_000, 60_000, 1, 0, 1, "bench001", 0, 0, 0, 0, 0}
}

func benchKey(i int) string { return fmt.Sprintf("rl:{bench/p/r/%d}:swc", i) }

func adminClient(addr string) *redis.Client {
	return redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, PoolSize: 16})
}

// A function of the library answers exactly as its script does, call after call, on keys of
// the same state: the comparison below is of the same work.
func TestFunctionsAnswerAsTheScripts(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	srv, err := redistest.Start()
	g.Expect(err).NotTo(HaveOccurred(), "the test needs redis-server 7")
	t.Cleanup(func() { _ = srv.Close() })
	c := adminClient(srv.Addr())
	t.Cleanup(func() { _ = c.Close() })
	g.Expect(c.FunctionLoad(ctx, librarySource(t)).Err()).To(Succeed())
	for _, a := range windowAlgorithms {
		s, _ := scripts.For(a.name)
		g.Expect(c.ScriptLoad(ctx, s.Source).Err()).To(Succeed())
		for i := range 5 {
			args := windowArgs()
			args[0] = 3 // a limit of 3: the fourth call is refused by both
			viaScript, err := c.EvalSha(ctx, s.SHA, []string{benchKey(1000 + i)}, args...).Slice()
			g.Expect(err).NotTo(HaveOccurred())
			viaFunction, err := c.FCall(ctx, a.function, []string{benchKey(2000 + i)}, args...).Slice()
			g.Expect(err).NotTo(HaveOccurred())
			// {allowed, remaining, retry_after_ms, reset_after_ms, now_us, granted, restored}:
			// the two ms fields and Redis's clock differ between two calls; the decision does not.
			g.Expect(viaFunction).To(HaveLen(len(viaScript)))
			for _, j := range []int{0, 1, 5, 6} {
				g.Expect(viaFunction[j]).To(Equal(viaScript[j]), "%s, call %d, field %d", a.name, i, j)
			}
		}
	}
}

// What Redis does with each across a failover and a restart. A replica holds the functions its
// master loaded (FUNCTION LOAD is replicated), so a promoted replica answers FCALL at once; it
// holds none of its master's scripts (SCRIPT LOAD is not replicated), which is why the manager
// loads them on every node. A restart keeps the functions only where Redis persists (an RDB or
// AOF), and the scripts never; without persistence both are gone.
func TestFunctionsReplicateAndPersistScriptsDoNot(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	master, err := redistest.Start()
	g.Expect(err).NotTo(HaveOccurred(), "the test needs redis-server 7")
	t.Cleanup(func() { _ = master.Close() })
	replica, err := redistest.Start("--replicaof", "127.0.0.1", strconv.Itoa(master.Port))
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { _ = replica.Close() })
	mc, rc := adminClient(master.Addr()), adminClient(replica.Addr())
	t.Cleanup(func() { _ = mc.Close(); _ = rc.Close() })
	fw, _ := scripts.For("FixedWindow")

	g.Expect(mc.FunctionLoad(ctx, librarySource(t)).Err()).To(Succeed())
	g.Expect(mc.ScriptLoad(ctx, fw.Source).Err()).To(Succeed())
	g.Eventually(func() ([]redis.Library, error) {
		return rc.FunctionList(ctx, redis.FunctionListQuery{LibraryNamePattern: functionLibrary}).Result()
	}).WithTimeout(10*time.Second).Should(HaveLen(1), "FUNCTION LOAD reaches the replica")
	g.Expect(rc.ScriptExists(ctx, fw.SHA).Val()).To(Equal([]bool{false}), "SCRIPT LOAD does not reach the replica")

	// A failover: the replica promoted answers FCALL, and NOSCRIPT to EVALSHA.
	g.Expect(rc.Do(ctx, "REPLICAOF", "NO", "ONE").Err()).To(Succeed())
	g.Expect(rc.FCall(ctx, windowAlgorithms[0].function, []string{benchKey(1)}, windowArgs()...).Err()).To(Succeed())
	g.Expect(rc.EvalSha(ctx, fw.SHA, []string{benchKey(1)}, windowArgs()...).Err()).To(MatchError(ContainSubstring("NOSCRIPT")))

	// A restart with an RDB keeps the functions, not the scripts.
	// SAVE is refused while the replica's full sync has a background save running.
	g.Eventually(func() error { return mc.Do(ctx, "SAVE").Err() }).WithTimeout(30 * time.Second).Should(Succeed())
	g.Expect(master.Stop()).To(Succeed())
	g.Expect(master.Start()).To(Succeed())
	g.Expect(mc.FunctionList(ctx, redis.FunctionListQuery{LibraryNamePattern: functionLibrary}).Val()).To(HaveLen(1))
	g.Expect(mc.ScriptExists(ctx, fw.SHA).Val()).To(Equal([]bool{false}))

	// Without persistence (redistest's servers save nothing unless told, and this one was
	// never a replica, which keeps the RDB of its full sync on disk), a restart loses both.
	plain, err := redistest.Start()
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { _ = plain.Close() })
	pc := adminClient(plain.Addr())
	t.Cleanup(func() { _ = pc.Close() })
	g.Expect(pc.FunctionLoad(ctx, librarySource(t)).Err()).To(Succeed())
	g.Expect(plain.Stop()).To(Succeed())
	g.Expect(plain.Start()).To(Succeed())
	g.Expect(pc.FunctionList(ctx, redis.FunctionListQuery{LibraryNamePattern: functionLibrary}).Val()).To(BeEmpty())
}

// ACL can grant FCALL without FUNCTION, as it grants EVALSHA without SCRIPT and EVAL: a
// namespace's user could call the library and never load, replace or delete one. Like EVALSHA
// of any SHA, FCALL reaches every function loaded: ACL cannot tell function names apart.
func TestFunctionsFCallWithoutFunctionLoad(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	srv, err := redistest.Start()
	g.Expect(err).NotTo(HaveOccurred(), "the test needs redis-server 7")
	t.Cleanup(func() { _ = srv.Close() })
	admin := adminClient(srv.Addr())
	t.Cleanup(func() { _ = admin.Close() })
	g.Expect(admin.FunctionLoad(ctx, librarySource(t)).Err()).To(Succeed())
	// A namespace's grant (package redisacl), on the tenant's keys only, with FCALL in place of
	// EVALSHA.
	cmds, err := redisacl.Commands()
	g.Expect(err).NotTo(HaveOccurred())
	setuser := []any{"ACL", "SETUSER", "tenant", "reset", "on", ">pw", "~rl:{bench/*", "+fcall"}
	for _, cmd := range cmds {
		if cmd != "evalsha" {
			setuser = append(setuser, "+"+cmd)
		}
	}
	g.Expect(admin.Do(ctx, setuser...).Err()).To(Succeed())
	tenant := redis.NewClient(&redis.Options{Addr: srv.Addr(), Username: "tenant", Password: "pw", MaxRetries: -1})
	t.Cleanup(func() { _ = tenant.Close() })
	for _, a := range windowAlgorithms {
		g.Expect(tenant.FCall(ctx, a.function, []string{benchKey(7)}, windowArgs()...).Err()).To(Succeed(), a.function)
	}
	g.Expect(tenant.FCall(ctx, windowAlgorithms[0].function, []string{"rl:{other/p/r/1}:swc"}, windowArgs()...).Err()).
		To(MatchError(ContainSubstring("NOPERM")), "another namespace's key")
	for _, cmd := range [][]any{
		{"function", "load", "replace", librarySource(t)},
		{"function", "delete", functionLibrary},
		{"function", "flush"},
		{"function", "list"},
		{"function", "dump"},
		{"eval", "return 1", 0},
	} {
		g.Expect(tenant.Do(ctx, cmd...).Err()).To(MatchError(ContainSubstring("NOPERM")), "%v", cmd[:2])
	}
}

// BenchmarkScriptVsFunction runs one grant per operation on 1,000 keys of a one-minute window,
// by EVALSHA of the script and by FCALL of the same code loaded as a function: one caller (the
// round trip, ns/op) and 16 (throughput, calls/s), and what Redis spent per call (INFO
// commandstats usec_per_call of evalsha or fcall, as redis-us/call).
func BenchmarkScriptVsFunction(b *testing.B) {
	ctx := context.Background()
	srv, err := redistest.Start()
	if err != nil {
		b.Fatal("the benchmark needs redis-server 7: ", err)
	}
	b.Cleanup(func() { _ = srv.Close() })
	c := adminClient(srv.Addr())
	b.Cleanup(func() { _ = c.Close() })
	if err := c.FunctionLoad(ctx, librarySource(b)).Err(); err != nil {
		b.Fatal(err)
	}
	for _, a := range windowAlgorithms {
		s, _ := scripts.For(a.name)
		if err := c.ScriptLoad(ctx, s.Source).Err(); err != nil {
			b.Fatal(err)
		}
		calls := []struct {
			name, stat string
			do         func(key string) error
		}{
			{"EVALSHA", "evalsha", func(key string) error { return c.EvalSha(ctx, s.SHA, []string{key}, windowArgs()...).Err() }},
			{"FCALL", "fcall", func(key string) error { return c.FCall(ctx, a.function, []string{key}, windowArgs()...).Err() }},
		}
		for _, callers := range []int{1, 16} {
			for _, call := range calls {
				b.Run(fmt.Sprintf("alg=%s/callers=%d/call=%s", a.name, callers, call.name), func(b *testing.B) {
					if err := c.ConfigResetStat(ctx).Err(); err != nil {
						b.Fatal(err)
					}
					var next atomic.Int64
					b.ResetTimer()
					start := time.Now()
					if callers == 1 {
						for i := range b.N {
							if err := call.do(benchKey(i % 1000)); err != nil {
								b.Fatal(err)
							}
						}
					} else {
						b.SetParallelism(callers) // GOMAXPROCS x callers goroutines; 16 connections bound them
						b.RunParallel(func(pb *testing.PB) {
							for pb.Next() {
								if err := call.do(benchKey(int(next.Add(1) % 1000))); err != nil {
									b.Error(err)
									return
								}
							}
						})
					}
					elapsed := time.Since(start)
					b.StopTimer()
					b.ReportMetric(float64(b.N)/elapsed.Seconds(), "calls/s")
					if us, ok := usecPerCall(ctx, c, call.stat); ok {
						b.ReportMetric(us, "redis-us/call")
					}
				})
			}
		}
	}
}

// usecPerCall reads usec_per_call of cmd from INFO commandstats.
func usecPerCall(ctx context.Context, c *redis.Client, cmd string) (float64, bool) {
	info, err := c.Info(ctx, "commandstats").Result()
	if err != nil {
		return 0, false
	}
	for line := range strings.SplitSeq(info, "\n") {
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_"+cmd+":")
		if !ok {
			continue
		}
		for f := range strings.SplitSeq(rest, ",") {
			if v, ok := strings.CutPrefix(f, "usec_per_call="); ok {
				us, err := strconv.ParseFloat(v, 64)
				return us, err == nil
			}
		}
	}
	return 0, false
}
