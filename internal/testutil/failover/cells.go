package failover

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redline-dev/redline/internal/keyscheme"
	"github.com/redline-dev/redline/internal/testutil/redistest"
)

// Timing says when a cell cuts the replica off and kills the master: when every one-key rule
// has admitted CutAt (0: at once) and KillAt of its limit.
type Timing struct {
	CutAt, KillAt float64
	// Tail, when positive, ends the demand this long after the switch instead of just before
	// the window ends.
	Tail time.Duration
}

func (t Timing) valid() error {
	if t.CutAt < 0 || t.KillAt <= t.CutAt || t.KillAt >= 1 {
		return fmt.Errorf("failover: want 0 <= cut at (%v) < kill at (%v) < 1", t.CutAt, t.KillAt)
	}
	return nil
}

// Sentinel is one failover of a Sentinel group (redistest.StartSentinelWith) under n sidecars
// on its redis+sentinel:// URL: the replica cut off (CutReplica) at t.CutAt, the master
// SIGKILLed at t.KillAt, the demand kept up while Sentinel promotes the replica, which lacks
// what was counted in between. With TenantACL the data servers and the sentinels have admin
// passwords and the manager provisions the sidecars (see TenantACL).
func (e *Env) Sentinel(ctx context.Context, auth Auth, n int, leases bool, t Timing) (_ *Cell, err error) {
	if err := t.valid(); err != nil {
		return nil, err
	}
	e.cellSeq++
	var opts redistest.SentinelOptions
	if auth == TenantACL {
		opts = redistest.SentinelOptions{Password: sentinelPassword, DataPassword: adminPassword}
	}
	g, err := redistest.StartSentinelWith(opts)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, g.Close()) }()
	acc, err := e.provision(ctx, auth, redisSetup{url: g.URL(), nodes: []string{g.Master().Addr(), g.Replica().Addr()}, sentinels: g.SentinelAddrs()})
	if err != nil {
		return nil, fmt.Errorf("sentinel, %s: %w", auth, err)
	}
	defer acc.stop()
	f, err := e.StartFleet(ctx, g.URL(), acc.credsDir, n, leases)
	if err != nil {
		return nil, err
	}
	defer f.Stop()
	c, err := e.runWindow(ctx, f, CellSpec{Scenario: "sentinel", Auth: auth, Tail: t.Tail}, func(ctx context.Context, l *load, c *Cell, atCut, atKill *[]int64) error {
		if err := l.waitHot(ctx, t.CutAt); err != nil {
			return err
		}
		if err := g.CutReplica(ctx); err != nil {
			return err
		}
		*atCut = l.totals()
		if err := l.waitHot(ctx, t.KillAt); err != nil {
			return err
		}
		*atKill = l.totals()
		l.markKill(ctx)
		killed := time.Now()
		if err := g.Master().Stop(); err != nil {
			return err
		}
		if err := g.WaitMaster(ctx, g.Replica()); err != nil {
			return err
		}
		c.Switch = time.Since(killed)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("sentinel, %s, %d sidecars, leases %t: %w\n%s%s", auth, n, leases, err, f.LogTails(1500), acc.logTail(1500))
	}
	return c, nil
}

// Cluster is one failover of a Redis Cluster shard (3 masters with a replica each) under n
// sidecars on its seed list: the shard holding the hot key of every rule in rules has its
// replica cut off (it cannot authenticate to its master any more) at t.CutAt, its master is
// SIGKILLed at t.KillAt, and the replica is promoted by CLUSTER FAILOVER TAKEOVER (takeover)
// or by the cluster itself once the master is past its node timeout. With TenantACL every node
// has an admin password and the manager provisions the sidecars (see TenantACL).
func (e *Env) Cluster(ctx context.Context, auth Auth, n int, leases, takeover bool, rules []string, t Timing) (_ *Cell, err error) {
	if err := t.valid(); err != nil {
		return nil, err
	}
	e.cellSeq++
	co := redistest.ClusterOptions{Masters: 3, Replicas: 1}
	if auth == TenantACL {
		co.Password = adminPassword
	}
	cl, err := redistest.StartClusterWith(co)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, cl.Close()) }()
	master, hot, probes, err := shardKeys(ctx, cl, rules, fmt.Sprintf("probe-%d", e.cellSeq))
	if err != nil {
		return nil, err
	}
	var msrv *redistest.Server
	for _, s := range cl.Nodes {
		if s.Addr() == master {
			msrv = s
		}
	}
	replica, err := cl.ReplicaOf(master)
	if err != nil {
		return nil, err
	}
	mc := cl.Client(master)
	defer mc.Close()
	rc := cl.Client(replica.Addr())
	defer rc.Close()

	acc, err := e.provision(ctx, auth, redisSetup{url: cl.URL(), nodes: cl.Addrs()})
	if err != nil {
		return nil, fmt.Errorf("cluster, %s: %w", auth, err)
	}
	defer acc.stop()
	f, err := e.StartFleet(ctx, cl.URL(), acc.credsDir, n, leases)
	if err != nil {
		return nil, err
	}
	defer f.Stop()
	scenario := "cluster, replica promoted by the cluster"
	if takeover {
		scenario = "cluster, CLUSTER FAILOVER TAKEOVER"
	}
	spec := CellSpec{Scenario: scenario, Auth: auth, Rules: rules, HotKeys: hot, ProbeKeys: probes, Tail: t.Tail}
	c, err := e.runWindow(ctx, f, spec, clusterFailover(mc, rc, msrv, takeover, t))
	if err != nil {
		return nil, fmt.Errorf("%s, %s, %d sidecars, leases %t: %w\n%s%s", scenario, auth, n, leases, err, f.LogTails(1500), acc.logTail(1500))
	}
	return c, nil
}

// clusterFailover cuts the replica rc off its master mc at t.CutAt, kills the master msrv at
// t.KillAt and waits for rc to be promoted (by CLUSTER FAILOVER TAKEOVER with takeover, by the
// cluster otherwise), recording the switch's duration.
func clusterFailover(mc, rc *redis.Client, msrv *redistest.Server, takeover bool, t Timing) drive {
	return func(ctx context.Context, l *load, c *Cell, atCut, atKill *[]int64) error {
		if err := l.waitHot(ctx, t.CutAt); err != nil {
			return err
		}
		if err := redistest.CutClusterReplica(ctx, mc, rc); err != nil {
			return err
		}
		*atCut = l.totals()
		if err := l.waitHot(ctx, t.KillAt); err != nil {
			return err
		}
		*atKill = l.totals()
		l.markKill(ctx)
		killed := time.Now()
		if err := msrv.Stop(); err != nil {
			return err
		}
		replica := rc.Options().Addr
		if takeover {
			if err := rc.Do(ctx, "CLUSTER", "FAILOVER", "TAKEOVER").Err(); err != nil {
				return fmt.Errorf("CLUSTER FAILOVER TAKEOVER on %s: %w", replica, err)
			}
		}
		for {
			role, err := rc.Do(ctx, "ROLE").Slice()
			if err == nil && len(role) > 0 && role[0] == "master" {
				break
			}
			if err := sleep(ctx, 20*time.Millisecond); err != nil {
				return fmt.Errorf("waiting for %s to be promoted (ROLE %v): %w", replica, role, err)
			}
		}
		c.Switch = time.Since(killed)
		return nil
	}
}

// shardKeys picks, on the cluster's master of the first rule's HotKey, a hot key value for
// every rule and fresh probe key values (ProbeRule) starting with probePrefix.
func shardKeys(ctx context.Context, cl *redistest.Cluster, rules []string, probePrefix string) (master string, hot map[string]string, probes []string, err error) {
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs(), Password: cl.Password(), MaxRetries: -1})
	defer cc.Close()
	masterOf := func(key string) (string, error) {
		m, err := cc.MasterForKey(ctx, key)
		if err != nil {
			return "", fmt.Errorf("finding the master of %s: %w", key, err)
		}
		return m.Options().Addr, nil
	}
	// The hot key of every rule on one shard (a rule's name enters its hash tag, so one key
	// value puts the rules on shards a fixed distance apart: each rule gets its own), and probe
	// keys on it too.
	master, err = masterOf(keyscheme.Key(Namespace, Policy, rules[0], HotKey) + ":swc")
	if err != nil {
		return "", nil, nil, err
	}
	hot = map[string]string{rules[0]: HotKey}
	for _, r := range rules[1:] {
		for i := 0; hot[r] == "" && i < 1000; i++ {
			v := fmt.Sprintf("%s-%d", HotKey, i)
			a, err := masterOf(keyscheme.Key(Namespace, Policy, r, v) + ":swc")
			if err != nil {
				return "", nil, nil, err
			}
			if a == master {
				hot[r] = v
			}
		}
		if hot[r] == "" {
			return "", nil, nil, fmt.Errorf("no key value of rule %s on %s among 1000", r, master)
		}
	}
	for i := 0; len(probes) < 5000 && i < 100_000; i++ {
		v := fmt.Sprintf("%s-%d", probePrefix, i)
		a, err := masterOf(keyscheme.Key(Namespace, Policy, ProbeRule, v) + ":swc")
		if err != nil {
			return "", nil, nil, err
		}
		if a == master {
			probes = append(probes, v)
		}
	}
	return master, hot, probes, nil
}

// Restart is a standalone Redis under n sidecars, SIGKILLed when every one-key rule of rules
// has admitted t.KillAt of its limit and restarted at once, empty (no persistence), on the
// same port. The cell's RestoredIn is when every sidecar's restored units had risen. With
// TenantACL the server has an admin password (kept across the restart, as in its config
// file) and the manager provisions the sidecars: the restart loses the scripts and the
// namespace's user, and only the manager can give them back (see TenantACL).
func (e *Env) Restart(ctx context.Context, auth Auth, n int, leases bool, rules []string, t Timing) (_ *Cell, err error) {
	if err := t.valid(); err != nil {
		return nil, err
	}
	e.cellSeq++
	var args []string
	if auth == TenantACL {
		args = []string{"--requirepass", adminPassword}
	}
	srv, err := redistest.Start(args...)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, srv.Close()) }()
	acc, err := e.provision(ctx, auth, redisSetup{url: srv.URL(), nodes: []string{srv.Addr()}})
	if err != nil {
		return nil, fmt.Errorf("standalone, %s: %w", auth, err)
	}
	defer acc.stop()
	f, err := e.StartFleet(ctx, srv.URL(), acc.credsDir, n, leases)
	if err != nil {
		return nil, err
	}
	defer f.Stop()
	spec := CellSpec{Scenario: "standalone, restarted empty", Auth: auth, Rules: rules, Tail: t.Tail}
	c, err := e.runWindow(ctx, f, spec, func(ctx context.Context, l *load, c *Cell, atCut, atKill *[]int64) error {
		if err := l.waitHot(ctx, t.KillAt); err != nil {
			return err
		}
		*atKill = l.totals()
		*atCut = *atKill
		l.markKill(ctx)
		killed := time.Now()
		if err := srv.Stop(); err != nil {
			return err
		}
		if err := srv.Start(); err != nil {
			return err
		}
		c.Switch = time.Since(killed)
		for {
			restored, err := e.Metric(ctx, f, "redline_sidecar_restored_units_total")
			if err != nil {
				return err
			}
			if !slices.Contains(restored, 0) {
				c.RestoredIn = time.Since(killed)
				return nil
			}
			if err := sleep(ctx, 100*time.Millisecond); err != nil {
				// Not every sidecar restored before the window ended: the caller's assertions
				// on the metrics say which.
				return nil
			}
		}
	})
	if err != nil {
		return nil, fmt.Errorf("standalone restart, %s, %d sidecars, leases %t: %w\n%s%s", auth, n, leases, err, f.LogTails(1500), acc.logTail(1500))
	}
	return c, nil
}

// Table writes one row per rule of every cell: the demand and what was admitted against the
// limit (limit, demand and admitted over every key of the rule; max/key and min/key per key;
// over: keys above their limit; short: keys whose demand exceeded the limit that admitted
// less than 95% of it), the switch (Redis has a master again), when every sidecar decided
// from Redis again, the last decision of the failure mode after the kill (closed) and after
// the switch (closed-sw: how long the sidecars went on deciding by their failure mode once
// Redis had a master again, 0 when they stopped before), and what the sidecars restored.
func Table(w io.Writer, cells []*Cell) {
	_, _ = fmt.Fprintf(w, "%-40s %-12s %-21s %5s %8s %6s %7s %8s %8s %8s %9s %6s %7s %7s %5s %6s %9s %7s %7s %7s %9s %8s %9s\n",
		"scenario", "auth", "algorithm", "keys", "sidecars", "leases", "limit", "demand", "at cut", "at kill", "admitted", "x",
		"max/key", "min/key", "over", "short", "degraded", "switch", "decided", "closed", "closed-sw", "restored", "regressed")
	for _, c := range cells {
		lease := "off"
		if c.Leases {
			lease = "on"
		}
		var restored, regressed float64
		for i := range c.Restored {
			restored += c.Restored[i]
			regressed += c.Regressions[i]
		}
		for _, r := range c.Rules {
			limit := r.Limit * int64(r.Keys)
			_, _ = fmt.Fprintf(w, "%-40s %-12s %-21s %5d %8d %6s %7d %8d %8d %8d %9d %5.2fx %7d %7d %5d %6d %9d %6.1fs %6.1fs %6.1fs %8.1fs %8.0f %9.0f\n",
				c.Scenario, c.Auth, r.Algorithm, r.Keys, c.Sidecars, lease, limit, r.Demand, r.AtCut, r.AtKill, r.Admitted,
				float64(r.Admitted)/float64(limit), r.MaxKey, r.MinKey, r.OverKeys, r.ShortKeys, r.Degraded,
				c.Switch.Seconds(), c.Decided.Seconds(), r.Closed.Seconds(), c.ClosedAfterSwitch(r).Seconds(), restored, regressed)
		}
	}
}

// ClosedAfterSwitch is how long after the switch the failure mode went on deciding rule r (0
// when it stopped before the switch).
func (c *Cell) ClosedAfterSwitch(r RuleResult) time.Duration { return max(r.Closed-c.Switch, 0) }

// ClosedAfterSwitchAll is ClosedAfterSwitch over every rule of the cell.
func (c *Cell) ClosedAfterSwitchAll() time.Duration {
	var d time.Duration
	for _, r := range c.Rules {
		d = max(d, c.ClosedAfterSwitch(r))
	}
	return d
}
