package app_test

import (
	"flag"
	"io"
	"maps"
	"slices"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/redline-dev/redline/internal/redisconn"
	"github.com/redline-dev/redline/internal/sidecar/app"
)

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

// The injector's arguments and environment parse, with the documented defaults for the rest.
func TestParseConfigContract(t *testing.T) {
	g := NewWithT(t)
	c, err := app.ParseConfig([]string{
		"--listen=:8000", "--upstream=127.0.0.1:8080", "--admin-listen=:9091",
		"--config-dir=/etc/redline/policies", "--pod-labels=/etc/redline/podinfo/labels", "--failure-mode=Closed",
	}, env(map[string]string{"REDLINE_REDIS_URL": "redis://r:6379", "REDLINE_REDIS_PASSWORD": "pw", "POD_NAME": "p-1", "POD_NAMESPACE": "shop"}), io.Discard)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(c.Upstream).To(Equal("127.0.0.1:8080"))
	g.Expect(c.FailureMode).To(Equal("Closed"))
	g.Expect(c.UpstreamProtocol).To(Equal("HTTP1"), "the application is spoken to as before unless the pod says otherwise")
	g.Expect(c.RedisURL).To(Equal("redis://r:6379"))
	g.Expect(c.RedisPassword).To(Equal("pw"))
	g.Expect(c.PodName).To(Equal("p-1"))
	g.Expect(c.GRPCListen).To(Equal("127.0.0.1:9092"), "decision faces stay inside the pod by default")
	g.Expect(c.CheckListen).To(Equal("127.0.0.1:9093"), "decision faces stay inside the pod by default")
	g.Expect(c.AdminListen).To(Equal(":9091"))
	g.Expect(c.MaxCheckConns).To(Equal(512))
	g.Expect(c.MaxGRPCConns).To(Equal(32))
	g.Expect(c.RateLimitHeaders).To(BeTrue())
	g.Expect(c.TrustedHops).To(BeZero())
	g.Expect(c.HeartbeatInterval).To(Equal(5 * time.Second))
	g.Expect(c.RedisMaxIdle).To(BeZero(), "idle connections up to the pool: none redialed under load")
	g.Expect(c.RedisIdleTimeout).To(Equal(time.Minute))
	g.Expect(c.MaxProcs).To(Equal(1), "one P by default: a sidecar's work is mostly waiting")
	g.Expect(c.LeaseKeys).To(Equal(16384))

	g.Expect(c.MaxConns).To(Equal(1024), "no memory limit known")
	g.Expect(c.MaxAdminConns).To(Equal(64))
	g.Expect(c.MaxAdminConnsPerIP).To(Equal(8))
	g.Expect(c.MaxConnsPerIP).To(BeZero(), "ingress and SNAT funnel many clients through one IP")
	g.Expect(c.MemoryLimit).To(BeZero())

	// The injector passes the container's memory limit; the proxy's bound follows it.
	c, err = app.ParseConfig([]string{"--upstream=127.0.0.1:1"}, env(map[string]string{"REDLINE_REDIS_URL": "redis://r", "REDLINE_MEMORY_LIMIT": "67108864", "POD_NAMESPACE": "shop"}), io.Discard)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(c.MemoryLimit).To(BeEquivalentTo(64 << 20))
	g.Expect(c.MaxConns).To(Equal(315), "half of 64Mi at 64 KiB of headers and 40 KiB a connection")
	c, err = app.ParseConfig([]string{"--upstream=127.0.0.1:1", "--max-conns=5000"}, env(map[string]string{"REDLINE_REDIS_URL": "redis://r", "REDLINE_MEMORY_LIMIT": "67108864", "POD_NAMESPACE": "shop"}), io.Discard)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(c.MaxConns).To(Equal(5000), "the flag wins")

	c, err = app.ParseConfig([]string{"--upstream=127.0.0.1:1", "--max-procs=4"}, env(map[string]string{"REDLINE_REDIS_URL": "redis://r", "GOMAXPROCS": "3", "POD_NAMESPACE": "shop"}), io.Discard)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(c.MaxProcs).To(BeZero(), "GOMAXPROCS in the environment wins over the flag")
}

func TestParseConfigRefusesBadInput(t *testing.T) {
	for name, args := range map[string][]string{
		"no upstream":        {},
		"bad failure mode":   {"--upstream=127.0.0.1:1", "--failure-mode=Sometimes"},
		"bad protocol":       {"--upstream=127.0.0.1:1", "--upstream-protocol=grpc"},
		"negative hops":      {"--upstream=127.0.0.1:1", "--trusted-hops=-1"},
		"hops beyond 16":     {"--upstream=127.0.0.1:1", "--trusted-hops=17"},
		"negative max procs": {"--upstream=127.0.0.1:1", "--max-procs=-1"},
		"stray argument":     {"--upstream=127.0.0.1:1", "extra"},
		"unknown flag":       {"--upstream=127.0.0.1:1", "--nope"},
		"tiny header budget": {"--upstream=127.0.0.1:1", "--max-header-bytes=10"},
		"no decision conns":  {"--upstream=127.0.0.1:1", "--max-grpc-conns=0"},
		"no idle redis time": {"--upstream=127.0.0.1:1", "--redis-idle-timeout=0"},
		"no lease keys":      {"--upstream=127.0.0.1:1", "--lease-keys=0"},
		"lease keys beyond":  {"--upstream=127.0.0.1:1", "--lease-keys=1048577"},
		"no redis timeout":   {"--upstream=127.0.0.1:1", "--redis-timeout=0"},
		"negative timeout":   {"--upstream=127.0.0.1:1", "--redis-timeout=-1s"},
		"negative max conns": {"--upstream=127.0.0.1:1", "--max-conns=-1"},
		"no admin conns":     {"--upstream=127.0.0.1:1", "--max-admin-conns=0"},
		"negative per ip":    {"--upstream=127.0.0.1:1", "--max-grpc-conns-per-ip=-1"},
		"memory budget -2":   {"--upstream=127.0.0.1:1", "--memory-budget=-2"},
		"memory budget 64Mi": {"--upstream=127.0.0.1:1", "--memory-budget=64Mi"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := app.ParseConfig(args, env(map[string]string{"REDLINE_REDIS_URL": "redis://r", "POD_NAMESPACE": "shop"}), io.Discard)
			NewWithT(t).Expect(err).To(HaveOccurred())
		})
	}
	_, err := app.ParseConfig([]string{"--upstream=127.0.0.1:1"}, env(map[string]string{"POD_NAMESPACE": "shop"}), io.Discard)
	NewWithT(t).Expect(err).To(MatchError(ContainSubstring("REDLINE_REDIS_URL")))
	// The namespace of keys and heartbeats comes from the pod, so a sidecar without it does not start.
	_, err = app.ParseConfig([]string{"--upstream=127.0.0.1:1"}, env(map[string]string{"REDLINE_REDIS_URL": "redis://r"}), io.Discard)
	NewWithT(t).Expect(err).To(MatchError(ContainSubstring("POD_NAMESPACE")))
	_, err = app.ParseConfig([]string{"--upstream=127.0.0.1:1"}, env(map[string]string{"REDLINE_REDIS_URL": "redis://r", "REDLINE_MEMORY_LIMIT": "64Mi", "POD_NAMESPACE": "shop"}), io.Discard)
	NewWithT(t).Expect(err).To(MatchError(ContainSubstring("REDLINE_MEMORY_LIMIT")))
}

// The TLS flags the injector passes reach the client's options; they are refused, naming
// what is wrong, with a URL without TLS, a certificate without its key or an unknown version.
func TestParseConfigRedisTLS(t *testing.T) {
	g := NewWithT(t)
	tlsArgs := []string{"--upstream=127.0.0.1:1", "--redis-tls-ca-file=/etc/redline/redis-tls/ca.crt",
		"--redis-tls-cert-file=/etc/redline/redis-tls/tls.crt", "--redis-tls-key-file=/etc/redline/redis-tls/tls.key",
		"--redis-tls-server-name=redis.internal", "--redis-tls-min-version=1.3"}
	c, err := app.ParseConfig(tlsArgs, env(map[string]string{"REDLINE_REDIS_URL": "rediss://r:6380", "POD_NAMESPACE": "shop"}), io.Discard)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(c.RedisTLS).To(Equal(redisconn.TLSOptions{CAFile: "/etc/redline/redis-tls/ca.crt", CertFile: "/etc/redline/redis-tls/tls.crt",
		KeyFile: "/etc/redline/redis-tls/tls.key", ServerName: "redis.internal", MinVersion: "1.3"}))

	c, err = app.ParseConfig([]string{"--upstream=127.0.0.1:1"}, env(map[string]string{"REDLINE_REDIS_URL": "rediss://r:6380", "POD_NAMESPACE": "shop"}), io.Discard)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(c.RedisTLS.IsZero()).To(BeTrue(), "rediss:// alone: the system's CAs")

	_, err = app.ParseConfig(tlsArgs, env(map[string]string{"REDLINE_REDIS_URL": "redis://r:6379", "POD_NAMESPACE": "shop"}), io.Discard)
	g.Expect(err).To(MatchError(ContainSubstring("the --redis-tls-* flags need a rediss:// or rediss+sentinel:// Redis URL")))
	_, err = app.ParseConfig([]string{"--upstream=127.0.0.1:1", "--redis-tls-cert-file=/c", "--redis-tls-min-version=1.1"},
		env(map[string]string{"REDLINE_REDIS_URL": "rediss://r:6380", "POD_NAMESPACE": "shop"}), io.Discard)
	g.Expect(err).To(MatchError(ContainSubstring("needs both its certificate file and its key file")))
	g.Expect(err).To(MatchError(ContainSubstring(`TLS minimum version "1.1": want 1.2 or 1.3`)))
}

// FlagSet is the set ParseConfig parses: the same flags with the same defaults.
func TestFlagSetIsTheParsedOne(t *testing.T) {
	g := NewWithT(t)
	fs := app.FlagSet(env(map[string]string{"REDLINE_REDIS_URL": "redis://r:1"}))
	g.Expect(fs.Lookup("redis-url").DefValue).To(Equal("redis://r:1"))
	g.Expect(fs.Lookup("lease-keys").DefValue).To(Equal("16384"))
	n := 0
	fs.VisitAll(func(f *flag.Flag) {
		n++
		// Every flag parses its own default: the set is the one ParseConfig reads.
		_, err := app.ParseConfig([]string{"--" + f.Name + "=" + f.DefValue, "--upstream=127.0.0.1:1"},
			env(map[string]string{"REDLINE_REDIS_URL": "redis://r", "POD_NAMESPACE": "shop"}), io.Discard)
		g.Expect(err).NotTo(HaveOccurred(), "--%s=%s", f.Name, f.DefValue)
	})
	g.Expect(n).To(BeNumerically(">", 40))
	for name := range app.FlagEnv {
		g.Expect(fs.Lookup(name)).NotTo(BeNil(), name)
	}
}

// What the manager wrote for the pod's workload, through the variables the injector sets from
// the namespace's ConfigMap: the budget's pool over the manager's default flag, the fallback's
// replicas under an explicit flag; unset, the flags' values.
func TestParseConfigWorkloadEnv(t *testing.T) {
	g := NewWithT(t)
	base := map[string]string{"REDLINE_REDIS_URL": "redis://r", "POD_NAMESPACE": "shop"}
	with := func(kv ...string) func(string) string {
		m := maps.Clone(base)
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return env(m)
	}
	c, err := app.ParseConfig([]string{"--upstream=127.0.0.1:1"}, with(), io.Discard)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(c.RedisPoolSize).To(Equal(16))
	g.Expect(c.FallbackReplicas).To(BeZero(), "no workload count: divided by the heartbeats' replicas, else 1")

	c, err = app.ParseConfig([]string{"--upstream=127.0.0.1:1", "--redis-pool-size=40"},
		with("REDLINE_BUDGET_REDIS_POOL_SIZE", "3", "REDLINE_FALLBACK_REPLICAS", "30"), io.Discard)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(c.RedisPoolSize).To(Equal(3), "the budget's pool over the manager's default")
	g.Expect(c.FallbackReplicas).To(BeEquivalentTo(30))

	c, err = app.ParseConfig([]string{"--upstream=127.0.0.1:1", "--fallback-replicas=2"}, with("REDLINE_FALLBACK_REPLICAS", "30"), io.Discard)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(c.FallbackReplicas).To(BeEquivalentTo(2), "the flag wins")

	for _, kv := range [][]string{
		{"REDLINE_BUDGET_REDIS_POOL_SIZE", "0"}, {"REDLINE_BUDGET_REDIS_POOL_SIZE", "many"},
		{"REDLINE_FALLBACK_REPLICAS", "-1"}, {"REDLINE_FALLBACK_REPLICAS", "99999999"}, {"REDLINE_FALLBACK_REPLICAS", "x"},
	} {
		_, err := app.ParseConfig([]string{"--upstream=127.0.0.1:1"}, with(kv...), io.Discard)
		g.Expect(err).To(MatchError(ContainSubstring(kv[0][len("REDLINE_"):])), "%s=%s", kv[0], kv[1])
	}
}

// The namespace's Redis, from its ConfigMap, replaces the cluster's URL and every TLS flag;
// without it (no ConfigMap yet) the cluster's stand; pods injected before either way start as
// they did.
func TestNamespaceRedisReplacesTheClusters(t *testing.T) {
	base := []string{"--upstream=127.0.0.1:8080"}
	clusterTLS := append(slices.Clone(base), "--redis-tls-ca-file=/var/run/redline/redis-tls/ca.crt",
		"--redis-tls-server-name=redis.internal", "--redis-tls-min-version=1.3")
	cluster := map[string]string{"REDLINE_REDIS_URL": "rediss://redis.redline-system:6380", "POD_NAMESPACE": "shop"}
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
		url  string
		tls  redisconn.TLSOptions
	}{{
		name: "no ConfigMap: the cluster's Redis and flags",
		args: clusterTLS, env: cluster, url: "rediss://redis.redline-system:6380",
		tls: redisconn.TLSOptions{CAFile: "/var/run/redline/redis-tls/ca.crt", ServerName: "redis.internal", MinVersion: "1.3"},
	}, {
		name: "a namespace's Redis without TLS: none of the cluster's TLS settings",
		args: clusterTLS, url: "redis://orders:6379",
		env: with(cluster, map[string]string{"REDLINE_NAMESPACE_REDIS_URL": "redis://orders:6379",
			"REDLINE_NAMESPACE_REDIS_TLS_CA_FILE": "", "REDLINE_NAMESPACE_REDIS_TLS_SERVER_NAME": "", "REDLINE_NAMESPACE_REDIS_TLS_MIN_VERSION": ""}),
	}, {
		name: "a namespace's Redis over TLS: its names",
		args: clusterTLS, url: "rediss://orders:6380",
		env: with(cluster, map[string]string{"REDLINE_NAMESPACE_REDIS_URL": "rediss://orders:6380",
			"REDLINE_NAMESPACE_REDIS_TLS_SERVER_NAME": "orders.internal", "REDLINE_NAMESPACE_REDIS_TLS_MIN_VERSION": "1.2"}),
		tls: redisconn.TLSOptions{ServerName: "orders.internal", MinVersion: "1.2"},
	}, {
		name: "an empty URL in the ConfigMap: the cluster's",
		args: clusterTLS, env: with(cluster, map[string]string{"REDLINE_NAMESPACE_REDIS_URL": "", "REDLINE_NAMESPACE_REDIS_TLS_SERVER_NAME": "x"}),
		url: "rediss://redis.redline-system:6380",
		tls: redisconn.TLSOptions{CAFile: "/var/run/redline/redis-tls/ca.crt", ServerName: "redis.internal", MinVersion: "1.3"},
	}, {
		name: "a pod a RedisBackend's namespace got from the previous injector: flags kubelet expanded from the ConfigMap",
		args: append(slices.Clone(base), "--redis-tls-server-name=orders.internal"),
		env:  map[string]string{"REDLINE_REDIS_URL": "rediss://orders:6380", "REDLINE_REDIS_TLS_SERVER_NAME": "orders.internal", "POD_NAMESPACE": "shop"},
		url:  "rediss://orders:6380", tls: redisconn.TLSOptions{ServerName: "orders.internal"},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			c, err := app.ParseConfig(tc.args, env(tc.env), io.Discard)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(c.RedisURL).To(Equal(tc.url))
			g.Expect(c.RedisTLS).To(Equal(tc.tls))
		})
	}
}

func with(base, more map[string]string) map[string]string {
	out := maps.Clone(base)
	maps.Copy(out, more)
	return out
}
