package redisacl_test

import (
	"context"
	_ "embed"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redline-dev/redline/internal/fleet"
	"github.com/redline-dev/redline/internal/keyscheme"
	"github.com/redline-dev/redline/internal/limiter/scripts"
	"github.com/redline-dev/redline/internal/redisacl"
	"github.com/redline-dev/redline/internal/testutil/redistest"
)

// call is one EVALSHA the attacker sends.
type call struct {
	script scripts.Script
	keys   []string
	args   []any
}

// lab is a Redis with two tenants, the attacker's keys stuffed.
type lab struct {
	admin, attacker, victim redis.UniversalClient
	// group and cfg are the attacker's heartbeat group; state a window state kept stuffed
	// (calls over it use an hour's window, current); doomed a window state stuffed whose
	// first call finds it of an ended window; log a sliding window log; tat a token
	// bucket's key holding a 64 MiB string.
	group, cfg, state, doomed, log, tat string
	// holds are the hold records of state, stuffed: half past their deadline (each reserve or
	// settle sweeps 16), half open; tatHolds those of heldTat, a TokenBucket key of its own (a
	// settle writes its TAT anew, and tat stays stuffed for the others); logHolds and logHeld
	// those of log and the units they hold (a settle appends to log, which stays stuffed).
	holds, heldTat, tatHolds, logHolds, logHeld string
	// start is the current hour's window start (ms on Redis's clock).
	start int64
}

func startLab(t testing.TB) *lab {
	t.Helper()
	ctx := context.Background()
	srv, err := redistest.Start("--requirepass", adminPassword)
	if err != nil {
		t.Fatalf("starting redis-server: %v", err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	l := &lab{admin: tbClient(t, srv.URL(), "", adminPassword)}
	for _, ns := range []string{attackerNS, victimNS} {
		if err := redisacl.Ensure(ctx, []redisacl.Node{l.admin.(*redis.Client)}, ns, []string{ns + "-pw"}); err != nil {
			t.Fatalf("setting the user of %s: %v", ns, err)
		}
	}
	// Every script the manager loads: the sidecars' (as scriptwatcher.Watcher does) and its
	// own group reads (which scripts.Exec loads by EVAL at their first run), and the members
	// read once more through its own path (fleet.Read).
	for _, s := range append(redisacl.SidecarScripts(), fleet.ManagerScripts()...) {
		if err := l.admin.ScriptLoad(ctx, s.Source).Err(); err != nil {
			t.Fatalf("loading %s: %v", s.Name, err)
		}
	}
	if _, err := fleet.Read(ctx, l.admin, attackerNS, "p", time.Minute); err != nil {
		t.Fatalf("reading a group as the manager: %v", err)
	}
	if err := l.admin.ScriptLoad(ctx, groupMembersUnclamped).Err(); err != nil {
		t.Fatalf("loading the unclamped group script: %v", err)
	}
	l.attacker = tbClient(t, srv.URL(), redisacl.Username(attackerNS), attackerNS+"-pw")
	l.victim = tbClient(t, srv.URL(), redisacl.Username(victimNS), victimNS+"-pw")

	l.group, l.cfg = fleet.GroupKey(attackerNS, "p"), fleet.GroupConfigKey(attackerNS, "p")
	l.state = keyscheme.Key(attackerNS, "p", "r", "state")
	l.doomed = keyscheme.Key(attackerNS, "p", "r", "doomed")
	l.log = keyscheme.Key(attackerNS, "p", "r", "log")
	l.tat = keyscheme.Key(attackerNS, "p", "r", "tat")
	l.heldTat = keyscheme.Key(attackerNS, "p", "r", "heldtat")
	l.holds, l.tatHolds = l.state+":h", l.heldTat+":h"
	l.logHolds, l.logHeld = l.log+":h", l.log+":held"
	now, err := l.admin.Time(ctx).Result()
	if err != nil {
		t.Fatalf("reading redis time: %v", err)
	}
	ms := now.UnixMilli()
	l.start = ms - ms%hour

	// Setup, as the admin for speed: the attacker could write the same with its own ZADD and
	// HSET, granted to it (what one such command costs: BenchmarkTenantStall, "ZADD").
	began := time.Now()
	l.stuff(t, stuffed, "zadd", l.group, "m%07d", ms-hour, ms, 0) // half dead an hour ago, half live
	l.stuff(t, stuffed/10, "hset", l.cfg, "m%07d", "cfg", "cfg", 0)
	l.stuff(t, stuffed/2, "hset", l.state, "r%07d", 1, 2, 0)
	l.stuff(t, stuffed/4, "hset", l.doomed, "r%07d", 1, 2, 0)
	l.stuff(t, stuffed/2, "zadd", l.log, "%017d", ms-2*hour, ms-1000, stuffed/4) // half out of the window, half in it
	l.stuff(t, stuffed/10, "zadd", l.holds, "%d:999999999999:r1:x", ms-hour, ms+hour, stuffed/20)
	l.stuff(t, stuffed/10, "zadd", l.tatHolds, "0:%d:r1:x", ms-hour, ms+hour, stuffed/20)
	l.stuff(t, stuffed/10, "zadd", l.logHolds, "0:%d:r1:x", ms-hour, ms+hour, stuffed/20)
	for _, err := range []error{
		l.admin.HSet(ctx, l.state, "s", l.start, "c", 0, "p", 0).Err(),
		l.admin.HSet(ctx, l.doomed, "s", l.start-10*hour, "c", 5, "p", 5).Err(),
		l.admin.Set(ctx, l.tat, strings.Repeat("9", 64<<20), 0).Err(),
		l.admin.Set(ctx, l.logHeld, "1e300", 0).Err(), // not a count any script wrote
	} {
		if err != nil {
			t.Fatalf("stuffing: %v", err)
		}
	}
	t.Logf("stuffed %d members or fields in the keys of %s in %v", stuffed+stuffed/10+stuffed/2+stuffed/4+stuffed/2+3*stuffed/10, attackerNS, time.Since(began).Round(time.Millisecond))
	return l
}

func tbClient(t testing.TB, url, user, password string) redis.UniversalClient {
	t.Helper()
	// One connection each: the victim's calls are timed alone, the attacker's sent back to back.
	c := redis.NewClient(&redis.Options{Addr: strings.TrimPrefix(url, "redis://"), Username: user, Password: password,
		PoolSize: 1, ReadTimeout: time.Minute, WriteTimeout: time.Minute, MaxRetries: -1})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// stuffer fills a key with stuffed members (kind zadd: score, member) or fields (kind hset:
// field, value), from ARGV[2] to ARGV[3] - 1, named by the format ARGV[4] of their index, the
// score or value ARGV[5] for the first half (ARGV[7] > 0: those below it) or the even ones, and
// ARGV[6] for the others. In Redis rather than from the client: ten million members in a few
// seconds, on a machine shared with other tests.
var stuffer = scripts.New("Stuffer", `
local key, kind, from, to, fmt, a, b, half = KEYS[1], ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4], ARGV[5], ARGV[6], tonumber(ARGV[7])
local args = {}
for i = from, to - 1 do
  local v = a
  if (half > 0 and i >= half) or (half == 0 and i % 2 == 1) then
    v = b
  end
  if kind == 'zadd' then
    args[#args + 1], args[#args + 2] = v, string.format(fmt, i)
  else
    args[#args + 1], args[#args + 2] = string.format(fmt, i), v
  end
  if #args >= 2000 then
    redis.call(kind, key, unpack(args))
    args = {}
  end
end
if #args > 0 then
  redis.call(kind, key, unpack(args))
end
return 0
`)

// stuff writes stuffed members or fields into key with stuffer, 100,000 a call.
func (l *lab) stuff(t testing.TB, n int, kind, key, format string, a, b any, half int) {
	t.Helper()
	ctx := context.Background()
	for i := 0; i < n; i += 100_000 {
		cmd := scripts.EvalSha(ctx, stuffer, []string{key}, kind, i, min(i+100_000, n), format, a, b, half)
		scripts.Exec(ctx, l.admin, []redis.Cmder{cmd}, []scripts.Script{stuffer})
		if err := cmd.Err(); err != nil {
			t.Fatalf("stuffing %s: %v", key, err)
		}
	}
}

// hostile returns, by script name, the calls the attacker sends: over the stuffed keys, with
// arguments a legitimate sidecar sends and with hostile ones (NaN, inf, negative, 1e300, not a
// number, missing) in every position that a script parses.
func (l *lab) hostile(t testing.TB) map[string][]call {
	t.Helper()
	by := map[string]scripts.Script{}
	for _, s := range append(append(redisacl.SidecarScripts(), fleet.ManagerScripts()...), groupMembers(t)) {
		by[s.Name] = s
	}
	out := map[string][]call{}
	add := func(name string, keys []string, args ...any) {
		s, ok := by[name]
		if !ok {
			t.Fatalf("no script %s", name)
		}
		out[name] = append(out[name], call{s, keys, args})
	}
	for _, w := range []string{"FixedWindow", "SlidingWindowCounter"} {
		state, doomed := []string{l.state}, []string{l.doomed}
		add(w, state, 100, hour, 1, 0, "1e300", "r1", 0, 0, 0, 0, 0) // a lease of 1e300
		add(w, state, "1e300", hour, "1e300", "inf", "-inf", "x", "nan", "1e300", "-1e300", 0, 0)
		add(w, state, "nan", hour, "nan", "nan", "nan", "r2", "nan", "nan", "nan", 0, 0)
		add(w, state, -1, hour, -1, -1, -1, "", -1, -1, -1, -1, -1)
		add(w, state, 100, hour, 1, 0, 1, "r3", l.start, "1e300", "1e300", "1e9", 3) // restores, holds
		add(w, state, 100, hour, 0, 0, 0, "r4", l.start, 5, 5, 1, 1)
		add(w, state)
		// A state of an ended window (the first call finds it stuffed and UNLINKs it), bad
		// windows, and holds and peers out of range, which garble the state's s (the tenant's
		// own key, written anew at its next call).
		add(w, doomed, 100, 1000, 1, 0, 1, "r1", 0, 0, 0, 0, 0)
		add(w, doomed, "1e300", 1000, "1e300", "inf", "-inf", "x", "nan", "1e300", "-1e300", "1e300", "1e300")
		add(w, doomed, "nan", 1000, "nan", "nan", "nan", "r2", "nan", "nan", "nan", "nan", "nan")
		for _, win := range []any{"nan", "inf", "-inf", "1e300", 0, -5, 1.5, "x"} {
			add(w, doomed, 100, win, 1, 0, 1, "r1", 0, 0, 0, 0, 0)
		}
	}
	// Holds: reserves (the algorithms' scripts with a hold's ARGV) and settles over the
	// stuffed records, with hostile arguments in every position the hold's part parses.
	for _, w := range []string{"FixedWindow", "SlidingWindowCounter"} {
		held := []string{l.state, l.holds}
		add(w, held, 100, hour, 1, 0, 50, "r1", l.start, 0, 0, 0, 0, 1, "r1:a", 60000)
		add(w, held, 100, hour, 1, 0, "1e300", "r1", l.start, 0, 0, 0, 0, "1e300", strings.Repeat("t", 101), "1e300")
		add(w, held, "nan", hour, "nan", 0, "nan", "r1", "nan", "nan", "nan", 0, 0, "nan", "r1:b", "nan")
		add(w, held, 100, hour, -1, 0, -1, "", 0, 0, 0, 0, 0, -1, "r1:c", -1)
		add(w, held, 100, hour, 1, 0, 1, "r1", 0, 0, 0, 0, 0, 0, "r1:d", "inf")
		add(w, []string{l.state}, 100, hour, 1, 0, 1, "r1", 0, 0, 0, 0, 0, 0, "r1:e", 1000) // no KEYS[2]
	}
	rec := fmt.Sprintf("%d:5:r1:a", l.start)
	for _, a := range [][]any{
		{100, hour, rec, 3, l.start + hour, 1, "r1", l.start, 5, 0, 1},
		{100, hour, rec, "1e300", "1e300", 0, "r1", l.start, "1e300", "1e300", "1e300"},
		{100, hour, fmt.Sprintf("%d:1e300:r1:a", l.start), 1, 0, 1, "r1", 0, 0, 0, 0},
		{100, hour, fmt.Sprintf("%d:999999999999999999:r1:a", l.start), 1, 0, 1, "r1", 0, 0, 0, 0},
		{"nan", "nan", rec, "nan", "nan", "nan", "nan", "nan", "nan", "nan", "nan"},
		{"inf", "-inf", rec, "inf", "-inf", 1, "r1", 0, 0, 0, "-inf"},
		{-1, -1, rec, -1, -1, 1, "", -1, -1, -1, -1},
		{100, hour, strings.Repeat("9", 200), 1, 0, 1, "r1", 0, 0, 0, 0},
		{100, hour, "x", 1, 0},
		{},
	} {
		add("HoldSettle", []string{l.state, l.holds}, a...)
	}
	add("HoldSettle", []string{l.state}, 100, hour, rec, 1, 0, 1, "r1", 0, 0, 0, 0)
	tatHeld := []string{l.heldTat, l.tatHolds}
	add("TokenBucket", tatHeld, 100, 1000, 1, 0, 100, 50, "r1:a", 500)
	add("TokenBucket", tatHeld, 100, 1000, 1, 0, 100, "1e300", strings.Repeat("t", 101), "1e300")
	add("TokenBucket", tatHeld, "nan", "nan", "nan", 0, "nan", "nan", "r1:b", "nan")
	add("TokenBucket", tatHeld, 0, 0, 0, 0, 0, 0, "r1:c", 0)
	for _, a := range [][]any{
		{100, 1000, 100, "0:5:r1:a", 3, 0},
		{100, 1000, 100, "0:5:r1:a", "1e300", "1e300"},
		{"nan", "nan", "nan", "0:5:r1:a", "nan", "nan"},
		{"inf", "-inf", "inf", "0:1e300:r1:a", "inf", "-inf"},
		{0, 0, 0, "0:0:r1:a", -1, -1},
		{100, 1000, 100, strings.Repeat("0", 200), 1, 0},
		{},
	} {
		add("HoldSettleTokenBucket", tatHeld, a...)
	}
	logHeld := []string{l.log, l.logHolds, l.logHeld}
	add("SlidingWindowLog", logHeld, 100, hour, 1, 0, 50, "r1:a", 60000)              // refused: searches
	add("SlidingWindowLog", logHeld, "1e15", hour, 1, 0, "1e15", "r1:a", 60000)       // admits, holds
	add("SlidingWindowLog", logHeld, 100, hour, "nan", 0, "nan", "r1:b", "nan")       // refused at once
	add("SlidingWindowLog", logHeld, 100, hour, 1, 0, 1, strings.Repeat("t", 101), 1) // a tag too long
	add("SlidingWindowLog", []string{l.log, l.logHolds}, 100, hour, 1, 0, 1, "r1:c", 1000)
	for _, a := range [][]any{
		{100, hour, "0:5:r1:a", 3, l.start + hour},
		{100, hour, "0:5:r1:a", "1e300", "1e300"},
		{"nan", "nan", "0:5:r1:a", "nan", "nan"},
		{"inf", "-inf", "0:1e300:r1:a", "inf", "-inf"},
		{0, 0, "0:0:r1:a", -1, -1},
		{100, hour, strings.Repeat("0", 200), 1, 0},
		{},
	} {
		add("HoldSettleSlidingWindowLog", logHeld, a...)
	}
	// Calendar windows: periods whose keys hold the 64 MiB string (read 32 bytes of, never
	// written: INCRBY and DECRBY refuse a non-integer), and hostile boundaries and counts.
	cal := []string{l.tat, l.tat, l.tat}
	add("CalendarWindow", cal, 100, 2*hour, 1, 0, l.start-hour, l.start, l.start+hour, l.start+2*hour)
	add("CalendarWindow", cal, "1e15", "1e12", "1e15", 0, l.start-hour, l.start, l.start+hour, "1e16")
	add("CalendarWindow", cal, "nan", "inf", "nan", 0, "nan", "nan", "nan", "nan")
	add("CalendarWindow", cal, 100, hour, 1, 0, 0, 1, 2, 3) // Redis's clock in none of them
	add("CalendarWindow", cal)
	add("PeekCalendarWindow", cal, 100, 2*hour, 1, 0, l.start-hour, l.start, l.start+hour, l.start+2*hour)
	add("PeekCalendarWindow", cal, "1e15", "1e12", "1e15", 0, l.start-hour, l.start, l.start+hour, "1e16")
	add("PeekCalendarWindow", cal, "nan", "inf", "nan", 0, "nan", "nan", "nan", "nan")
	add("PeekCalendarWindow", cal, 100, hour, 1, 0, 0, 1, 2, 3)
	add("PeekCalendarWindow", cal)
	add("CalendarReturn", []string{l.tat}, 5, l.start+hour)
	add("CalendarReturn", []string{l.tat}, "1e300", "inf")
	add("CalendarReturn", []string{l.tat})
	add("CalendarReturn", []string{l.tat}, 5, 1)                       // a period that ended
	add("CalendarReturn", []string{l.tat + ":cal:0"}, 5, l.start+hour) // a period with no count
	add("HoldSettleSlidingWindowLog", []string{l.log, l.logHolds}, 100, hour, "0:5:r1:a", 3, 0)
	// Calendar shares: share hashes that are the 64 MiB string, the stuffed hold records or
	// fresh, with hostile shares (a restore of 1e15 starts a hold; the rest is refused).
	calShares := []string{l.tat + ":cal:4", l.tat + ":cal:5", l.tat + ":cal:6", l.tat, l.tat, l.tat}
	calSharesFresh := []string{l.tat + ":cal:7", l.tat + ":cal:8", l.tat + ":cal:9", l.tat + ":cal:7:r", l.tat + ":cal:8:r", l.tat + ":cal:9:r"}
	shareAt := func(keys []string, tail ...any) {
		add("CalendarWindow", keys, append([]any{100, 2 * hour, 1, 0, l.start - hour, l.start, l.start + hour, l.start + 2*hour}, tail...)...)
	}
	shareAt(calShares, "r1", l.start, 5, 0, 2000, 3, 1)
	shareAt(calSharesFresh, "r1", l.start, "1e15", 0, 2000, 3, 1)
	shareAt(calSharesFresh, "r2", "nan", "1e300", "inf", "-inf", "nan", "1e300")
	shareAt(calSharesFresh, strings.Repeat("r", 101), l.start, 1, 0, 1, 1, 1)
	shareAt(calSharesFresh[:3], "r3", l.start, 1, 0, 1, 1, 1) // no share hashes
	shareAt([]string{l.tat + ":cal:7", l.tat + ":cal:8", l.tat + ":cal:9", l.holds, l.holds, l.holds}, "r4", l.start, 1, 0, 1, 1, 1)
	add("CalendarReturn", []string{l.tat + ":cal:8", l.tat}, 5, l.start+hour, "r1", l.start, 5, 1)
	add("CalendarReturn", []string{l.tat + ":cal:8", l.holds}, 5, l.start+hour, "r1", l.start, 5, 1)
	add("CalendarReturn", []string{l.tat + ":cal:8", l.tat + ":cal:8:r"}, 5, l.start+hour, "r1", "nan", "1e300", "inf")
	add("CalendarReturn", []string{l.tat + ":cal:8"}, 5, l.start+hour, "r1", l.start, 5, 1) // no share hash
	// Calendar holds: reserves and settles over the stuffed hold records, on periods of no
	// count and on the 64 MiB string, with hostile arguments where the hold's part parses.
	fresh := []string{l.tat + ":cal:1", l.tat + ":cal:2", l.tat + ":cal:3", l.holds}
	calHeld := []string{l.tat, l.tat, l.tat, l.holds}
	at := func(tail ...any) []any {
		return append([]any{100, 2 * hour, 1, 0, l.start - hour, l.start, l.start + hour, l.start + 2*hour}, tail...)
	}
	add("CalendarReserve", fresh, at(50, "r1:a", 60000, 64)...)
	add("CalendarReserve", calHeld, at(50, "r1:a", 60000, 64)...)
	add("CalendarReserve", fresh, at("1e300", strings.Repeat("t", 101), "1e300", "1e300")...)
	add("CalendarReserve", fresh, at("nan", "r1:b", "nan", "nan")...)
	add("CalendarReserve", fresh, at()...)                        // no hold arguments
	add("CalendarReserve", fresh[:3], at(1, "r1:c", 1000, 64)...) // no KEYS[4]
	add("CalendarReserve", fresh, "nan", "inf", "nan", 0, "nan", "nan", "nan", "nan", 1, "r1:d", 1, 1)
	add("CalendarReserve", fresh)
	calRec := fmt.Sprintf("%d:5:r1:a", l.start)
	for _, tail := range [][]any{
		{calRec, 3, l.start + hour}, {calRec, "1e300", "1e300"}, {calRec, "nan", "-inf"}, {calRec, -1, -1},
		{fmt.Sprintf("%d:1e300:r1:a", l.start), 1, 0}, {fmt.Sprintf("%d:5:r1:a", l.start+2*hour), 1, 0},
		{strings.Repeat("9", 200), 1, 0}, {"x", 1, 0}, {},
	} {
		add("CalendarSettle", fresh, at(tail...)...)
	}
	add("CalendarSettle", calHeld, at(calRec, 30, l.start+hour)...) // an excess on the string
	add("CalendarSettle", fresh[:3], at(calRec, 1, 0)...)           // no KEYS[4]
	add("CalendarSettle", fresh)
	// Slots over the stuffed hold records (half of them live): take one, with every bound
	// hostile, and renew the most ids a call reads, and more.
	slotted := []string{l.holds}
	for _, a := range [][]any{
		{"r1:s", 1, 60000, 100000}, {"r1:s", "1e300", "1e300", "1e300"}, {"r1:s", "nan", "nan", "nan"},
		{"r1:s", "inf", "-inf", "inf"}, {"r1:s", -1, -1, -1}, {strings.Repeat("t", 129), 1, 1, 1}, {},
	} {
		add("SlotAcquire", slotted, a...)
	}
	// The same records as the line of waiters and its deadlines: a waiter joins it or is
	// refreshed, a try without one counts it, with every bound hostile.
	lined := []string{l.holds, l.holds, l.holds}
	for _, a := range [][]any{
		{"r1:s", 1, 60000, 100000, "r1:w", 2000}, {"r1:s", 1, 60000, 100000, "", 2000},
		{"r1:s", "1e300", "1e300", "1e300", "r1:w", "1e300"}, {"r1:s", "nan", "nan", "nan", "r1:w", "nan"},
		{"r1:s", 1, 1, 1, strings.Repeat("w", 129), -1},
	} {
		add("SlotAcquire", lined, a...)
	}
	ids := []any{60000}
	for i := range 600 {
		ids = append(ids, fmt.Sprintf("%d:999999999999:r1:x%d", l.start, i))
	}
	add("SlotRenew", slotted, ids...)
	add("SlotRenew", slotted, "nan", "r1:s")
	add("SlotRenew", slotted, "1e300", "r1:s")
	add("SlotRenew", slotted)
	add("LeaseReturn", []string{l.state}, hour, l.start, "1e300", "r1", l.start, "1e300", 0)
	add("LeaseReturn", []string{l.state}, hour, l.start, "nan", "r1", "nan", "nan", "nan")
	add("LeaseReturn", []string{l.state}, hour, l.start, -5, "", 0, 0, 0)
	add("LeaseReturn", []string{l.state}, "nan", "nan", "nan", "", "", "", "")
	add("LeaseReturn", []string{l.doomed}, 1000, 0, 5, "r1", 0, 0, 0)
	add("LeaseReturn", []string{l.state})
	log := []string{l.log}
	add("SlidingWindowLog", log, 100, hour, 1, 0)     // over the limit: searches the log
	add("SlidingWindowLog", log, "1e300", hour, 1, 0) // admits
	add("SlidingWindowLog", log, 100, 60000, 1, 0)    // a million expired: trims
	add("SlidingWindowLog", log, 100, hour, "1e300", 0)
	add("SlidingWindowLog", log, "nan", hour, "nan", "nan")
	add("SlidingWindowLog", log, "-1e300", hour, "-1e300", "-1")
	for _, win := range []any{"nan", "inf", "-inf", "1e300", "-1e300", 0, -1, "x"} {
		add("SlidingWindowLog", log, 100, win, 1, 0)
	}
	add("SlidingWindowLog", log)
	tat := []string{l.tat}
	add("TokenBucket", tat, 100, 1000, 1, 0, 100)
	add("TokenBucket", tat, "nan", "nan", "nan", "nan", "nan")
	add("TokenBucket", tat, "1e300", 1, "1e300", 0, "1e300")
	add("TokenBucket", tat, -1, -1, -1, -1, -1)
	add("TokenBucket", tat, 0, 0, 0, 0, 0)
	add("TokenBucket", tat)
	// Dry runs: the same keys as the decisions, read only, with hostile arguments.
	for _, a := range [][]any{{100, hour, 1, 0}, {"1e300", hour, "1e300", 0}, {"nan", "nan", "nan", "nan"}, {100, "-1", 1, 0}, {}} {
		add("PeekFixedWindow", []string{l.state}, a...)
		add("PeekSlidingWindowCounter", []string{l.state}, a...)
	}
	add("PeekSlidingWindowLog", log, 100, hour, 1, 0)     // over the limit: searches the log
	add("PeekSlidingWindowLog", log, 100, 60000, 1, 0)    // a million expired: trims nothing
	add("PeekSlidingWindowLog", log, "1e300", hour, 1, 0) // would admit
	add("PeekSlidingWindowLog", log, "nan", hour, "nan", "nan")
	add("PeekSlidingWindowLog", log, 100, "nan", 1, 0)
	add("PeekSlidingWindowLog", log)
	for _, a := range [][]any{{100, 1000, 1, 0, 100}, {"nan", "nan", "nan", "nan", "nan"}, {"1e300", 1, "1e300", 0, "1e300"}, {0, 0, 0, 0, 0}, {}} {
		add("PeekTokenBucket", tat, a...)
	}
	// Give-backs: a TAT of 64 MB of digits, and a log of millions, by its newest and a middle
	// score (the members there and every later one are bounded), and hostile arguments.
	for _, tk := range [][]string{tat, {l.heldTat}} {
		add("TokenReturn", tk, 100, 1000, 100, 5)
		add("TokenReturn", tk, "1e300", 1, "1e300", "1e300")
		add("TokenReturn", tk, "nan", "nan", "nan", "nan")
		add("TokenReturn", tk, 0, -1, 0, -1)
		add("TokenReturn", tk)
	}
	now := time.Now().UnixMilli()
	add("LogReturn", log, hour, now-1000, 1)
	add("LogReturn", log, hour, now-hour/2, 1)
	add("LogReturn", log, hour, now-hour/2, "1e15")
	add("LogReturn", log, "1e300", "1e300", "1e300")
	add("LogReturn", log, "nan", "nan", "nan")
	add("LogReturn", log, -1, -1, -1)
	add("LogReturn", log)
	group := []string{l.group, l.cfg}
	add("GroupHeartbeat", group, "i1", hour, "h", "1")   // half the group dead: drops
	add("GroupHeartbeat", group, "i2", 2*hour, "h", "0") // none dead
	// (A short TTL would have the stuffed group expire, and be freed on Redis's thread, within
	// the measurement: see the PEXPIRE row of BenchmarkTenantStall, the remedy there.)
	for _, ttl := range []any{"nan", "inf", "-inf", "1e300", "-1e300", 0, -1, 1.5, "x"} {
		add("GroupHeartbeat", group, "i3", ttl, "h", "1")
	}
	add("GroupHeartbeat", group)
	for _, a := range [][]any{
		{hour, "1e9", "1e9"}, {hour, -1, -1}, {hour, "nan", "nan"}, {hour, "inf", "-inf"},
		{"inf", "1e300", "-1e300"}, {"-inf", 1, 1}, {"nan", 1, 1}, {hour, 0, 0}, {hour, 1.5, "x"}, {},
	} {
		add("GroupMembers", group, a...)
	}
	// Summaries: with the heartbeat (the largest allowed, one over it) and read by the
	// manager's script with every bound hostile, over the stuffed group.
	withSummary := []string{l.group, l.cfg, fleet.SummaryKey(attackerNS, "p", "i4")}
	add("GroupHeartbeat", withSummary, "i4", 2*hour, "h", "0", strings.Repeat("s", fleet.SummaryMaxBytes))
	add("GroupHeartbeat", withSummary, "i4", 2*hour, "h", "0", strings.Repeat("s", fleet.SummaryMaxBytes+1))
	add("GroupHeartbeat", withSummary, "i4", 2*hour, "h", "0", "")
	for _, a := range [][]any{
		{hour, "1e9", "1e12", "1e12"}, {hour, -1, -1, -1}, {hour, "nan", "nan", "nan"}, {hour, "inf", "-inf", "inf"},
		{"inf", "1e300", "-1e300", "1e300"}, {"-inf", 1, 1, 1}, {"nan", 1, 1, 1}, {hour, 0, 0, 0}, {hour, 1.5, "x", "x"}, {},
	} {
		add("GroupSummaries", []string{l.group}, a...)
	}
	return out
}
