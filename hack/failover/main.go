// Command failover measures what a Redis Sentinel failover with a replica behind does to
// Redline's limits (issue 20): the admitted count of one window across the failover, against the
// limit, per algorithm, with leases on and off, for several sidecar counts.
//
//	go run ./hack/failover [-sidecars 3,10] [-limit 20000] [-window 1m] [-keys 0] [-concurrency 32]
//
// Each cell starts a Sentinel group on loopback (redistest.StartSentinel: a master, a replica,
// three sentinels) and N sidecar processes (./cmd/sidecar, built once, or -sidecar-bin) on its
// redis+sentinel:// URL, failure mode Closed, with a FixedWindow and a SlidingWindowCounter rule
// of -limit per -window on one hot key (and, with -keys, two more spread over that many keys).
// It waits for the start of a window (windows are aligned to their length on Redis's clock, so
// the whole cell is one window), sends demand far above the limit through /v1/check, cuts the
// replica off when both hot rules have admitted a quarter of the limit (-cut-at), kills the
// master (SIGKILL) at half of it (-kill-at), so that the replica Sentinel promotes lacks a
// quarter of the limit, and keeps the demand up until -tail after the switch. The cells are
// those of package internal/testutil/failover, which test/failover asserts on. Every process is
// ended on success, failure or Ctrl-C; every loop is bounded in time.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redline-dev/redline/internal/testutil/failover"
)

func main() {
	var sidecars, bin string
	var limit, keys, keyLimit, concurrency int
	var t failover.Timing
	var keep bool
	flag.BoolVar(&keep, "keep", false, "keep the work directory with every sidecar's log")
	var window, heartbeat, timeout time.Duration
	flag.StringVar(&sidecars, "sidecars", "3,10", "sidecar counts, one failover each (leases on and off)")
	flag.IntVar(&limit, "limit", 20_000, "each hot rule's limit per window")
	flag.DurationVar(&window, "window", time.Minute, "every rule's window")
	flag.IntVar(&keys, "keys", 0, "also measure a FixedWindow and a SlidingWindowCounter rule over this many keys (0: none)")
	flag.IntVar(&keyLimit, "key-limit", 5, "the limit per key and window of the -keys rules")
	flag.Float64Var(&t.CutAt, "cut-at", 0.25, "fraction of the limit admitted when the replica is cut off (0: from the start)")
	flag.Float64Var(&t.KillAt, "kill-at", 0.5, "fraction of the limit admitted when the master is killed (within 10s of the cut, or Sentinel refuses the replica)")
	flag.DurationVar(&t.Tail, "tail", 15*time.Second, "how long the demand goes on after the switch (0: until the window ends)")
	flag.IntVar(&concurrency, "concurrency", 32, "concurrent /v1/check callers, round-robin over the sidecars")
	flag.StringVar(&bin, "sidecar-bin", "", "a sidecar binary to measure (default: build ./cmd/sidecar)")
	flag.DurationVar(&heartbeat, "heartbeat-interval", 0, "the sidecars' --heartbeat-interval (0: their default)")
	flag.DurationVar(&timeout, "timeout", 15*time.Minute, "give up after this long")
	flag.Parse()
	var ns []int
	var err error
	for f := range strings.SplitSeq(sidecars, ",") {
		n, aerr := strconv.Atoi(strings.TrimSpace(f))
		if aerr != nil || n < 1 || n > 64 {
			err = fmt.Errorf("bad -sidecars entry %q: want 1 to 64", f)
			break
		}
		ns = append(ns, n)
	}
	if err == nil && (limit < 100 || concurrency < 1 || keys < 0 || keys == 1 || keyLimit < 1) {
		err = errors.New("-limit must be at least 100, -concurrency and -key-limit at least 1, -keys 0 or at least 2")
	}
	if err == nil {
		err = run(keep, ns, limit, keys, keyLimit, concurrency, window, heartbeat, timeout, bin, t)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "failover:", err)
		os.Exit(1)
	}
}

var began = time.Now()

func progress(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "[%5.1fs] %s\n", time.Since(began).Seconds(), fmt.Sprintf(format, args...))
}

func run(keep bool, ns []int, limit, keys, keyLimit, concurrency int, window, heartbeat, timeout time.Duration, bin string, t failover.Timing) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	dir, err := os.MkdirTemp("", "redline-failover-")
	if err != nil {
		return fmt.Errorf("creating a work directory: %w", err)
	}
	if keep {
		progress("keeping the sidecars' logs in %s", dir)
	} else {
		defer func() { _ = os.RemoveAll(dir) }()
	}
	rules := []failover.Rule{
		{Name: "fixedwindow", Algorithm: "FixedWindow", Limit: int64(limit), Keys: 1},
		{Name: "slidingwindowcounter", Algorithm: "SlidingWindowCounter", Limit: int64(limit), Keys: 1},
	}
	if keys > 0 {
		rules = append(rules,
			failover.Rule{Name: "fixedwindow-keys", Algorithm: "FixedWindow", Limit: int64(keyLimit), Keys: keys, Weight: 2},
			failover.Rule{Name: "slidingwindowcounter-keys", Algorithm: "SlidingWindowCounter", Limit: int64(keyLimit), Keys: keys, Weight: 2})
	}
	env, err := failover.NewEnv(ctx, failover.Options{Dir: dir, SidecarBin: bin, Window: window, Rules: rules,
		HeartbeatInterval: heartbeat, Concurrency: concurrency, Progress: progress})
	if err != nil {
		return err
	}
	defer env.Close()
	var cells []*failover.Cell
	for _, n := range ns {
		for _, leases := range []bool{true, false} {
			c, err := env.Sentinel(ctx, n, leases, t)
			if err != nil {
				return err
			}
			cells = append(cells, c)
		}
	}
	failover.Table(os.Stdout, cells)
	return nil
}
