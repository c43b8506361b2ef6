// Command failover measures what a Redis failover with a replica behind does to Redline's
// limits (issue 20): the admitted count of one window across the failover, against the limit,
// per algorithm, with leases on and off, for several sidecar counts; and how long the sidecars
// decide by their failure mode after Redis has a master again (issue 25).
//
//	go run ./hack/failover [-scenarios sentinel] [-auth tenant] [-sidecars 3,10] [-limit 20000]
//	    [-window 1m] [-keys 0] [-concurrency 32] [-manager-arg --script-check-interval=10s]
//
// -auth tenant (the default) runs what the chart installs: admin passwords on Redis and the
// sentinels, the manager binary (./cmd/manager, built once, or -manager-bin) at its default
// flags against an envtest control plane (KUBEBUILDER_ASSETS, or hack/setup-envtest.sh), and
// sidecars on their namespace's ACL user, which may not load scripts. -auth default runs the
// sidecars on Redis's default user without a manager, as the control. -manager-arg adds a flag
// to the manager (repeatable): how the 10 s script check interval before issue 25 is measured.
// -scenarios picks the cells: sentinel, cluster (a shard's replica promoted by CLUSTER FAILOVER
// TAKEOVER), cluster-auto (promoted by the cluster), restart (a standalone Redis restarted
// empty).
//
// Each cell starts a Sentinel group on loopback (redistest.StartSentinel: a master, a replica,
// three sentinels) and N sidecar processes (./cmd/sidecar, built once, or -sidecar-bin) on its
// redis+sentinel:// URL, failure mode Closed, with a FixedWindow and a SlidingWindowCounter rule
// of -limit per -window on one hot key (and, with -keys, two more spread over that many keys).
// It waits for the start of a window (windows are aligned to their length on Redis's clock, so
// the whole cell is one window), sends demand far above the limit through /v1/check, cuts the
// replica off when both hot rules have admitted a quarter of the limit (-cut-at), kills the
// master (SIGKILL) at half of it (-kill-at), so that the replica Sentinel promotes lacks a
// quarter of the limit, and keeps the demand up until -tail after the switch. The cluster and
// restart cells do the same on a Redis Cluster shard and a standalone server. The cells are
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
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redline-dev/redline/internal/testutil/failover"
)

// repeated is a flag that may be given several times.
type repeated []string

func (r *repeated) String() string     { return strings.Join(*r, " ") }
func (r *repeated) Set(v string) error { *r = append(*r, v); return nil }

// config is what the flags say.
type config struct {
	keep                               bool
	ns                                 []int
	limit, keys, keyLimit, concurrency int
	window, heartbeat, timeout         time.Duration
	bin, managerBin, auth              string
	scenarios                          []string
	managerArgs                        repeated
	t                                  failover.Timing
}

var scenarioNames = []string{"sentinel", "cluster", "cluster-auto", "restart"}

func main() {
	var cfg config
	var sidecars, scenarios string
	flag.StringVar(&scenarios, "scenarios", "sentinel", "cells to run, comma-separated: "+strings.Join(scenarioNames, ", "))
	flag.StringVar(&cfg.auth, "auth", "tenant", "tenant: the chart's defaults, the manager and per-namespace ACL users; default: Redis's default user, no manager (the control)")
	flag.StringVar(&cfg.managerBin, "manager-bin", "", "a manager binary to run (default: build ./cmd/manager)")
	flag.Var(&cfg.managerArgs, "manager-arg", "a flag added to the manager's (repeatable), e.g. --script-check-interval=10s")
	flag.BoolVar(&cfg.keep, "keep", false, "keep the work directory with every sidecar's log")
	flag.StringVar(&sidecars, "sidecars", "3,10", "sidecar counts, one failover each (leases on and off)")
	flag.IntVar(&cfg.limit, "limit", 20_000, "each hot rule's limit per window")
	flag.DurationVar(&cfg.window, "window", time.Minute, "every rule's window")
	flag.IntVar(&cfg.keys, "keys", 0, "also measure a FixedWindow and a SlidingWindowCounter rule over this many keys (0: none)")
	flag.IntVar(&cfg.keyLimit, "key-limit", 5, "the limit per key and window of the -keys rules")
	flag.Float64Var(&cfg.t.CutAt, "cut-at", 0.25, "fraction of the limit admitted when the replica is cut off (0: from the start; the restart cell cuts nothing)")
	flag.Float64Var(&cfg.t.KillAt, "kill-at", 0.5, "fraction of the limit admitted when the master is killed (within 10s of the cut, or Sentinel refuses the replica)")
	flag.DurationVar(&cfg.t.Tail, "tail", 15*time.Second, "how long the demand goes on after the switch (0: until the window ends)")
	flag.IntVar(&cfg.concurrency, "concurrency", 32, "concurrent /v1/check callers, round-robin over the sidecars")
	flag.StringVar(&cfg.bin, "sidecar-bin", "", "a sidecar binary to measure (default: build ./cmd/sidecar)")
	flag.DurationVar(&cfg.heartbeat, "heartbeat-interval", 0, "the sidecars' --heartbeat-interval (0: their default)")
	flag.DurationVar(&cfg.timeout, "timeout", 15*time.Minute, "give up after this long")
	flag.Parse()
	var err error
	for f := range strings.SplitSeq(sidecars, ",") {
		n, aerr := strconv.Atoi(strings.TrimSpace(f))
		if aerr != nil || n < 1 || n > 64 {
			err = errors.Join(err, fmt.Errorf("bad -sidecars entry %q: want 1 to 64", f))
		}
		cfg.ns = append(cfg.ns, n)
	}
	if cfg.limit < 100 || cfg.concurrency < 1 || cfg.keys < 0 || cfg.keys == 1 || cfg.keyLimit < 1 {
		err = errors.Join(err, errors.New("-limit must be at least 100, -concurrency and -key-limit at least 1, -keys 0 or at least 2"))
	}
	for sc := range strings.SplitSeq(scenarios, ",") {
		sc = strings.TrimSpace(sc)
		if !slices.Contains(scenarioNames, sc) {
			err = errors.Join(err, fmt.Errorf("bad -scenarios entry %q: want %s", sc, strings.Join(scenarioNames, ", ")))
		}
		cfg.scenarios = append(cfg.scenarios, sc)
	}
	if cfg.auth != "tenant" && cfg.auth != "default" {
		err = errors.Join(err, fmt.Errorf("-auth=%q: want tenant or default", cfg.auth))
	}
	if err == nil {
		err = run(cfg)
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

func run(cfg config) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, cfg.timeout)
	defer cancel()
	dir, err := os.MkdirTemp("", "redline-failover-")
	if err != nil {
		return fmt.Errorf("creating a work directory: %w", err)
	}
	if cfg.keep {
		progress("keeping the sidecars' logs in %s", dir)
	} else {
		defer func() { _ = os.RemoveAll(dir) }()
	}
	rules := []failover.Rule{
		{Name: "fixedwindow", Algorithm: "FixedWindow", Limit: int64(cfg.limit), Keys: 1},
		{Name: "slidingwindowcounter", Algorithm: "SlidingWindowCounter", Limit: int64(cfg.limit), Keys: 1},
	}
	if cfg.keys > 0 {
		rules = append(rules,
			failover.Rule{Name: "fixedwindow-keys", Algorithm: "FixedWindow", Limit: int64(cfg.keyLimit), Keys: cfg.keys, Weight: 2},
			failover.Rule{Name: "slidingwindowcounter-keys", Algorithm: "SlidingWindowCounter", Limit: int64(cfg.keyLimit), Keys: cfg.keys, Weight: 2})
	}
	hot := []string{rules[0].Name, rules[1].Name}
	env, err := failover.NewEnv(ctx, failover.Options{Dir: dir, SidecarBin: cfg.bin, Window: cfg.window, Rules: rules,
		HeartbeatInterval: cfg.heartbeat, Concurrency: cfg.concurrency, Progress: progress,
		ManagerBin: cfg.managerBin, ManagerArgs: cfg.managerArgs, InstallTools: true})
	if err != nil {
		return err
	}
	defer env.Close()
	auth := failover.TenantACL
	if cfg.auth == "default" {
		auth = failover.DefaultUser
	}
	if auth == failover.TenantACL {
		defaults, err := env.ManagerDefaults(ctx)
		if err != nil {
			return err
		}
		progress("manager defaults: --%s=%s --%s=%s; added flags: %q", failover.FlagScriptCheckInterval, defaults[failover.FlagScriptCheckInterval],
			failover.FlagTenantACL, defaults[failover.FlagTenantACL], env.ManagerArgs())
	}
	var cells []*failover.Cell
	for _, sc := range cfg.scenarios {
		for _, n := range cfg.ns {
			for _, leases := range []bool{true, false} {
				var c *failover.Cell
				var err error
				switch sc {
				case "sentinel":
					c, err = env.Sentinel(ctx, auth, n, leases, cfg.t)
				case "cluster", "cluster-auto":
					c, err = env.Cluster(ctx, auth, n, leases, sc == "cluster", hot, cfg.t)
				case "restart":
					t := cfg.t
					t.CutAt = 0
					c, err = env.Restart(ctx, auth, n, leases, hot, t)
				}
				if err != nil {
					return err
				}
				cells = append(cells, c)
			}
		}
	}
	failover.Table(os.Stdout, cells)
	fmt.Println()
	fmt.Println("the failure mode's last decision of each sidecar, from the kill:")
	for _, c := range cells {
		var each []string
		for _, d := range c.ClosedBySidecar {
			each = append(each, fmt.Sprintf("%.1fs", d.Seconds()))
		}
		fmt.Printf("%-40s %-12s %2d sidecars, leases %-5t switch %5.1fs: %s\n", c.Scenario, c.Auth, c.Sidecars, c.Leases, c.Switch.Seconds(), strings.Join(each, " "))
	}
	return nil
}
