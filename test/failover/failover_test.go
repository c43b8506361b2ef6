// Package failover_test runs real sidecar processes against real Redis deployments on
// loopback and fails Redis over in the middle of a window (issue 20): a Sentinel group whose
// replica is kept behind before its master is killed, a Redis Cluster shard whose master dies
// while its replica is behind, a standalone Redis restarted empty. Every window must admit no
// more than its limit on every key, and the sidecars must restore what Redis lost from their
// shares. The cells are package internal/testutil/failover's, which hack/failover prints.
//
// Every cell but one runs what the chart installs (failover.TenantACL): Redis's default user
// and the sentinels have passwords only the manager holds; the manager binary runs against an
// envtest control plane with none of its intervals or modes set, gives the namespace its own
// Redis user on every node, loads the scripts on every node and watches for restarts, at its
// default --script-check-interval; the sidecars authenticate as the namespace's user from the
// Secret it writes, and may not load scripts. TestSuiteRunsTheChartsDefaults fails when one of
// those defaults changes without this suite. One Sentinel cell runs on Redis's default user
// without a manager (failover.DefaultUser), as the control: its sidecars load the scripts
// themselves.
//
// Windows are 20s, so that waiting for one to begin costs at most 20s a cell, and the sidecars
// heartbeat every 2s (--heartbeat-interval; the default is 5s), so the hold after a
// restoration, a heartbeat interval and a second, is 3s instead of 6s.
//
// $REDLINE_FAILOVER_SIDECAR names a sidecar binary to run instead of building ./cmd/sidecar:
// how these tests were checked against a sidecar from before issue 20 (docs/design/failover-shares.md);
// $REDLINE_FAILOVER_MANAGER likewise a manager binary. KUBEBUILDER_ASSETS must name the
// directory of etcd and kube-apiserver (make test sets it).
package failover_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redline-dev/redline/internal/backend"
	"github.com/redline-dev/redline/internal/controller/tenantacl"
	"github.com/redline-dev/redline/internal/testutil/failover"
	"github.com/redline-dev/redline/internal/testutil/redistest"
	"github.com/redline-dev/redline/internal/testutil/stack"
)

const (
	window    = 20 * time.Second
	heartbeat = 2 * time.Second
	// hotLimit is the limit of each one-key rule per window; keyLimit that of each key of the
	// rules spread over keys keys. The demand (32 callers; the spread rules take twice the
	// share of a hot one, and each goes round its keys) is far above both: measured 15,000-
	// 60,000 checks of a hot rule a window, 30-60 of each spread key, on 2 shared cores.
	hotLimit, keyLimit, keys = 3000, 5, 1000
	// decideBound is how long after a kill every sidecar must decide from Redis again: a
	// generous bound (Sentinel switches in 2-3s; a cluster shard's failover took the sidecars
	// 35-60s before they asked for a new slot map on failures).
	decideBound = 20 * time.Second
	// checkInterval and tenantACL are the manager's defaults this suite was written and
	// measured for: its --script-check-interval (how soon a restarted node gets its scripts and
	// users again) and --redis-tenant-acl. TestSuiteRunsTheChartsDefaults holds them to the
	// binary's, so a change of either fails here until the suite is looked at again.
	checkInterval = time.Second
	tenantACL     = "auto"
	// reactionBound is how long after every sidecar decides from Redis again and a restored
	// share's hold is over the failure mode may go on making most decisions under the manager:
	// a margin against a manager that does not react (one that never set a restarted node's
	// user again went on for the rest of the window), not a measure of speed. Measured under
	// this suite's load: the failure mode's last decision 0.2-1.3s after the switch on the hot
	// keys, up to 3.5s on the spread keys of 10 sidecars (their holds begin as each key comes
	// round again), and 1.7-2.2s on a cluster, as much in the control (the sidecars' own
	// following of the switch); the manager reacts within a check interval.
	reactionBound = 2 * checkInterval
)

// hotRules are measured on one hot key; spreadRules over keys keys.
var (
	hotRules    = []string{"fixedwindow", "slidingwindowcounter"}
	spreadRules = []string{"fixedwindow-keys", "slidingwindowcounter-keys"}
	env         *failover.Env
)

func TestMain(m *testing.M) { os.Exit(run(m)) }

func run(m *testing.M) int {
	if _, err := redistest.Binary(); err != nil {
		fmt.Fprintln(os.Stderr, "FAIL: the failover tests need a real redis-server:", err)
		return 1
	}
	if _, err := redistest.CLIBinary(); err != nil {
		fmt.Fprintln(os.Stderr, "FAIL: the failover tests need redis-cli to create a cluster:", err)
		return 1
	}
	dir, err := os.MkdirTemp("", "failover-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "FAIL:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	env, err = failover.NewEnv(ctx, failover.Options{
		Dir: dir, SidecarBin: os.Getenv("REDLINE_FAILOVER_SIDECAR"), ManagerBin: os.Getenv("REDLINE_FAILOVER_MANAGER"),
		Window: window, HeartbeatInterval: heartbeat,
		Concurrency: 32,
		Rules: []failover.Rule{
			{Name: hotRules[0], Algorithm: "FixedWindow", Limit: hotLimit, Keys: 1},
			{Name: hotRules[1], Algorithm: "SlidingWindowCounter", Limit: hotLimit, Keys: 1},
			{Name: spreadRules[0], Algorithm: "FixedWindow", Limit: keyLimit, Keys: keys, Weight: 2},
			{Name: spreadRules[1], Algorithm: "SlidingWindowCounter", Limit: keyLimit, Keys: keys, Weight: 2},
		},
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "FAIL: setting up the sidecars:", err)
		return 1
	}
	defer env.Close()
	return m.Run()
}

// cellContext bounds one cell: a window to wait for, one to measure, and the processes'
// starts and stops.
func cellContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*window+90*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func logTable(t *testing.T, cells ...*failover.Cell) {
	var b bytes.Buffer
	failover.Table(&b, cells)
	t.Logf("admitted vs limit per cell (limit and admitted over every key of the rule; switch: "+
		"Redis has a master again; decided: every sidecar decides from Redis again; closed: the last "+
		"decision of the failure mode, from the kill):\n%s", b.String())
}

// checkWindow asserts what every failover must keep: no key of any rule admitted more than its
// limit in the window, and every hot key, whose demand is far above its limit from the start
// to the end of the window, admitted at least 95% of it (what leases granted but not spent by
// the window's end, and what a replica that restored its share refused during the hold, may
// be missing).
func checkWindow(t *testing.T, c *failover.Cell) {
	t.Helper()
	for _, r := range c.Rules {
		if r.OverKeys > 0 || r.MaxKey > r.Limit {
			t.Errorf("%s: %d of %d keys admitted more than the limit %d in the window (at most %d)",
				r.Name, r.OverKeys, r.Keys, r.Limit, r.MaxKey)
		}
		if r.Demand <= int64(r.Keys)*r.Limit {
			t.Errorf("%s: the demand (%d checks) was not above the limit (%d over %d keys): the cell measures nothing",
				r.Name, r.Demand, r.Limit, r.Keys)
		}
		if r.Keys == 1 && r.Admitted*100 < r.Limit*95 {
			t.Errorf("%s: the hot key admitted %d, less than 95%% of its limit %d", r.Name, r.Admitted, r.Limit)
		}
	}
	if c.Decided == 0 || c.Decided > decideBound {
		t.Errorf("the sidecars decided from Redis again %.1fs after the kill (0: one never did); want within %s",
			c.Decided.Seconds(), decideBound)
	}
	if c.Auth == failover.TenantACL {
		checkFailureModeEnded(t, c)
	}
	var restored float64
	for _, v := range c.Restored {
		restored += v
	}
	if restored == 0 {
		t.Errorf("no sidecar restored a unit (redline_sidecar_restored_units_total): Redis lost nothing, or the sidecars did not notice")
	}
}

// checkFailureModeEnded asserts that the manager reacted: once every sidecar decides from
// Redis again and a restored share's hold (a heartbeat interval and a second) is over, plus
// reactionBound, no sidecar's failure mode makes most of its decisions any more. A manager that
// never set a restarted node's user or scripts again leaves the failure mode deciding nearly
// all of them to the window's end. A share, not the last failure-mode decision: on a loaded
// machine a Redis call past the chart's 50ms timeout, or a breaker it opens for a second, makes
// a failure-mode decision at any time, Redis or no Redis. When the window ends first there is
// nothing to weigh, and the cell says so.
func checkFailureModeEnded(t *testing.T, c *failover.Cell) {
	t.Helper()
	from := max(c.Decided, c.Switch) + heartbeat + time.Second + reactionBound
	for s := range c.AfterKill {
		share, over := c.DegradedShare(s, from)
		if over < time.Second {
			t.Logf("sidecar %d: the demand ended %.1fs after %.1fs from the kill: too soon to weigh the failure mode's share",
				s, over.Seconds(), from.Seconds())
			continue
		}
		t.Logf("sidecar %d: the failure mode made %.1f%% of the decisions from %.1fs after the kill (%.1fs)", s, 100*share, from.Seconds(), over.Seconds())
		if share >= 0.5 {
			t.Errorf("sidecar %d: the failure mode made %.0f%% of its decisions from %.1fs after the kill (Redis had a master again after %.1fs, every sidecar decided from it after %.1fs): want under half, the manager's reaction at a %s check interval",
				s, 100*share, from.Seconds(), c.Switch.Seconds(), c.Decided.Seconds(), checkInterval)
		}
	}
}

// Sentinel: the replica is kept behind (its ACL user disabled on the master, its link cut)
// when every hot key has admitted a quarter of its limit, the master is killed at half, and
// Sentinel promotes the replica, which lacks what was counted in between. 3 and 10 sidecars,
// leases on and off, FixedWindow and SlidingWindowCounter, one hot key and 1,000 keys, under
// the chart's defaults; and the control: 3 leasing sidecars on Redis's default user, no manager.
func TestSentinelFailoverKeepsEveryWindowWithinItsLimit(t *testing.T) {
	var cells []*failover.Cell
	t.Cleanup(func() { logTable(t, cells...) })
	type cell struct {
		auth   failover.Auth
		n      int
		leases bool
	}
	var tcs []cell
	for _, n := range []int{3, 10} {
		for _, leases := range []bool{true, false} {
			tcs = append(tcs, cell{failover.TenantACL, n, leases})
		}
	}
	tcs = append(tcs, cell{failover.DefaultUser, 3, true})
	for _, tc := range tcs {
		n, leases := tc.n, tc.leases
		name := fmt.Sprintf("sidecars=%d/leases=%t", n, leases)
		if tc.auth == failover.DefaultUser {
			name = "default-user/" + name
		}
		t.Run(name, func(t *testing.T) {
			c, err := env.Sentinel(cellContext(t), tc.auth, n, leases, failover.Timing{CutAt: 0.25, KillAt: 0.5})
			if err != nil {
				t.Fatal(err)
			}
			cells = append(cells, c)
			logTable(t, c)
			checkWindow(t, c)
			for _, r := range c.Rules {
				// A spread key's demand (30-60 checks a window, spread over it) may leave
				// one short of its limit of 5 on a loaded machine, after the switch and the
				// hold, or with leased units not spent by the window's end; all of them
				// together are not far short (measured: every key admitted exactly 5).
				if r.Keys > 1 && r.Admitted*100 < int64(r.Keys)*r.Limit*80 {
					t.Errorf("%s: %d keys admitted %d together, less than 80%% of their limits (%d)",
						r.Name, r.Keys, r.Admitted, int64(r.Keys)*r.Limit)
				}
			}
		})
	}
}

// Redis Cluster, 3 masters with a replica each: the shard of the hot keys has its replica cut
// off at a quarter of the limit and its master killed at half; the replica is promoted by
// CLUSTER FAILOVER TAKEOVER, or by the cluster itself once the master is past the node timeout
// (2s, redistest). The sidecars decide on the new master within seconds and restore the window.
func TestClusterFailoverDecidesOnTheNewMasterAndRestoresTheWindow(t *testing.T) {
	var cells []*failover.Cell
	t.Cleanup(func() { logTable(t, cells...) })
	for _, tc := range []struct {
		name     string
		takeover bool
		leases   bool
	}{
		{"takeover/leases=true", true, true},
		{"by-the-cluster/leases=false", false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := env.Cluster(cellContext(t), failover.TenantACL, 3, tc.leases, tc.takeover, hotRules, failover.Timing{CutAt: 0.25, KillAt: 0.5})
			if err != nil {
				t.Fatal(err)
			}
			cells = append(cells, c)
			logTable(t, c)
			t.Logf("the replica was master %.2fs after the kill; every sidecar decided from it %.2fs after the kill",
				c.Switch.Seconds(), c.Decided.Seconds())
			checkWindow(t, c)
		})
	}
}

// A standalone Redis without persistence killed at half the hot limits and restarted empty
// at once: every sidecar restores its shares (within a heartbeat interval of the restart for
// one deciding from a lease), says so in its metrics, and the window admits no more than its
// limit.
func TestRedisRestartedEmptyIsRestoredWithinTheWindow(t *testing.T) {
	c, err := env.Restart(cellContext(t), failover.TenantACL, 3, true, hotRules, failover.Timing{KillAt: 0.5})
	if err != nil {
		t.Fatal(err)
	}
	logTable(t, c)
	t.Logf("Redis answered %.2fs after the kill; every sidecar had restored units %.2fs after it",
		c.Switch.Seconds(), c.RestoredIn.Seconds())
	checkWindow(t, c)
	for i := range c.Restored {
		if c.Restored[i] == 0 || c.Regressions[i] == 0 {
			t.Errorf("sidecar %d: redline_sidecar_restored_units_total %v, redline_sidecar_counter_regressions_total %v: want both risen",
				i, c.Restored[i], c.Regressions[i])
		}
	}
	if c.RestoredIn == 0 || c.RestoredIn > c.Switch+heartbeat+3*time.Second {
		t.Errorf("every sidecar had restored its shares %.2fs after the kill (0: not within the window), Redis answered after %.2fs: want within a heartbeat interval (%s) and a margin",
			c.RestoredIn.Seconds(), c.Switch.Seconds(), heartbeat)
	}
}

// The suite runs what the chart installs: the manager binary's own defaults for the tenant ACL
// mode and the script check interval, which the chart does not set and the Env does not pass,
// are the ones this suite was written for (checkInterval, tenantACL) and the controller's
// (backend.DefaultCheckInterval, tenantacl.ModeAuto). A default changed in one place
// only, or set by the chart or the Env, fails here.
func TestSuiteRunsTheChartsDefaults(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	defaults, err := env.ManagerDefaults(ctx)
	if err != nil {
		t.Fatal(err)
	}
	interval, err := time.ParseDuration(defaults[failover.FlagScriptCheckInterval])
	if err != nil {
		t.Fatalf("the manager's -%s default %q: %v", failover.FlagScriptCheckInterval, defaults[failover.FlagScriptCheckInterval], err)
	}
	if interval != backend.DefaultCheckInterval {
		t.Errorf("the manager's -%s defaults to %s, not backend.DefaultCheckInterval (%s)",
			failover.FlagScriptCheckInterval, interval, backend.DefaultCheckInterval)
	}
	if interval != checkInterval {
		t.Errorf("the manager's -%s defaults to %s; this suite was written and measured for %s: look at its bounds and the numbers of docs/design/failover-shares.md again",
			failover.FlagScriptCheckInterval, interval, checkInterval)
	}
	acl := defaults[failover.FlagTenantACL]
	if acl != tenantacl.ModeAuto {
		t.Errorf("the manager's -%s defaults to %q, not tenantacl.ModeAuto (%q)", failover.FlagTenantACL, acl, tenantacl.ModeAuto)
	}
	if acl != tenantACL {
		t.Errorf("the manager's -%s defaults to %q; this suite was written for %q", failover.FlagTenantACL, acl, tenantACL)
	}
	for _, a := range env.ManagerArgs() {
		for _, f := range []string{failover.FlagScriptCheckInterval, failover.FlagTenantACL} {
			if strings.HasPrefix(strings.TrimLeft(a, "-"), f) {
				t.Errorf("the suite's manager runs with %s: it must run at the default", a)
			}
		}
	}
	root, err := stack.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"charts/redline/templates/deployment.yaml", "charts/redline/values.yaml"} {
		data, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		for _, flag := range []string{failover.FlagScriptCheckInterval, failover.FlagTenantACL} {
			if strings.Contains(string(data), flag) {
				t.Errorf("%s sets --%s: the chart would not ship the default this suite runs", f, flag)
			}
		}
	}
}
