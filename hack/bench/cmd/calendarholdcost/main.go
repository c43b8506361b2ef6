// Command calendarholdcost measures what shares add to a token budget's holds on a calendar
// window in Redis, side by side in one run: Redis's time per reserve and per settle (INFO
// commandstats, cmdstat_evalsha usec over calls) of the calendar reserve and settle scripts of
// an older commit (-old, which kept no shares), of this tree's without a replica id, and of
// this tree's with shares (three replica ids).
//
//	go run ./cmd/calendarholdcost -root ../.. -old <commit> [-rounds 3] [-ops 20000] [-keys 1000]
//
// Each cell runs on a fresh redis-server: -ops reserves of 10 units over -keys keys of a UTC
// day (a round robin), then their settles, a third giving 3 back, a third overrunning by 2, a
// third exact, with the arguments the limiter sends (with shares: what each replica knows of
// its share, and its count of lowerings). The cells alternate their order round by round.
// Nothing is asserted about speed; each cell checks that every reserve held its 10 units and
// every settle gave back or charged what it should, so a number is never of a path that did
// not run. Every redis-server this command starts ends with it.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redline-dev/redline/internal/calendar"
	"github.com/redline-dev/redline/internal/limiter/scripts"
	"github.com/redline-dev/redline/internal/testutil/redistest"
)

type cell struct {
	name            string
	reserve, settle string // sources
	ids             []string
}

type sample struct{ reserveUS, settleUS float64 }

func main() {
	root := flag.String("root", "../..", "the repository's root, for git show")
	old := flag.String("old", "", "the commit whose calendar scripts kept no shares")
	rounds := flag.Int("rounds", 3, "rounds (each runs every cell)")
	ops := flag.Int("ops", 20000, "reserves (and as many settles) a cell")
	keys := flag.Int("keys", 1000, "keys the holds spread over")
	flag.Parse()
	if *old == "" {
		fmt.Fprintln(os.Stderr, "-old is required")
		os.Exit(2)
	}
	if err := run(*root, *old, *rounds, *ops, *keys); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func run(root, old string, rounds, ops, keys int) error {
	oldReserve, err := oldSource(root, old, "calendar_reserve.lua")
	if err != nil {
		return err
	}
	oldSettle, err := oldSource(root, old, "calendar_settle.lua")
	if err != nil {
		return err
	}
	cells := []cell{
		{name: "old (" + old + ", no shares)", reserve: oldReserve, settle: oldSettle},
		{name: "new, no replica id", reserve: scripts.CalendarReserve().Source, settle: scripts.CalendarSettle().Source},
		{name: "new, shares (3 replica ids)", reserve: scripts.CalendarReserve().Source, settle: scripts.CalendarSettle().Source,
			ids: []string{"aaaaaaaa", "bbbbbbbb", "cccccccc"}},
	}
	res := make([][]sample, len(cells))
	for r := range rounds {
		for k := range cells {
			i := (k + r) % len(cells)
			s, err := measure(cells[i], ops, keys)
			if err != nil {
				return fmt.Errorf("%s: %w", cells[i].name, err)
			}
			fmt.Fprintf(os.Stderr, "round %d, %s: reserve %.2f µs, settle %.2f µs\n", r+1, cells[i].name, s.reserveUS, s.settleUS)
			res[i] = append(res[i], s)
		}
	}
	fmt.Printf("Redis time per call (cmdstat_evalsha usec/calls), %d reserves and %d settles of a UTC day over %d keys, %d rounds:\n\n", ops, ops, keys, rounds)
	fmt.Println("| scripts | reserve µs/call | settle µs/call |")
	fmt.Println("| --- | --- | --- |")
	for i, c := range cells {
		var rs, ss []string
		for _, s := range res[i] {
			rs = append(rs, fmt.Sprintf("%.2f", s.reserveUS))
			ss = append(ss, fmt.Sprintf("%.2f", s.settleUS))
		}
		fmt.Printf("| %s | %s | %s |\n", c.name, strings.Join(rs, ", "), strings.Join(ss, ", "))
	}
	return nil
}

// oldSource reads file of lua/ at commit, its fragments included as the scripts package does.
func oldSource(root, commit, file string) (string, error) {
	read := func(name string) (string, error) {
		out, err := exec.Command("git", "-C", root, "show", commit+":"+filepath.Join("internal/limiter/scripts/lua", name)).Output()
		if err != nil {
			return "", fmt.Errorf("reading %s at %s: %w", name, commit, err)
		}
		return string(out), nil
	}
	src, err := read(file)
	if err != nil {
		return "", err
	}
	var b strings.Builder
	for line := range strings.SplitAfterSeq(src, "\n") {
		name, ok := strings.CutPrefix(strings.TrimRight(line, "\n"), "--!include ")
		if !ok {
			b.WriteString(line)
			continue
		}
		frag, err := read(name)
		if err != nil {
			return "", err
		}
		b.WriteString(frag)
	}
	return b.String(), nil
}

// cellRun is one cell's redis-server, scripts and day, and what each replica knows.
type cellRun struct {
	rc              *redis.Client
	reserve, settle string // SHAs
	bounds          []any  // the three periods around Redis's clock: four boundaries
	span            int64
	known           map[string]int64 // key/id: the replica's share
	lv              map[string]int64 // id: its count of lowerings, from 1
}

type hold struct {
	key, id, record string
	deadline        int64
}

func measure(c cell, ops, nkeys int) (sample, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	srv, err := redistest.Start()
	if err != nil {
		return sample{}, err
	}
	defer srv.Close()
	r := &cellRun{rc: srv.Client(""), known: map[string]int64{}, lv: map[string]int64{}}
	defer r.rc.Close()
	if err := r.setup(ctx, c); err != nil {
		return sample{}, err
	}
	holds, err := r.reserveAll(ctx, c, ops, nkeys)
	if err != nil {
		return sample{}, err
	}
	rUS, err := evalshaUS(ctx, r.rc)
	if err != nil {
		return sample{}, err
	}
	if err := r.settleAll(ctx, holds); err != nil {
		return sample{}, err
	}
	sUS, err := evalshaUS(ctx, r.rc)
	if err != nil {
		return sample{}, err
	}
	return sample{reserveUS: rUS, settleUS: sUS}, nil
}

// setup loads c's scripts and reads the day around Redis's clock.
func (r *cellRun) setup(ctx context.Context, c cell) error {
	var err error
	if r.reserve, err = r.rc.ScriptLoad(ctx, c.reserve).Result(); err != nil {
		return err
	}
	if r.settle, err = r.rc.ScriptLoad(ctx, c.settle).Result(); err != nil {
		return err
	}
	cal, err := calendar.New(calendar.Spec{Unit: calendar.Day, Zone: "UTC"})
	if err != nil {
		return err
	}
	now, err := r.rc.Time(ctx).Result()
	if err != nil {
		return err
	}
	s1, e1 := cal.PeriodMS(now.UnixMilli())
	s0, _ := cal.PeriodMS(s1 - 1)
	_, e2 := cal.PeriodMS(e1)
	r.bounds, r.span = []any{s0, s1, e1, e2}, cal.MaxLength().Milliseconds()
	for _, id := range c.ids {
		r.lv[id] = 1
	}
	return nil
}

// keysOf are a call's keys: the periods, the hold records, and with shares the share hashes.
func (r *cellRun) keysOf(key string, shares bool) []string {
	var ks, hs []string
	for _, b := range r.bounds[:3] {
		pk := fmt.Sprintf("%s:%d", key, b)
		ks, hs = append(ks, pk), append(hs, pk+":r")
	}
	ks = append(ks, key+":h")
	if shares {
		ks = append(ks, hs...)
	}
	return ks
}

// reserveAll holds 10 units ops times, over nkeys keys and c's replica ids in turn, with
// Redis's stats reset first.
func (r *cellRun) reserveAll(ctx context.Context, c cell, ops, nkeys int) ([]hold, error) {
	if err := r.rc.ConfigResetStat(ctx).Err(); err != nil {
		return nil, err
	}
	holds := make([]hold, 0, ops)
	for i := range ops {
		key := fmt.Sprintf("rl:{bench/%d}:cal:day", i%nkeys)
		tag := fmt.Sprintf("x:%d", i)
		args := append(append([]any{int64(1e12), r.span, 1, 0}, r.bounds...), 10, tag, r.span, 1_000_000)
		id := ""
		if len(c.ids) > 0 {
			id = c.ids[i%len(c.ids)]
			args = append(args, id, r.bounds[1], r.known[key+"/"+id], 0, 0, 0, r.lv[id])
		}
		v, err := r.rc.EvalSha(ctx, r.reserve, r.keysOf(key, id != ""), args...).Int64Slice()
		if err != nil {
			return nil, err
		}
		if len(v) < 7 || v[5] != 10 {
			return nil, fmt.Errorf("reserve %d: %v, want 10 units held", i, v)
		}
		r.known[key+"/"+id] += 10
		holds = append(holds, hold{key: key, id: id, record: fmt.Sprintf("%d:10:%s", r.bounds[1], tag), deadline: v[len(v)-1]})
	}
	return holds, nil
}

// settleAll settles holds, a third giving 3 back, a third overrunning by 2, a third exact,
// with Redis's stats reset first.
func (r *cellRun) settleAll(ctx context.Context, holds []hold) error {
	if err := r.rc.ConfigResetStat(ctx).Err(); err != nil {
		return err
	}
	for i, h := range holds {
		used := []int64{7, 12, 10}[i%3]
		args := append(append([]any{int64(1e12), r.span, 0, 0}, r.bounds...), h.record, used, h.deadline)
		k := h.key + "/" + h.id
		if h.id != "" {
			// What the limiter sends: its share before its own lowering, stamped after it.
			if used < 10 {
				r.lv[h.id]++
			}
			args = append(args, h.id, r.bounds[1], r.known[k], 0, 0, 0, r.lv[h.id])
		}
		v, err := r.rc.EvalSha(ctx, r.settle, r.keysOf(h.key, h.id != ""), args...).Int64Slice()
		if err != nil {
			return err
		}
		if len(v) != 6 || v[0]-v[1] != 10-used {
			return fmt.Errorf("settle %d of %d used: %v", i, used, v)
		}
		r.known[k] += used - 10
	}
	return nil
}

// evalshaUS is Redis's time per EVALSHA since the last CONFIG RESETSTAT, in µs.
func evalshaUS(ctx context.Context, rc *redis.Client) (float64, error) {
	info, err := rc.Info(ctx, "commandstats").Result()
	if err != nil {
		return 0, err
	}
	for line := range strings.SplitSeq(info, "\n") {
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_evalsha:")
		if !ok {
			continue
		}
		var calls, usec int64
		for f := range strings.SplitSeq(rest, ",") {
			k, v, _ := strings.Cut(f, "=")
			switch k {
			case "calls":
				calls, _ = strconv.ParseInt(v, 10, 64)
			case "usec":
				usec, _ = strconv.ParseInt(v, 10, 64)
			}
		}
		if calls > 0 {
			return float64(usec) / float64(calls), nil
		}
	}
	return 0, fmt.Errorf("no EVALSHA in INFO commandstats")
}
