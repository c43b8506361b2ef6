package redisacl_test

import (
	"context"
	_ "embed"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redline-dev/redline/internal/fleet"
	"github.com/redline-dev/redline/internal/keyscheme"
	"github.com/redline-dev/redline/internal/limiter/scripts"
	"github.com/redline-dev/redline/internal/redisacl"
)

// A tenant's user may EVALSHA every script in Redis's cache (ACL cannot tell SHAs apart) with
// any ARGV, over its own keys, which it may fill with what it likes. What follows stuffs an
// attacking tenant's keys with millions of members and fields, runs every script Redline loads
// over them as that tenant with hostile arguments, and times another tenant's calls meanwhile.

const (
	attackerNS = "attacker"
	victimNS   = "victim"
	// stuffed is how many members the attacker's heartbeat group holds, as in the incident;
	// its other keys hold a half (window state, log), a quarter (the state UNLINKed at its first
	// call) or a tenth (the group's hashes) of that: what each script does with them does not
	// grow with their size, and stuffing fewer keeps the test under a minute on a shared machine.
	stuffed = 2_000_000
	// hour is the window and TTL of the calls over the stuffed keys that keep them stuffed.
	hour = 3_600_000
)

// groupMembersUnclamped is group_members.lua before its caps were set inside it: it took the
// most members it returns from ARGV[2], unchecked. Kept to measure what it cost (see
// BenchmarkTenantStall).
//
//go:embed testdata/group_members_unclamped.lua
var groupMembersUnclamped string

// groupMembers is the manager's script that reads a group (fleet.Read): not a sidecar's, but
// loaded by the manager's own calls, so in the cache and callable by a tenant as well.
func groupMembers(t testing.TB) scripts.Script {
	t.Helper()
	src, err := os.ReadFile("../fleet/group_members.lua")
	if err != nil {
		t.Fatalf("reading the manager's group script: %v", err)
	}
	return scripts.New("GroupMembers", string(src))
}

// stats are the victim's latencies of one kind of call.
type stats struct {
	n             int
	p50, p99, max time.Duration
}

func summarize(d []time.Duration) stats {
	if len(d) == 0 {
		return stats{}
	}
	slices.Sort(d)
	at := func(q float64) time.Duration { return d[min(len(d)-1, int(q*float64(len(d))))] }
	return stats{n: len(d), p50: at(0.50), p99: at(0.99), max: d[len(d)-1]}
}

func (s stats) String() string {
	return fmt.Sprintf("n=%d p50=%v p99=%v max=%v", s.n, s.p50.Round(time.Microsecond), s.p99.Round(time.Microsecond), s.max.Round(time.Microsecond))
}

// siege is one measurement: the attacker sends calls back to back on its connection, round
// after round, until it has done rounds rounds and the victim has timed at least samples
// PINGs and as many decisions (an EVALSHA of FixedWindow on its own key, always admitted), each
// on its own connection. It returns the victim's latencies and, by script, how many of the
// attacker's calls Redis answered without an error and with one.
func (l *lab) siege(t testing.TB, calls []call, rounds, samples int) (ping, decide stats, ok, failed map[string]int) {
	t.Helper()
	ctx := context.Background()
	fw, _ := scripts.For("FixedWindow")
	key := []string{keyscheme.Key(victimNS, "p", "r", "k")}
	var (
		stop       atomic.Bool
		timed      atomic.Int64
		wg         sync.WaitGroup
		pings, fws []time.Duration
		verr       error
	)
	// served times one call of the victim until Redis serves it: a BUSY reply (a script ran
	// past lua-time-limit) is no answer, and the call is sent again.
	served := func(what string, do func() error) (time.Duration, error) {
		t0 := time.Now()
		for {
			err := do()
			if err != nil && redis.HasErrorPrefix(err, "BUSY") {
				continue
			}
			if err != nil {
				return 0, fmt.Errorf("victim's %s: %w", what, err)
			}
			return time.Since(t0), nil
		}
	}
	wg.Go(func() {
		for !stop.Load() {
			d, err := served("PING", func() error { return l.victim.Ping(ctx).Err() })
			if err != nil {
				verr = err
				return
			}
			pings = append(pings, d)
			d, err = served("decision", func() error {
				return l.victim.Process(ctx, scripts.EvalSha(ctx, fw, key, 1_000_000_000, 1000, 1, 0, 1, "", 0, 0, 0, 0, 0))
			})
			if err != nil {
				verr = err
				return
			}
			fws = append(fws, d)
			timed.Add(1)
		}
	})
	ok, failed = map[string]int{}, map[string]int{}
	for r := 0; r < rounds || timed.Load() < int64(samples); r++ {
		for _, c := range calls {
			if err := l.attacker.Process(ctx, scripts.EvalSha(ctx, c.script, c.keys, c.args...)); err != nil && err != redis.Nil {
				failed[c.script.Name]++
				// Refused for want of the script or of a command: the call measured nothing.
				if strings.Contains(err.Error(), "NOPERM") || strings.Contains(err.Error(), "NOSCRIPT") {
					t.Fatalf("attacker's %s %v: %v", c.script.Name, c.args, err)
				}
			} else {
				ok[c.script.Name]++
			}
		}
		if verr != nil {
			break
		}
	}
	stop.Store(true)
	wg.Wait()
	if verr != nil {
		t.Fatal(verr)
	}
	return summarize(pings), summarize(fws), ok, failed
}

// A tenant that stuffed its own keys with millions of members and fields and runs every script
// Redline loads over them, with any arguments, holds Redis no longer than a few ms a call:
// another tenant's PING and decisions stay under 50 ms at the 99th percentile.
func TestTenantCannotStallOthers(t *testing.T) {
	l := startLab(t)
	ctx := context.Background()
	byScript := l.hostile(t)
	var all []call
	for _, s := range append(append(redisacl.SidecarScripts(), fleet.ManagerScripts()...), groupMembers(t)) {
		if len(byScript[s.Name]) == 0 {
			t.Fatalf("script %s is loaded in Redis but not called here with hostile arguments", s.Name)
		}
	}
	names := make([]string, 0, len(byScript))
	for name := range byScript {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		all = append(all, byScript[name]...)
	}

	ping, decide, ok, failed := l.siege(t, all, 5, 2000)
	for _, name := range names {
		t.Logf("%s: %d calls answered, %d refused with an error", name, ok[name], failed[name])
		if ok[name] == 0 {
			t.Errorf("no call of %s ran to its end: the siege measured nothing of it", name)
		}
	}
	t.Logf("victim's PING under siege: %v", ping)
	t.Logf("victim's decision under siege: %v", decide)
	if ping.n < 2000 || decide.n < 2000 {
		t.Fatalf("only %d PINGs and %d decisions timed", ping.n, decide.n)
	}
	if ping.p99 >= 50*time.Millisecond || decide.p99 >= 50*time.Millisecond {
		t.Errorf("another tenant waited: PING p99 %v, decision p99 %v, want both under 50ms", ping.p99, decide.p99)
	}
	// The keys stayed stuffed, so every round ran over millions (the doomed state went at its
	// first call, by UNLINK).
	for _, n := range []*redis.IntCmd{l.admin.ZCard(ctx, l.group), l.admin.HLen(ctx, l.state), l.admin.ZCard(ctx, l.log)} {
		if v, err := n.Result(); err != nil || v < stuffed/8 {
			t.Errorf("%v: %d, %v: the key was not stuffed throughout", n.Args(), v, err)
		}
	}
	if v, err := l.admin.StrLen(ctx, l.tat).Result(); err != nil || v != 64<<20 {
		t.Errorf("token bucket key: %d bytes, %v: not stuffed throughout", v, err)
	}
}

// BenchmarkTenantStall reports, script by script, the victim's latencies while the attacker
// runs that script alone over its stuffed keys with hostile arguments (see
// TestTenantCannotStallOthers): "after" is the script as loaded today, "before" its source
// before its work was capped inside it, where that differs over these keys. "plain" rows are
// one command the attacker's grant holds and whose cost no ACL can bound. One measurement per
// row whatever b.N:
//
//	go test -run '^$' -bench TenantStall -benchtime 1x ./internal/redisacl/
func BenchmarkTenantStall(b *testing.B) {
	l := startLab(b)
	byScript := l.hostile(b)
	tb, _ := scripts.For("TokenBucket")
	tbGet := strings.Replace(tb.Source, "redis.call('GETRANGE', key, 0, 31)", "redis.call('GET', key)", 1)
	if tbGet == tb.Source {
		b.Fatal("the token bucket reads its key otherwise: update the before row")
	}
	ctx := context.Background()
	before := map[string][]call{
		"GroupMembers": {{scripts.New("GroupMembersUnclamped", groupMembersUnclamped), []string{l.group, l.cfg}, []any{hour, "1e9", 256}}},
		"TokenBucket":  {{scripts.New("TokenBucketGet", tbGet), []string{l.tat}, []any{100, 1000, 1, 0, 100}}},
	}
	if err := l.admin.ScriptLoad(ctx, tbGet).Err(); err != nil {
		b.Fatal(err)
	}
	names := make([]string, 0, len(byScript))
	for name := range byScript {
		names = append(names, name)
	}
	slices.Sort(names)
	var table []string
	row := func(name, version string, rounds, samples int, calls []call) {
		b.Run(name+"/"+version, func(b *testing.B) {
			if version == "before" {
				// The grant of then: GET was the token bucket's read.
				if err := l.admin.Do(ctx, "acl", "setuser", redisacl.Username(attackerNS), "+get").Err(); err != nil {
					b.Fatal(err)
				}
				defer func() {
					if err := redisacl.Ensure(ctx, []redisacl.Node{l.admin.(*redis.Client)}, attackerNS, []string{attackerNS + "-pw"}); err != nil {
						b.Fatal(err)
					}
				}()
			}
			ping, decide, _, _ := l.siege(b, calls, rounds, samples)
			b.ReportMetric(float64(ping.p99.Microseconds())/1000, "ping-p99-ms")
			b.ReportMetric(float64(decide.p99.Microseconds())/1000, "decide-p99-ms")
			table = append(table, fmt.Sprintf("| %s | %s | %s | %s |", name, version, ping, decide))
		})
	}
	for _, name := range names {
		if old, ok := before[name]; ok {
			row(name, "before", 3, 0, old)
		}
		row(name, "after", 3, 2000, byScript[name])
	}
	// Plain commands the grant holds whose cost no ACL bounds: their arguments, or the size of
	// the key they read.
	// Their cost is what Redis's SLOWLOG says the command took: every other client waits that
	// long (timing the victim beside a client that reads a reply of millions is timing Go).
	plain := func(name string, args ...any) {
		b.Run("plain/"+name, func(b *testing.B) {
			if err := l.admin.ConfigSet(ctx, "slowlog-log-slower-than", "0").Err(); err != nil {
				b.Fatal(err)
			}
			if err := l.admin.SlowLogReset(ctx).Err(); err != nil {
				b.Fatal(err)
			}
			if err := l.attacker.Do(ctx, args...).Err(); err != nil {
				b.Fatal(err)
			}
			entries, err := l.admin.SlowLogGet(ctx, 10).Result()
			if err != nil {
				b.Fatal(err)
			}
			var took time.Duration
			for _, e := range entries {
				if len(e.Args) > 0 && strings.EqualFold(e.Args[0], fmt.Sprint(args[0])) {
					took = e.Duration
				}
			}
			b.ReportMetric(float64(took.Microseconds())/1000, "redis-held-ms")
			table = append(table, fmt.Sprintf("| %s | plain | Redis held %v | |", name, took.Round(time.Microsecond)))
		})
	}
	bulk := make([]any, 0, 2+2_000_000)
	bulk = append(bulk, "zadd", keyscheme.Key(attackerNS, "p", "r", "bulk"))
	for i := range 1_000_000 {
		bulk = append(bulk, i, i)
	}
	plain("ZADD of 1e6 members", bulk...)
	plain("HGETALL of 1e6 fields", "hgetall", l.state)
	plain("ZRANGE 0 -1 of 1e6 members", "zrange", l.log, 0, -1)
	plain("GETRANGE 0 -1 of 64 MiB", "getrange", l.tat, 0, -1)
	plain("PEXPIRE 0 of 1e6 members", "pexpire", l.log, 0)
	b.Logf("victim's latencies while the attacker runs one script over its stuffed keys:\n| script | version | PING | decision |\n| --- | --- | --- | --- |\n%s",
		strings.Join(table, "\n"))
}
