// Package app wires the sidecar together: flags and environment, the rule set loader, the
// limiter, the proxy, the decision APIs, health, metrics, heartbeats and graceful shutdown.
// cmd/sidecar is a thin main around Run.
package app

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redline-dev/redline/internal/fleet"
	"github.com/redline-dev/redline/internal/limiter"
	"github.com/redline-dev/redline/internal/redisconn"
	"github.com/redline-dev/redline/internal/sidecar/contract"
	"github.com/redline-dev/redline/internal/sidecar/decide"
	"github.com/redline-dev/redline/internal/sidecar/membudget"
	"github.com/redline-dev/redline/internal/sidecar/slotqueue"
)

// Config is the sidecar's configuration, from flags and environment.
type Config struct {
	Listen   string
	Upstream string
	// UpstreamProtocol is one of contract.UpstreamProtocols.
	UpstreamProtocol string
	AdminListen      string
	GRPCListen       string
	CheckListen      string
	MaxCheckConns    int
	MaxGRPCConns     int
	// MaxConns and MaxConnsPerIP bound the proxy face; MaxAdminConns and MaxAdminConnsPerIP the
	// admin face; the PerIP bounds of the decision faces apply when they are not on loopback.
	MaxConns           int
	MaxConnsPerIP      int
	MaxAdminConns      int
	MaxAdminConnsPerIP int
	MaxCheckConnsPerIP int
	MaxGRPCConnsPerIP  int
	// MemoryLimit is the container's memory limit in bytes (downward API), 0 when unknown; Run
	// sets the Go memory limit from it unless GOMEMLIMIT is set.
	MemoryLimit int64
	// MemoryBudget is what the sidecar may hold for its clients' requests (bodies read to size
	// them, open holds until their settle), in bytes: 0 sizes it from Go's memory limit (membudget.SizeFor), negative is none.
	MemoryBudget      int64
	ConfigDir         string
	PodLabels         string
	FailureMode       string
	TrustedHops       int
	RateLimitHeaders  bool
	RequestTimeout    time.Duration
	ReadHeaderTimeout time.Duration
	IdleTimeout       time.Duration
	MaxHeaderBytes    int
	ShutdownTimeout   time.Duration
	ShutdownDelay     time.Duration
	HeartbeatInterval time.Duration
	Resync            time.Duration
	RedisURL          string
	RedisPassword     string
	RedisCredsDir     string
	RedisPoolSize     int
	// FallbackReplicas is what LocalFallback divides a limit by before any heartbeat is heard
	// (limiter.Options.FallbackReplicas).
	FallbackReplicas int64
	RedisMaxIdle     int
	RedisIdleTimeout time.Duration
	RedisTimeout     time.Duration
	// RedisTLS refines a rediss:// URL's TLS: CA, client certificate, server name, version.
	RedisTLS     redisconn.TLSOptions
	LeaseHorizon time.Duration
	LeaseKeys    int
	// InFlightExpiry is how long an in-flight slot counts without a renewal (limiter.Options.SlotExpiry).
	InFlightExpiry time.Duration
	// InFlightEnvoyHold is how long a slot taken for Envoy's rate limit service is kept
	// without its stream-done call (decide.SlotRegistry.Lease of that face).
	InFlightEnvoyHold time.Duration
	// InFlightQueueMax bounds the requests waiting for a slot, over every key and face.
	InFlightQueueMax int
	// InFlightMaxRenew bounds how long one slot the decision API keeps may be renewed.
	InFlightMaxRenew time.Duration
	ShareKeys        int
	LogLevel         slog.Level
	// DecisionLog is the decision log's mode (decide.DecisionLogOff, Refused or All), of which
	// DecisionLogSample is kept, at most DecisionLogRate lines a second.
	DecisionLog       string
	DecisionLogSample float64
	DecisionLogRate   float64
	Pprof             bool
	// MaxProcs is the GOMAXPROCS Run sets; 0 keeps the runtime's. It is 0 when a GOMAXPROCS
	// environment variable is set, which wins.
	MaxProcs     int
	PodName      string
	PodNamespace string
}

// proxyConnCost is what one proxy connection may hold beyond its request headers, measured
// with the sidecar as a process (TestIdleConnectionFloodOnEveryFace): about 30 KiB for an idle
// keep-alive connection (its goroutine's stack, grown by a proxied request, and its read and
// write buffers) and its share of the keep-alive pool to the application.
const proxyConnCost = 40 << 10

// proxyConnsFor is the proxy's default connection bound: as many connections as half the
// container's memory holds at their worst (full headers each), the other half left to the
// runtime, the binary, the lease table and the other faces; 1024 where the limit is unknown.
// The injector's default 64Mi and 64 KiB headers give 315.
func proxyConnsFor(memoryLimit int64, maxHeaderBytes int) int {
	if memoryLimit <= 0 {
		return 1024
	}
	return int(min(max(memoryLimit/2/int64(proxyConnCost+maxHeaderBytes), 64), 1<<16))
}

// FlagSetName is the name the sidecar's flag set prints in its usage.
const FlagSetName = "redline-sidecar"

// FlagEnv names the environment variable each flag takes its default from, where one does.
var FlagEnv = map[string]string{"redis-url": contract.EnvRedisURL, contract.FlagFallbackReplicas: contract.EnvFallbackReplicas}

// FlagSet is the sidecar's flag set, bound to a configuration nobody reads, with defaults from
// getenv: what -help prints, for the flags reference (internal/docgen).
func FlagSet(getenv func(string) string) *flag.FlagSet {
	fs := flag.NewFlagSet(FlagSetName, flag.ContinueOnError)
	bindFlags(fs, &Config{}, getenv)
	return fs
}

// ParseConfig reads flags from args and the environment through getenv.
func ParseConfig(args []string, getenv func(string) string, output io.Writer) (*Config, error) {
	c := &Config{}
	fs := flag.NewFlagSet(FlagSetName, flag.ContinueOnError)
	fs.SetOutput(output)
	level := bindFlags(fs, c, getenv)
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	return c.finish(fs, *level, getenv)
}

// bindFlags defines the sidecar's flags on fs, into c; it returns where --log-level goes.
func bindFlags(fs *flag.FlagSet, c *Config, getenv func(string) string) *string {
	fs.StringVar(&c.Listen, contract.FlagListen, fmt.Sprintf(":%d", contract.DefaultListenPort), "address of the proxy face")
	fs.StringVar(&c.Upstream, contract.FlagUpstream, "", "the application's host:port (required)")
	fs.StringVar(&c.UpstreamProtocol, contract.FlagUpstreamProtocol, contract.UpstreamProtocolHTTP1, "how the application is spoken to: "+strings.Join(contract.UpstreamProtocols, ", ")+" (the proxy accepts HTTP/1.1 and h2c whatever it is)")
	fs.StringVar(&c.AdminListen, contract.FlagAdminListen, fmt.Sprintf(":%d", contract.AdminPort), "address of /healthz, /readyz and /metrics")
	fs.StringVar(&c.CheckListen, contract.FlagCheckListen, fmt.Sprintf("%s:%d", contract.LoopbackHost, contract.CheckPort),
		"address of the decision API, POST /v1/check; loopback keeps it inside the pod; empty disables it")
	fs.StringVar(&c.GRPCListen, contract.FlagGRPCListen, fmt.Sprintf("%s:%d", contract.LoopbackHost, contract.GRPCPort),
		"address of the Envoy rate limit service (gRPC); loopback keeps it inside the pod; empty disables it")
	fs.IntVar(&c.MaxCheckConns, "max-check-conns", 512, "most client connections /v1/check holds open at once (HTTP/1: one per concurrent caller); more wait to be accepted")
	fs.IntVar(&c.MaxGRPCConns, "max-grpc-conns", 32, "most client connections the rate limit service holds open at once, each with up to 64 concurrent calls; more wait to be accepted")
	fs.IntVar(&c.MaxConns, "max-conns", 0, "most client connections the proxy holds open at once; at the bound the one idle longest is closed for a new one, and with none idle new ones wait to be accepted. 0: sized from the container's memory limit (half of it, at --max-header-bytes plus 40 KiB a connection), or 1024 when it is unknown")
	fs.IntVar(&c.MaxConnsPerIP, "max-conns-per-ip", 0, "most proxy connections from one client IP (0: no per-IP bound; ingress controllers and node SNAT send many clients from one IP)")
	fs.IntVar(&c.MaxAdminConns, "max-admin-conns", 64, "most connections the admin face (health, readiness, metrics) holds open at once")
	fs.IntVar(&c.MaxAdminConnsPerIP, "max-admin-conns-per-ip", 8, "most admin connections from one IP (the kubelet and Prometheus need one or two each)")
	fs.IntVar(&c.MaxCheckConnsPerIP, "max-check-conns-per-ip", 64, "most /v1/check connections from one IP when the decision API is not on loopback")
	fs.IntVar(&c.MaxGRPCConnsPerIP, "max-grpc-conns-per-ip", 8, "most rate limit service connections from one IP when it is not on loopback")
	fs.Int64Var(&c.MemoryBudget, "memory-budget", 0, fmt.Sprintf("most bytes the sidecar holds for its clients' requests at once: the bodies of token budget requests, read to size them, and each open hold of a token budget until its settle (%d bytes); a request that does not fit is answered 503 with Retry-After (OVER_LIMIT on the rate limit service). 0: %d%% of Go's memory limit (GOMEMLIMIT, or %d%% of the container's), or %d MiB when neither is known; -1: no bound (open holds waiting for a later settle are then at most 16,384)", decide.HoldBytes, membudget.DefaultPercent, contract.MemoryLimitPercent, membudget.DefaultSize>>20))
	fs.StringVar(&c.DecisionLog, contract.FlagDecisionLog, decide.DecisionLogOff, "log decisions as JSON lines (msg \"decision\": policy, rule, key hash, result, source): off, refused (the requests a rule refused, Shadow rules' would-refuse included) or all; a key's value only for rules whose topKeys is Values")
	fs.Float64Var(&c.DecisionLogSample, "decision-log-sample", 1, "fraction of the decisions of --decision-log's mode that are logged, in (0, 1]")
	fs.Float64Var(&c.DecisionLogRate, "decision-log-rate", 10, "most decision lines a second, 1-10000; lines past it are counted in redline_sidecar_decision_log_dropped_total, not written")
	fs.BoolVar(&c.Pprof, "pprof", false, "serve Go's profiler at /debug/pprof/ on the admin address (for diagnosing a sidecar, not for production traffic)")
	fs.StringVar(&c.ConfigDir, contract.FlagConfigDir, contract.PoliciesDir, "mounted ConfigMap directory holding policies.json")
	fs.StringVar(&c.PodLabels, contract.FlagPodLabels, contract.PodLabelsFile, "downward API labels file; empty means no labels")
	fs.StringVar(&c.FailureMode, contract.FlagFailureMode, "", "override every policy's failure mode: "+strings.Join(contract.FailureModes, ", "))
	fs.IntVar(&c.TrustedHops, contract.FlagTrustedHops, 0, fmt.Sprintf("proxies in front of the sidecar that append to X-Forwarded-For and are trusted to, 0-%d: the ForwardedFor key part is the entry this many from the right, whatever a client wrote to its left (0: the connection's peer address)", contract.MaxTrustedHops))
	fs.BoolVar(&c.RateLimitHeaders, "ratelimit-headers", true, "add RateLimit-Policy and RateLimit to admitted responses (refusals always carry them)")
	fs.DurationVar(&c.RequestTimeout, "request-timeout", 60*time.Second, "longest wait for the application's response headers (0: none); bodies and upgraded connections are not cut")
	fs.DurationVar(&c.ReadHeaderTimeout, "read-header-timeout", 10*time.Second, "longest time to read a client's request headers")
	fs.DurationVar(&c.IdleTimeout, "idle-timeout", 120*time.Second, "how long an idle client keep-alive connection is kept")
	fs.IntVar(&c.MaxHeaderBytes, "max-header-bytes", 64<<10, "largest request header block accepted")
	fs.DurationVar(&c.ShutdownTimeout, "shutdown-timeout", 25*time.Second, "longest wait for in-flight requests to finish on SIGTERM")
	fs.DurationVar(&c.ShutdownDelay, "shutdown-delay", 0, "on SIGTERM, keep serving (unready) this long before closing listeners, while endpoints update")
	fs.DurationVar(&c.HeartbeatInterval, "heartbeat-interval", fleet.DefaultInterval, "time between heartbeats in Redis; a replica counts as live for 3 intervals")
	fs.DurationVar(&c.InFlightExpiry, "in-flight-expiry", limiter.DefaultSlotExpiry, "how long an in-flight rule's slot counts without a renewal (2s to 10m), renewed every quarter of it: a dead sidecar's slots return this long after their last renewal at most")
	fs.IntVar(&c.InFlightQueueMax, "in-flight-queue-max", slotqueue.DefaultMax, "most requests waiting for a slot of an in-flight rule's queue in this sidecar, over every key and both faces (1 to 1000000); the proxy's at most half of --max-conns and /v1/check's at most half of --max-check-conns (each holds a connection of its face); each also draws on the memory budget")
	fs.DurationVar(&c.InFlightMaxRenew, "in-flight-max-renew", time.Hour, "longest a slot /v1/check keeps may be renewed, from its acquire (1m to 168h): a renew past it answers 410 and the slot goes back")
	fs.DurationVar(&c.InFlightEnvoyHold, "in-flight-envoy-hold", 10*time.Minute, "how long a slot taken for an Envoy descriptor of an in-flight rule is kept without its stream-done call (2s to 24h): Envoy cannot renew, so this bounds what an Envoy that never comes back holds, and a stream running longer loses its slot")
	fs.DurationVar(&c.Resync, "resync", 10*time.Second, "re-read the policies even without a change event this often")
	fs.StringVar(&c.RedisURL, "redis-url", getenv(contract.EnvRedisURL), "Redis URL (default $"+contract.EnvRedisURL+"); $"+contract.EnvNamespaceRedisURL+", set by the injector from the namespace's redline-sidecar-redis ConfigMap, wins, with the TLS settings beside it replacing every --redis-tls-* flag")
	fs.StringVar(&c.RedisCredsDir, contract.FlagRedisCredentialsDir, "", "directory of the mounted Redis credentials Secret (files username and password; with Sentinel, sentinel-username and sentinel-password for the sentinels), read at every new connection so a rotated password needs no restart; without a password file there, $"+contract.EnvRedisPassword)
	fs.IntVar(&c.RedisPoolSize, contract.FlagRedisPoolSize, contract.DefaultRedisPoolSize, "most Redis connections per node, a hard bound; they open when a call needs one")
	fs.Int64Var(&c.FallbackReplicas, contract.FlagFallbackReplicas, 0, fmt.Sprintf("replicas LocalFallback divides a limit by while no heartbeat of the policy's replicas has been heard, as in a pod started during a Redis outage; heard heartbeats win (0: 1; default $%s, which the injector sets to the workload's largest replica count)", contract.EnvFallbackReplicas))
	fs.IntVar(&c.RedisMaxIdle, "redis-max-idle-conns", 0, "idle Redis connections kept per node (0: the pool); one returned beyond them closes, and under load is redialed")
	fs.DurationVar(&c.RedisIdleTimeout, "redis-idle-timeout", contract.DefaultRedisIdleTimeoutSeconds*time.Second, "a Redis connection idle this long closes (a pod at rest keeps the one its heartbeat uses)")
	fs.DurationVar(&c.RedisTimeout, contract.FlagRedisTimeout, contract.DefaultRedisTimeoutMillis*time.Millisecond, "Redis read and write timeout; slower answers are decided by the failure mode")
	fs.StringVar(&c.RedisTLS.CAFile, contract.FlagRedisTLSCAFile, "", "with rediss://: PEM file of the CAs that sign Redis's certificates, instead of the system's (the injector's "+contract.RedisTLSDir+"/"+contract.RedisTLSCAKey+"); read again at a new connection when it changed")
	fs.StringVar(&c.RedisTLS.CertFile, contract.FlagRedisTLSCertFile, "", "with rediss://: PEM file of the client certificate for a Redis that requires one (with --"+contract.FlagRedisTLSKeyFile+"); read again at a new connection when it changed")
	fs.StringVar(&c.RedisTLS.KeyFile, contract.FlagRedisTLSKeyFile, "", "with rediss://: PEM file of the client certificate's private key")
	fs.StringVar(&c.RedisTLS.ServerName, contract.FlagRedisTLSServerName, "", "with rediss://: the name Redis's certificates must carry (empty: the host each connection dials)")
	fs.StringVar(&c.RedisTLS.MinVersion, contract.FlagRedisTLSMinVersion, "", "with rediss://: oldest TLS version accepted, "+redisconn.TLSVersion12+" or "+redisconn.TLSVersion13+" (empty: "+redisconn.TLSVersion12+")")
	fs.IntVar(&c.ShareKeys, "share-keys", contract.DefaultShareKeys, "most keys whose shares (what this replica was granted in their live windows, about 150 bytes a key) are kept to restore counts Redis loses in a failover or restart; a key beyond it keeps none")
	fs.IntVar(&c.LeaseKeys, contract.FlagLeaseKeys, contract.DefaultLeaseKeys, fmt.Sprintf("most keys holding a lease at once (1-%d), up to %d bytes each (the garbage collector's headroom included); a new key beyond it sends the least recently used lease's unspent units back to Redis, and that key's next decision asks Redis for a new lease", contract.MaxLeaseKeys, contract.LeaseKeyBytes))
	fs.DurationVar(&c.LeaseHorizon, contract.FlagLeaseHorizon, contract.DefaultLeaseHorizonSeconds*time.Second, "FixedWindow and SlidingWindowCounter rules admit from leases of about this long's local demand, counted in Redis when granted (exact across replicas); 0 asks Redis for every decision")
	fs.IntVar(&c.MaxProcs, contract.FlagMaxProcs, contract.DefaultMaxProcs, "CPUs running Go code at once (GOMAXPROCS); 0: Go's default, the container's CPU limit but at least 2. A GOMAXPROCS environment variable wins")
	return fs.String("log-level", "info", "debug, info, warn or error")
}

// finish takes what flags cannot say (the environment, derived defaults) and checks it all.
func (c *Config) finish(fs *flag.FlagSet, level string, getenv func(string) string) (*Config, error) {
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if getenv("GOMAXPROCS") != "" {
		c.MaxProcs = 0 // the runtime applied it already
	}
	c.RedisPassword = getenv(contract.EnvRedisPassword)
	c.PodName = getenv(contract.EnvPodName)
	c.PodNamespace = getenv(contract.EnvPodNamespace)
	var errs []error
	if v := getenv(contract.EnvMemoryLimit); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			errs = append(errs, fmt.Errorf("$%s=%q: want the container's memory limit in bytes", contract.EnvMemoryLimit, v))
		}
		c.MemoryLimit = n
	}
	errs = append(errs, c.fromWorkloadEnv(fs, getenv)...)
	if err := c.LogLevel.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	if c.MaxConns == 0 {
		c.MaxConns = proxyConnsFor(c.MemoryLimit, c.MaxHeaderBytes)
	}
	if c.Upstream == "" {
		errs = append(errs, fmt.Errorf("--%s is required (the application's host:port)", contract.FlagUpstream))
	}
	if _, err := decide.NewDecisionLog(slog.Default(), c.DecisionLog, c.DecisionLogSample, c.DecisionLogRate); err != nil {
		errs = append(errs, fmt.Errorf("--decision-log: %w", err))
	}
	if c.PodNamespace == "" {
		// Keys and heartbeats are named after it; a document cannot choose it (see
		// ruleset.Builder.Namespace).
		errs = append(errs, fmt.Errorf("no namespace: set $%s to the pod's namespace (the injector sets it from the downward API)", contract.EnvPodNamespace))
	}
	c.namespaceRedis(getenv)
	if c.RedisURL == "" {
		errs = append(errs, fmt.Errorf("no Redis URL: set $%s or --redis-url", contract.EnvRedisURL))
	}
	errs = append(errs, c.redisTLSErrors()...)
	errs = append(errs, c.inFlightErrors()...)
	if !slices.Contains(contract.UpstreamProtocols, c.UpstreamProtocol) {
		errs = append(errs, fmt.Errorf("--%s=%q: want one of %s", contract.FlagUpstreamProtocol, c.UpstreamProtocol, strings.Join(contract.UpstreamProtocols, ", ")))
	}
	if c.FailureMode != "" && !slices.Contains(contract.FailureModes, c.FailureMode) {
		errs = append(errs, fmt.Errorf("--%s=%q: want one of %s", contract.FlagFailureMode, c.FailureMode, strings.Join(contract.FailureModes, ", ")))
	}
	if !inRange(c.TrustedHops, 0, contract.MaxTrustedHops) {
		errs = append(errs, fmt.Errorf("--%s=%d: want 0-%d", contract.FlagTrustedHops, c.TrustedHops, contract.MaxTrustedHops))
	}
	if c.HeartbeatInterval <= 0 {
		errs = append(errs, errors.New("--heartbeat-interval must be positive"))
	}
	if c.MaxProcs < 0 {
		errs = append(errs, errors.New("--max-procs must not be negative"))
	}
	if c.RedisMaxIdle < 0 || c.RedisIdleTimeout <= 0 {
		errs = append(errs, errors.New("--redis-max-idle-conns must not be negative and --redis-idle-timeout must be positive"))
	}
	if !inRange(c.ShareKeys, 1, contract.MaxShareKeys) {
		errs = append(errs, fmt.Errorf("--share-keys must be 1 to %d (about 150 bytes a key)", contract.MaxShareKeys))
	}
	if !inRange(c.LeaseKeys, 1, contract.MaxLeaseKeys) {
		errs = append(errs, fmt.Errorf("--lease-keys must be 1 to %d (up to %d bytes a key)", contract.MaxLeaseKeys, contract.LeaseKeyBytes))
	}
	if c.RedisTimeout <= 0 {
		// go-redis reads 0 as its own 3s and a negative timeout as none: a sidecar would wait
		// on a hung Redis forever instead of answering with the failure mode.
		errs = append(errs, fmt.Errorf("--%s must be positive", contract.FlagRedisTimeout))
	}
	if c.MaxCheckConns < 1 || c.MaxGRPCConns < 1 || c.MaxConns < 1 || c.MaxAdminConns < 1 {
		errs = append(errs, errors.New("--max-admin-conns, --max-check-conns and --max-grpc-conns must be at least 1, --max-conns at least 0 (0: from the memory limit)"))
	}
	if min(c.MaxConnsPerIP, c.MaxAdminConnsPerIP, c.MaxCheckConnsPerIP, c.MaxGRPCConnsPerIP) < 0 {
		errs = append(errs, errors.New("the --max-*-per-ip bounds must not be negative (0: none)"))
	}
	if c.MemoryBudget < -1 {
		errs = append(errs, errors.New("--memory-budget must be -1 (no bound), 0 (from the memory limit) or a number of bytes"))
	}
	if c.MaxHeaderBytes < 4096 {
		errs = append(errs, errors.New("--max-header-bytes must be at least 4096"))
	}
	return c, errors.Join(errs...)
}

// maxFallbackReplicas bounds --fallback-replicas: a larger divisor admits nothing anyway.
const maxFallbackReplicas = 1 << 20

// fromWorkloadEnv takes what the manager wrote for the pod's workload, through the variables
// the injector sets from the namespace's sidecar ConfigMap: the budget's pool, which wins over
// --redis-pool-size (the manager's default there), and the fallback's replicas, unless
// --fallback-replicas was given. An unset variable leaves the flag's value.
func (c *Config) fromWorkloadEnv(fs *flag.FlagSet, getenv func(string) string) []error {
	var errs []error
	if v := getenv(contract.EnvBudgetRedisPoolSize); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || !inRange(n, contract.MinRedisPoolSize, contract.MaxRedisPoolSize) {
			errs = append(errs, fmt.Errorf("$%s=%q: want %d-%d connections", contract.EnvBudgetRedisPoolSize, v, contract.MinRedisPoolSize, contract.MaxRedisPoolSize))
		} else {
			c.RedisPoolSize = n
		}
	}
	given := false
	fs.Visit(func(f *flag.Flag) { given = given || f.Name == contract.FlagFallbackReplicas })
	if v := getenv(contract.EnvFallbackReplicas); v != "" && !given {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 || n > maxFallbackReplicas {
			return append(errs, fmt.Errorf("$%s=%q: want a replica count, 0-%d", contract.EnvFallbackReplicas, v, maxFallbackReplicas))
		}
		c.FallbackReplicas = n
	}
	if c.FallbackReplicas < 0 || c.FallbackReplicas > maxFallbackReplicas {
		errs = append(errs, fmt.Errorf("--%s=%d: want 0-%d", contract.FlagFallbackReplicas, c.FallbackReplicas, maxFallbackReplicas))
	}
	return errs
}

// inRange reports whether lo <= n <= hi.
func inRange(n, lo, hi int) bool { return lo <= n && n <= hi }

// redisTLSErrors checks the --redis-tls-* flags, against the URL too: TLS settings for a
// redis:// URL are a mistake, not a plaintext connection someone thought was verified.
func (c *Config) redisTLSErrors() []error {
	var errs []error
	if err := c.RedisTLS.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("--redis-tls-*: %w", err))
	}
	if c.RedisURL != "" && !redisconn.URLUsesTLS(c.RedisURL) && !c.RedisTLS.IsZero() {
		errs = append(errs, fmt.Errorf("the --redis-tls-* flags need a rediss:// or rediss+sentinel:// Redis URL, got %s", redisconn.RedactURL(c.RedisURL)))
	}
	return errs
}

// namespaceRedis takes the Redis of the pod's namespace where its ConfigMap names one: the
// URL and all five TLS settings together, an empty one unset, so that nothing of the cluster's
// Redis (its CA, its server name) is applied to the namespace's. Without it the URL and flags
// stand: the cluster's Redis, which every injected pod is given alike, and what pods injected
// before the namespace's settings came this way were given (their flags expanded from the
// same ConfigMap by kubelet).
func (c *Config) namespaceRedis(getenv func(string) string) {
	url := getenv(contract.EnvNamespaceRedisURL)
	if url == "" {
		return
	}
	c.RedisURL = url
	c.RedisTLS = redisconn.TLSOptions{
		ServerName: getenv(contract.EnvNamespaceRedisTLSServerName),
		MinVersion: getenv(contract.EnvNamespaceRedisTLSMinVersion),
		CAFile:     getenv(contract.EnvNamespaceRedisTLSCAFile),
		CertFile:   getenv(contract.EnvNamespaceRedisTLSCertFile),
		KeyFile:    getenv(contract.EnvNamespaceRedisTLSKeyFile),
	}
}

// inFlightErrors checks the in-flight slots' flags.
func (c *Config) inFlightErrors() []error {
	var errs []error
	if c.InFlightExpiry < 2*time.Second || c.InFlightExpiry > 10*time.Minute {
		errs = append(errs, errors.New("--in-flight-expiry must be 2s to 10m"))
	}
	if c.InFlightEnvoyHold < 2*time.Second || c.InFlightEnvoyHold > 24*time.Hour {
		errs = append(errs, errors.New("--in-flight-envoy-hold must be 2s to 24h"))
	}
	if c.InFlightQueueMax < 1 || c.InFlightQueueMax > 1_000_000 {
		errs = append(errs, errors.New("--in-flight-queue-max must be 1 to 1000000"))
	}
	if c.InFlightMaxRenew < time.Minute || c.InFlightMaxRenew > 168*time.Hour {
		errs = append(errs, errors.New("--in-flight-max-renew must be 1m to 168h"))
	}
	return errs
}
