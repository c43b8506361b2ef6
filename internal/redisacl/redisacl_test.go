package redisacl_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"github.com/redis/go-redis/v9"

	"github.com/redline-dev/redline/internal/fleet"
	"github.com/redline-dev/redline/internal/keyscheme"
	"github.com/redline-dev/redline/internal/limiter"
	"github.com/redline-dev/redline/internal/limiter/scripts"
	"github.com/redline-dev/redline/internal/redisacl"
	"github.com/redline-dev/redline/internal/redisconn"
	"github.com/redline-dev/redline/internal/testutil/redistest"
	"github.com/redline-dev/redline/internal/testutil/redistest/redisclient"
)

const adminPassword = "admin-secret"

// startACLRedis starts a redis-server whose default user needs adminPassword, as a Redis with
// tenants must (the default user is the admin), and returns an admin client.
func startACLRedis(t *testing.T, extra ...string) (*redistest.Server, redis.UniversalClient) {
	t.Helper()
	srv, err := redistest.Start(append([]string{"--requirepass", adminPassword}, extra...)...)
	if err != nil {
		t.Fatalf("starting redis-server: %v", err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	admin := client(t, srv.URL(), "", adminPassword)
	return srv, admin
}

func client(t *testing.T, url, user, password string) redis.UniversalClient {
	t.Helper()
	return redisclient.New(t, url, redisconn.Options{Username: user, Password: password})
}

// loadSidecarScripts does what the manager does: every script a sidecar runs, loaded by the admin.
func loadSidecarScripts(t *testing.T, ctx context.Context, admin redis.UniversalClient) {
	t.Helper()
	for _, s := range redisacl.SidecarScripts() {
		if err := admin.ScriptLoad(ctx, s.Source).Err(); err != nil {
			t.Fatalf("loading %s: %v", s.Name, err)
		}
	}
}

var fixedWindow = limiter.Limit{Algorithm: limiter.FixedWindow, Requests: 5, Window: time.Hour, FailureMode: limiter.FailureModeClosed}

// With its own user a namespace decides, leases and heartbeats on its own keys, and can do
// nothing to another namespace's keys, scripts or Redis itself.
func TestTenantUserReachesOnlyItsNamespace(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	_, admin := startACLRedis(t)
	loadSidecarScripts(t, ctx, admin)
	nodes := []redisacl.Node{admin}
	g.Expect(redisacl.Ensure(ctx, nodes, "attacker", []string{"pw-attacker"})).To(Succeed())
	g.Expect(redisacl.Ensure(ctx, nodes, "victim", []string{"pw-victim"})).To(Succeed())
	url := "redis://" + strings.TrimPrefix(admin.(*redis.Client).Options().Addr, "")
	attacker := client(t, url, redisacl.Username("attacker"), "pw-attacker")
	victim := client(t, url, redisacl.Username("victim"), "pw-victim")

	// The victim's sidecar works under its user: decisions (with leases), heartbeats.
	vlim, err := limiter.New(victim, limiter.Options{})
	g.Expect(err).NotTo(HaveOccurred())
	defer vlim.Close()
	vkey := keyscheme.Key("victim", "p", "r", "k")
	for range 3 {
		res, err := vlim.Allow(ctx, vkey, fixedWindow, 1)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(res.Err).NotTo(HaveOccurred())
		g.Expect(res.Allowed).To(BeTrue())
		g.Expect(res.Source).To(BeElementOf(limiter.SourceRedis, limiter.SourceLease))
	}
	n, err := fleet.Announce(ctx, victim, "victim", "pod-v", "h", 15*time.Second, []string{"p"})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(n).To(Equal([]int64{1}))
	// A lease over a fixed window: the units count in its window state (field c).
	counter := vkey + ":swc"
	before, err := admin.HGet(ctx, counter, "c").Result()
	g.Expect(err).NotTo(HaveOccurred(), "the victim's counter %s exists", counter)

	// The attacker's own sidecar works under its user too.
	alim, err := limiter.New(attacker, limiter.Options{})
	g.Expect(err).NotTo(HaveOccurred())
	defer alim.Close()
	res, err := alim.Allow(ctx, keyscheme.Key("attacker", "p", "r", "k"), fixedWindow, 1)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(res.Source).To(Equal(limiter.SourceRedis), "decided in Redis: %v", res.Err)
	_, err = fleet.Announce(ctx, attacker, "attacker", "pod-a", "h", 15*time.Second, []string{"p"})
	g.Expect(err).NotTo(HaveOccurred())

	fw, _ := scripts.For("FixedWindow")
	hb := fleet.Scripts()[0]
	groupKey := fleet.GroupKey("victim", "p")
	attacks := map[string][]any{
		"DEL a counter":                {"del", counter},
		"SET a counter":                {"set", counter, "0"},
		"DECRBY a counter":             {"decrby", counter, "100"},
		"EXPIRE a counter":             {"pexpire", counter, "1"},
		"EVALSHA on another's key":     {"evalsha", fw.SHA, 1, counter, 1000000, 3600000, 1},
		"EVAL":                         {"eval", "return redis.call('del', KEYS[1])", 1, counter},
		"EVAL on its own key":          {"eval", "while true do end", 1, keyscheme.Key("attacker", "p", "r", "x")},
		"SCRIPT LOAD":                  {"script", "load", "while true do end"},
		"SCRIPT FLUSH":                 {"script", "flush"},
		"FUNCTION FLUSH":               {"function", "flush"},
		"FUNCTION LOAD":                {"function", "load", "#!lua name=x\nredis.register_function('x', function() return 1 end)"},
		"a heartbeat in another group": {"evalsha", hb.SHA, 2, groupKey, groupKey + ":cfg", "ghost", 3600000, "h"},
		"ZADD a future member":         {"zadd", groupKey, "99999999999999", "ghost"},
		"DEL a heartbeat group":        {"del", groupKey},
		"FLUSHALL":                     {"flushall"},
		"FLUSHDB":                      {"flushdb"},
		"CONFIG SET":                   {"config", "set", "maxclients", "1"},
		"CONFIG GET":                   {"config", "get", "requirepass"},
		"ACL SETUSER":                  {"acl", "setuser", redisacl.Username("attacker"), "allkeys"},
		"ACL LIST":                     {"acl", "list"},
		"ACL DELUSER":                  {"acl", "deluser", redisacl.Username("victim")},
		"KEYS":                         {"keys", "*"},
		"SCAN":                         {"scan", "0"},
		"CLIENT KILL":                  {"client", "kill", "user", redisacl.Username("victim")},
		"CLIENT LIST":                  {"client", "list"},
		"CLIENT PAUSE":                 {"client", "pause", "10000"},
		"SHUTDOWN":                     {"shutdown", "nosave"},
		"SUBSCRIBE-less PUBLISH":       {"publish", "anything", "x"},
		"MIGRATE":                      {"migrate", "127.0.0.1", "1", counter, "0", "1"},
		"RENAME another's key":         {"rename", counter, keyscheme.Key("attacker", "p", "r", "y") + ":swc"},
		"COPY another's key":           {"copy", counter, keyscheme.Key("attacker", "p", "r", "z") + ":swc"},
		"OBJECT on another's key":      {"object", "encoding", counter},
		"MONITOR-free SLOWLOG":         {"slowlog", "get"},
		"SWAPDB":                       {"swapdb", "0", "1"},
		"REPLICAOF":                    {"replicaof", "127.0.0.1", "1"},
	}
	for name, args := range attacks {
		err := attacker.Do(ctx, args...).Err()
		g.Expect(err).To(HaveOccurred(), "%s must be refused", name)
		g.Expect(err.Error()).To(HavePrefix("NOPERM"), "%s: %v", name, err)
	}
	// Nothing of the victim's changed, and Redis still serves it.
	g.Expect(admin.HGet(ctx, counter, "c").Val()).To(Equal(before))
	g.Expect(admin.PTTL(ctx, counter).Val()).To(BeNumerically(">", time.Minute))
	members, err := fleet.Members(ctx, admin, "victim", "p", 15*time.Second)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(members).To(Equal(map[string]string{"pod-v": "h"}))
	g.Expect(admin.ScriptExists(ctx, fw.SHA).Val()).To(Equal([]bool{true}))
	g.Expect(admin.ConfigGet(ctx, "maxclients").Val()).NotTo(HaveKeyWithValue("maxclients", "1"))
	res, err = vlim.Allow(ctx, vkey, fixedWindow, 1)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(res.Err).NotTo(HaveOccurred())
}

// The commands allowed are exactly what the sidecar's scripts call, plus EVALSHA and the
// connection's own: every literal call of every script is in the list, none is missed.
func TestCommandsCoverEveryScriptCall(t *testing.T) {
	g := NewWithT(t)
	cmds, err := redisacl.Commands()
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(cmds).To(ContainElements("evalsha", "time", "zadd", "zcount", "pexpire", "hset"))
	for _, c := range []string{"eval", "script", "script|load", "script|flush", "flushall", "config", "acl", "keys", "scan", "client", "function"} {
		g.Expect(cmds).NotTo(ContainElement(c))
	}
	// Whose cost grows with the key's size and has a bounded stand-in in the scripts: DEL
	// (UNLINK), ZREMRANGEBYRANK (ZRANGE of a few, ZREM), GET (GETRANGE of 32 bytes).
	for _, c := range []string{"del", "zremrangebyrank", "zremrangebyscore", "get"} {
		g.Expect(cmds).NotTo(ContainElement(c))
	}
	// The whole grant, as the package's doc lists it with each command's worst case: a command
	// added to a script shows here, to be weighed.
	g.Expect(cmds).To(Equal([]string{
		"auth", "client|setname", "cluster|nodes", "cluster|shards", "cluster|slots", "command", "decrby", "evalsha",
		"getrange", "hdel", "hello", "hget", "hgetall", "hincrby", "hlen", "hmget", "hset", "incrby", "pexpire", "pexpireat", "ping",
		"select", "set", "time", "type", "unlink", "wait", "zadd", "zcard", "zcount", "zrange", "zrangebyscore", "zrem", "zscore",
	}))
	rules, err := redisacl.Rules("shop", []string{"a", "b"})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(rules[:4]).To(Equal([]string{"reset", "on", ">a", ">b"}))
	g.Expect(rules).To(ContainElements("~rl:{shop/*", "~rl:hb:{shop/*", "+wait", "+waitaof"))
	// The key prefixes are those of the keys the sidecar builds.
	g.Expect(keyscheme.Key("shop", "p", "r", "x")).To(HavePrefix(keyscheme.Prefix("shop")))
	g.Expect(fleet.GroupKey("shop", "p")).To(HavePrefix(fleet.KeyPrefix("shop")))
	g.Expect(keyscheme.Key("shop2", "p", "r", "x")).NotTo(HavePrefix(keyscheme.Prefix("shop")))
	g.Expect(fleet.GroupKey("x", "p")).NotTo(HavePrefix(keyscheme.Prefix("hb")), "no namespace's prefix covers heartbeats")
}

// Rotation: the new password is added before the old one goes; a connection opened with the
// old one stays authenticated, new connections need the new one.
func TestRotationKeepsConnectionsWorking(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	srv, admin := startACLRedis(t)
	loadSidecarScripts(t, ctx, admin)
	nodes := []redisacl.Node{admin}
	g.Expect(redisacl.Ensure(ctx, nodes, "shop", []string{"old"})).To(Succeed())
	oldConn := client(t, srv.URL(), redisacl.Username("shop"), "old")
	g.Expect(oldConn.Ping(ctx).Err()).To(Succeed())

	g.Expect(redisacl.Ensure(ctx, nodes, "shop", []string{"old", "new"})).To(Succeed())
	g.Expect(client(t, srv.URL(), redisacl.Username("shop"), "old").Ping(ctx).Err()).To(Succeed(), "both passwords work in the overlap")
	g.Expect(client(t, srv.URL(), redisacl.Username("shop"), "new").Ping(ctx).Err()).To(Succeed())

	g.Expect(redisacl.Ensure(ctx, nodes, "shop", []string{"new"})).To(Succeed())
	err := client(t, srv.URL(), redisacl.Username("shop"), "old").Ping(ctx).Err()
	g.Expect(err).To(MatchError(ContainSubstring("WRONGPASS")))
	lim, err := limiter.New(oldConn, limiter.Options{})
	g.Expect(err).NotTo(HaveOccurred())
	defer lim.Close()
	res, err := lim.Allow(ctx, keyscheme.Key("shop", "p", "r", "k"), fixedWindow, 1)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(res.Source).To(Equal(limiter.SourceRedis), "the connection opened before the rotation still decides: %v", res.Err)
}

// A Redis that refuses ACL commands (renamed away, as some managed services do) is told apart
// from one that is down: ErrUnavailable, so the controller can fall back and say so.
func TestACLRefusedIsUnavailable(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	_, admin := startACLRedis(t, "--rename-command", "ACL", "")
	err := redisacl.Ensure(ctx, []redisacl.Node{admin}, "shop", []string{"pw"})
	g.Expect(errors.Is(err, redisacl.ErrUnavailable)).To(BeTrue(), "%v", err)
	g.Expect(errors.Is(redisacl.Probe(ctx, []redisacl.Node{admin}), redisacl.ErrUnavailable)).To(BeTrue())

	down := client(t, fmt.Sprintf("redis://127.0.0.1:%d", freePort(t)), "", "")
	err = redisacl.Ensure(ctx, []redisacl.Node{down}, "shop", []string{"pw"})
	g.Expect(err).To(HaveOccurred())
	g.Expect(errors.Is(err, redisacl.ErrUnavailable)).To(BeFalse(), "a Redis that does not answer is not one that refuses ACLs: %v", err)
}

func freePort(t *testing.T) int {
	p, err := redistest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// On a cluster the user exists on every node, masters and replicas alike (ACL users are not
// replicated), and a namespace's client decides on keys in every slot.
func TestClusterUserOnEveryNode(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	cl, err := redistest.StartCluster(3)
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { _ = cl.Close() })
	admin := client(t, cl.URL(), "", "")
	nodes, err := redisconn.NewNodes(cl.URL(), redisconn.Options{}, admin)
	g.Expect(err).NotTo(HaveOccurred())
	defer func() { _ = nodes.Close() }()
	var all []redisacl.Node
	g.Expect(nodes.Each(ctx, func(_ context.Context, c *redis.Client) error { all = append(all, c); return nil })).To(Succeed())
	g.Expect(all).To(HaveLen(3))
	g.Expect(redisacl.Ensure(ctx, all, "shop", []string{"pw"})).To(Succeed())
	g.Expect(scripts.Load(ctx, admin)).Error().NotTo(HaveOccurred())

	tenant := client(t, cl.URL(), redisacl.Username("shop"), "pw")
	lim, err := limiter.New(tenant, limiter.Options{LeaseHorizon: -1})
	g.Expect(err).NotTo(HaveOccurred())
	defer lim.Close()
	for i := range 30 {
		res, err := lim.Allow(ctx, keyscheme.Key("shop", "p", "r", fmt.Sprint(i)), fixedWindow, 1)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(res.Source).To(Equal(limiter.SourceRedis), "key %d: %v", i, res.Err)
	}
	g.Expect(tenant.Do(ctx, "del", keyscheme.Key("other", "p", "r", "k")+":swc").Err()).To(MatchError(HavePrefix("NOPERM")))
}

// A user without a password makes per-namespace users pointless: the default user (no
// requirepass) and an admin's own user made with nopass are both reported, by name.
func TestOpenUsers(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	_, admin := startACLRedis(t)
	protected := admin
	open, err := redisacl.OpenUsers(ctx, []redisacl.Node{protected})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(open).To(BeEmpty())

	g.Expect(admin.Do(ctx, "acl", "setuser", "ops", "on", "nopass", "~*", "+get").Err()).To(Succeed())
	g.Expect(admin.Do(ctx, "acl", "setuser", "parked", "off", "nopass", "~*", "+@all").Err()).To(Succeed())
	open, err = redisacl.OpenUsers(ctx, []redisacl.Node{protected})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(open).To(Equal([]string{"ops"}), "a user turned off lets no one in")

	srv, err := redistest.Start()
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { _ = srv.Close() })
	open, err = redisacl.OpenUsers(ctx, []redisacl.Node{client(t, srv.URL(), "", ""), protected})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(open).To(Equal([]string{"default", "ops"}), "every node's open users, once each")
}

// With Sentinel the user is set on the master and on every replica (ACL users are not
// replicated, and a failover promotes a replica), found through the sentinels.
func TestSentinelUserOnMasterAndReplicas(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	master, err := redistest.Start()
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { _ = master.Close() })
	replica, err := redistest.Start("--replicaof", "127.0.0.1", fmt.Sprint(master.Port))
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { _ = replica.Close() })
	sentinelPort := freePort(t)
	conf := filepath.Join(t.TempDir(), "sentinel.conf")
	g.Expect(os.WriteFile(conf, fmt.Appendf(nil, "port %d\nbind 127.0.0.1\nsentinel monitor mymaster 127.0.0.1 %d 1\nsentinel down-after-milliseconds mymaster 60000\n",
		sentinelPort, master.Port), 0o644)).To(Succeed())
	bin, err := redistest.Binary()
	g.Expect(err).NotTo(HaveOccurred())
	sentinel := exec.Command(bin, conf, "--sentinel")
	// A test binary killed by a timeout must not leave the sentinel behind.
	sentinel.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	g.Expect(sentinel.Start()).To(Succeed())
	t.Cleanup(func() { _ = sentinel.Process.Kill(); _ = sentinel.Wait() })

	url := fmt.Sprintf("redis+sentinel://127.0.0.1:%d/mymaster", sentinelPort)
	admin := client(t, url, "", "")
	nodes, err := redisconn.NewNodes(url, redisconn.Options{DialTimeout: time.Second, ReadTimeout: time.Second, WriteTimeout: time.Second}, admin)
	g.Expect(err).NotTo(HaveOccurred())
	defer func() { _ = nodes.Close() }()
	var addrs []string
	var all []redisacl.Node
	// The sentinel learns of the replica from the master's INFO, within seconds.
	g.Eventually(func() []string {
		addrs, all = nil, nil
		_ = nodes.Each(ctx, func(_ context.Context, c *redis.Client) error {
			addrs = append(addrs, c.Options().Addr)
			all = append(all, c)
			return nil
		})
		return addrs
	}).WithTimeout(30 * time.Second).WithPolling(200 * time.Millisecond).Should(ConsistOf(master.Addr(), replica.Addr()))
	g.Expect(redisacl.Ensure(ctx, all, "shop", []string{"pw"})).To(Succeed())
	for _, s := range []*redistest.Server{master, replica} {
		c := client(t, s.URL(), redisacl.Username("shop"), "pw")
		g.Expect(c.Ping(ctx).Err()).To(Succeed(), "the user exists on %s", s.Addr())
	}
}
