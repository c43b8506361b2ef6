// Command scriptcost measures what the window scripts cost Redis, side by side in one run: the
// scripts of a base commit against the working tree's, Redis CPU per call (INFO commandstats,
// usec_per_call of EVALSHA, and the process's CPU time per call from INFO cpu, the command's
// parsing and replies included) and memory per key (MEMORY USAGE, key name included), for 1, 3
// and 10 replicas granted in each window. Issue 20's budget: at most 1.2x of the base for both.
//
//	go run ./cmd/scriptcost -root ../.. [-base 73eefbc] [-keys 2000] [-calls 60000] [-rounds 5]
//
// usec_per_call is wall time inside the command, so a busy machine inflates it: the versions
// alternate over -rounds rounds and each figure is the least of its rounds.
//
// Every call is a grant of one unit on one of -keys keys of a one-hour window, round-robin over
// the replicas, each passing what it knows of its share, as a sidecar does. Each version runs
// on its own fresh redis-server, one after the other; the table prints the ratio.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redline-dev/redline/hack/bench/internal/machine"

	"github.com/redline-dev/redline/internal/limiter/scripts"
	"github.com/redline-dev/redline/internal/testutil/redistest"
)

func main() {
	root := flag.String("root", "../..", "the repository")
	base := flag.String("base", "73eefbc", "the commit whose scripts are the base")
	keys := flag.Int("keys", 2000, "keys per run")
	calls := flag.Int("calls", 60000, "script calls per run")
	rounds := flag.Int("rounds", 5, "runs of each version, alternating; the least of each figure is kept")
	flag.Parse()
	if *rounds < 1 {
		*rounds = 1
	}
	if err := run(*root, *base, *keys, *calls, *rounds); err != nil {
		fmt.Fprintln(os.Stderr, "scriptcost:", err)
		os.Exit(1)
	}
}

// version is one set of window scripts.
type version struct {
	name   string
	source map[string]string // algorithm -> script
	shares bool              // passes the replica's id and shares
}

// cost is what one run measured.
type cost struct {
	scriptUS, cpuUS, bytes float64
}

// least keeps the least of each figure.
func (c *cost) least(o cost) {
	if c.scriptUS == 0 || o.scriptUS < c.scriptUS {
		c.scriptUS = o.scriptUS
	}
	if c.cpuUS == 0 || o.cpuUS < c.cpuUS {
		c.cpuUS = o.cpuUS
	}
	c.bytes = o.bytes // the same in every run
}

func run(root, base string, keys, calls, rounds int) error {
	old, err := baseScripts(root, base)
	if err != nil {
		return err
	}
	now := version{name: "now", source: map[string]string{}, shares: true}
	for _, alg := range []string{"FixedWindow", "SlidingWindowCounter"} {
		s, ok := scripts.For(alg)
		if !ok {
			return fmt.Errorf("no script %s", alg)
		}
		now.source[alg] = s.Source
	}
	fmt.Printf("| algorithm | replicas | script us/call %[1]s | now | ratio | Redis CPU us/call %[1]s | now | ratio | bytes/key %[1]s | now | ratio |\n", base)
	fmt.Println("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
	for _, alg := range []string{"FixedWindow", "SlidingWindowCounter"} {
		for _, replicas := range []int{1, 3, 10} {
			var c0, c1 cost
			for range rounds {
				m0, err := measure(old, alg, replicas, keys, calls)
				if err != nil {
					return err
				}
				c0.least(m0)
				m1, err := measure(now, alg, replicas, keys, calls)
				if err != nil {
					return err
				}
				c1.least(m1)
			}
			fmt.Printf("| %s | %d | %.2f | %.2f | %.2fx | %.2f | %.2f | %.2fx | %.0f | %.0f | %.2fx |\n", alg, replicas,
				c0.scriptUS, c1.scriptUS, c1.scriptUS/c0.scriptUS, c0.cpuUS, c1.cpuUS, c1.cpuUS/c0.cpuUS, c0.bytes, c1.bytes, c1.bytes/c0.bytes)
		}
	}
	return nil
}

// baseScripts reads the window scripts of commit base with git.
func baseScripts(root, base string) (version, error) {
	v := version{name: base, source: map[string]string{}}
	for alg, file := range map[string]string{"FixedWindow": "fixed_window.lua", "SlidingWindowCounter": "sliding_window_counter.lua"} {
		out, err := exec.Command("git", "-C", root, "show", base+":internal/limiter/scripts/lua/"+file).Output()
		if err != nil {
			return v, fmt.Errorf("reading %s of %s: %w", file, base, err)
		}
		v.source[alg] = string(out)
	}
	return v, nil
}

// measure runs calls grants of v's alg script on a fresh redis-server and returns what they
// cost it.
func measure(v version, alg string, replicas, keys, calls int) (cost, error) {
	srv, err := redistest.Start()
	if err != nil {
		return cost{}, err
	}
	defer func() { _ = srv.Close() }()
	ctx := context.Background()
	c := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer func() { _ = c.Close() }()
	sha, err := c.ScriptLoad(ctx, v.source[alg]).Result()
	if err != nil {
		return cost{}, fmt.Errorf("loading %s of %s: %w", alg, v.name, err)
	}
	cpu0, err := machine.RedisCPU(ctx, c)
	if err != nil {
		return cost{}, err
	}
	ids := make([]string, replicas)
	for i := range ids {
		ids[i] = fmt.Sprintf("r%07d", i) // 8 characters, as limiter.NewReplicaID
	}
	key := func(k int) string {
		return fmt.Sprintf("rl:{shop/checkout/per-api-key/%032x}:swc", k)
	}
	const window = int64(time.Hour / time.Millisecond)
	known := map[[2]int]int64{}
	var start int64
	pipe := c.Pipeline()
	flush := func() error {
		cmds, err := pipe.Exec(ctx)
		if err != nil {
			return fmt.Errorf("running %s of %s: %w", alg, v.name, err)
		}
		for _, cmd := range cmds {
			n, err := cmd.(*redis.Cmd).Int64Slice()
			if err != nil || len(n) < 6 {
				return fmt.Errorf("reply of %s of %s: %v %v", alg, v.name, n, err)
			}
			start = n[4] / 1000 / window * window
		}
		return nil
	}
	for i := range calls {
		k, r := i%keys, (i/keys)%replicas
		args := []any{"evalsha", sha, 1, key(k), 1_000_000_000, window, 1, 0, 1}
		if v.shares {
			args = append(args, ids[r], start, known[[2]int{r, k}], 0)
			known[[2]int{r, k}]++
		}
		pipe.Do(ctx, args...)
		if pipe.Len() == 64 {
			if err := flush(); err != nil {
				return cost{}, err
			}
		}
	}
	if err := flush(); err != nil {
		return cost{}, err
	}
	cpu1, err := machine.RedisCPU(ctx, c)
	if err != nil {
		return cost{}, err
	}
	us, err := usecPerCall(ctx, c)
	if err != nil {
		return cost{}, err
	}
	var total int64
	for k := range keys {
		n, err := c.MemoryUsage(ctx, key(k)).Result()
		if err != nil {
			return cost{}, fmt.Errorf("MEMORY USAGE: %w", err)
		}
		total += n
	}
	return cost{scriptUS: us, cpuUS: float64((cpu1 - cpu0).Microseconds()) / float64(calls), bytes: float64(total) / float64(keys)}, nil
}

// usecPerCall reads EVALSHA's usec_per_call from INFO commandstats.
func usecPerCall(ctx context.Context, c *redis.Client) (float64, error) {
	info, err := c.Info(ctx, "commandstats").Result()
	if err != nil {
		return 0, fmt.Errorf("INFO commandstats: %w", err)
	}
	for line := range strings.SplitSeq(info, "\n") {
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_evalsha:")
		if !ok {
			continue
		}
		for f := range strings.SplitSeq(rest, ",") {
			if v, ok := strings.CutPrefix(f, "usec_per_call="); ok {
				return strconv.ParseFloat(v, 64)
			}
		}
	}
	return 0, errors.New("no cmdstat_evalsha in INFO commandstats")
}
