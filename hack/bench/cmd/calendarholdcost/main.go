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

func measure(c cell, ops, nkeys int) (sample, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	srv, err := redistest.Start()
	if err != nil {
		return sample{}, err
	}
	defer srv.Close()
	rc := srv.Client("")
	defer rc.Close()
	reserve, err := rc.ScriptLoad(ctx, c.reserve).Result()
	if err != nil {
		return sample{}, err
	}
	settle, err := rc.ScriptLoad(ctx, c.settle).Result()
	if err != nil {
		return sample{}, err
	}
	cal, err := calendar.New(calendar.Spec{Unit: calendar.Day, Zone: "UTC"})
	if err != nil {
		return sample{}, err
	}
	now, err := rc.Time(ctx).Result()
	if err != nil {
		return sample{}, err
	}
	s1, e1 := cal.PeriodMS(now.UnixMilli())
	s0, _ := cal.PeriodMS(s1 - 1)
	_, e2 := cal.PeriodMS(e1)
	bounds := []any{s0, s1, e1, e2}
	span := cal.MaxLength().Milliseconds()
	type hold struct {
		key, id, record string
		deadline        int64
	}
	known := map[string]int64{} // key/id: the replica's share
	lv := map[string]int64{}    // id: its count of lowerings, from 1
	for _, id := range c.ids {
		lv[id] = 1
	}
	keysOf := func(key string, shares bool) []string {
		ks := []string{}
		for _, b := range []int64{s0, s1, e1} {
			ks = append(ks, key+":"+strconv.FormatInt(b, 10))
		}
		ks = append(ks, key+":h")
		if shares {
			for _, b := range []int64{s0, s1, e1} {
				ks = append(ks, key+":"+strconv.FormatInt(b, 10)+":r")
			}
		}
		return ks
	}
	if err := rc.ConfigResetStat(ctx).Err(); err != nil {
		return sample{}, err
	}
	holds := make([]hold, 0, ops)
	for i := range ops {
		key := fmt.Sprintf("rl:{bench/%d}:cal:day", i%nkeys)
		args := append([]any{int64(1e12), span, 1, 0}, bounds...)
		tag := fmt.Sprintf("x:%d", i)
		args = append(args, 10, tag, span, 1_000_000)
		id := ""
		if len(c.ids) > 0 {
			id = c.ids[i%len(c.ids)]
			args = append(args, id, s1, known[key+"/"+id], 0, 0, 0, lv[id])
		}
		v, err := rc.EvalSha(ctx, reserve, keysOf(key, id != ""), args...).Int64Slice()
		if err != nil {
			return sample{}, err
		}
		if len(v) < 7 || v[5] != 10 {
			return sample{}, fmt.Errorf("reserve %d: %v, want 10 units held", i, v)
		}
		known[key+"/"+id] += 10
		holds = append(holds, hold{key: key, id: id, record: fmt.Sprintf("%d:10:%s", s1, tag), deadline: v[len(v)-1]})
	}
	rUS, err := evalshaUS(ctx, rc)
	if err != nil {
		return sample{}, err
	}
	if err := rc.ConfigResetStat(ctx).Err(); err != nil {
		return sample{}, err
	}
	for i, h := range holds {
		used := []int64{7, 12, 10}[i%3]
		args := append([]any{int64(1e12), span, 0, 0}, bounds...)
		args = append(args, h.record, used, h.deadline)
		k := h.key + "/" + h.id
		if h.id != "" {
			// What the limiter sends: its share before its own lowering, stamped after it.
			if used < 10 {
				lv[h.id]++
			}
			args = append(args, h.id, s1, known[k], 0, 0, 0, lv[h.id])
		}
		v, err := rc.EvalSha(ctx, settle, keysOf(h.key, h.id != ""), args...).Int64Slice()
		if err != nil {
			return sample{}, err
		}
		if len(v) != 6 || v[0]-v[1] != 10-used {
			return sample{}, fmt.Errorf("settle %d of %d used: %v", i, used, v)
		}
		known[k] += used - 10
	}
	sUS, err := evalshaUS(ctx, rc)
	if err != nil {
		return sample{}, err
	}
	return sample{reserveUS: rUS, settleUS: sUS}, nil
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
