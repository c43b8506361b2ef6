package podinject

import (
	"flag"
	"io"
	"strconv"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/redline-dev/redline/internal/redisconn"
)

// parseFlags is the manager's flag parsing of the webhook's flags, then Validate.
func parseFlags(args ...string) (Config, error) {
	cfg := DefaultConfig()
	fs := flag.NewFlagSet("manager", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	cfg.BindFlags(fs)
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	return cfg, cfg.Validate()
}

func TestSidecarDefaultFlags(t *testing.T) {
	g := NewWithT(t)
	cfg, err := parseFlags()
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(cfg.SidecarFailureMode).To(BeEmpty(), "unset: each policy's own failure mode")
	g.Expect(cfg.SidecarMaxProcs).To(BeZero())
	g.Expect(cfg.SidecarRedisPoolSize).To(BeZero())
	g.Expect(cfg.RedisPoolCeiling()).To(Equal(16))
	g.Expect(cfg.SidecarLeaseKeys).To(BeZero())
	g.Expect(cfg.SidecarLeaseHorizon).To(BeNil())
	g.Expect(cfg.SidecarRedisTimeout).To(BeZero())
	g.Expect(cfg.DefaultCPURequest.String()).To(Equal("50m"), "today's defaults when unset")
	g.Expect(cfg.DefaultMemoryRequest.String()).To(Equal("32Mi"))
	g.Expect(cfg.DefaultMemoryLimit.String()).To(Equal("64Mi"))

	cfg, err = parseFlags("--sidecar-failure-mode=Closed", "--sidecar-cpu-request=100m", "--sidecar-memory-request=96Mi",
		"--sidecar-memory-limit=128Mi", "--sidecar-max-procs=2", "--sidecar-redis-pool-size=32", "--sidecar-lease-keys=4096",
		"--sidecar-lease-horizon=0", "--sidecar-redis-timeout=100ms")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(cfg.SidecarFailureMode).To(Equal("Closed"))
	g.Expect(cfg.DefaultCPURequest.Equal(resource.MustParse("100m"))).To(BeTrue())
	g.Expect(cfg.DefaultMemoryRequest.Equal(resource.MustParse("96Mi"))).To(BeTrue())
	g.Expect(cfg.DefaultMemoryLimit.Equal(resource.MustParse("128Mi"))).To(BeTrue())
	g.Expect(cfg.SidecarMaxProcs).To(Equal(2))
	g.Expect(cfg.SidecarRedisPoolSize).To(Equal(32))
	g.Expect(cfg.RedisPoolCeiling()).To(Equal(32))
	g.Expect(cfg.SidecarLeaseKeys).To(Equal(4096))
	g.Expect(cfg.SidecarLeaseHorizon).To(HaveValue(Equal(time.Duration(0))), "0 is set (leases off), not unset")
	g.Expect(cfg.SidecarRedisTimeout).To(Equal(100 * time.Millisecond))
}

// A bad default is refused at start, naming the flag, instead of reaching every injected pod.
func TestSidecarDefaultFlagsRefuseBadValues(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"--sidecar-failure-mode=closed"}, `--sidecar-failure-mode="closed": want one of Open, Closed, LocalFallback`},
		{[]string{"--sidecar-cpu-request=lots"}, `invalid value "lots" for flag -sidecar-cpu-request: want a resource quantity`},
		{[]string{"--sidecar-cpu-request=0"}, "--sidecar-cpu-request=0: want a positive quantity"},
		{[]string{"--sidecar-memory-limit=-64Mi"}, "--sidecar-memory-limit=-64Mi: want a positive quantity"},
		{[]string{"--sidecar-memory-request=128Mi"}, "--sidecar-memory-request=128Mi is more than --sidecar-memory-limit=64Mi"},
		{[]string{"--sidecar-max-procs=65"}, "--sidecar-max-procs=65: want 1-64 CPUs"},
		{[]string{"--sidecar-max-procs=-1"}, "--sidecar-max-procs=-1: want 1-64 CPUs"},
		{[]string{"--sidecar-redis-pool-size=1"}, "--sidecar-redis-pool-size=1: want 2-1024 connections per Redis node"},
		{[]string{"--sidecar-redis-pool-size=1025"}, "--sidecar-redis-pool-size=1025: want 2-1024"},
		{[]string{"--sidecar-lease-keys=-1"}, "--sidecar-lease-keys=-1: want 1-1048576"},
		{[]string{"--sidecar-lease-keys=1048577"}, "--sidecar-lease-keys=1048577: want 1-1048576"},
		{[]string{"--sidecar-lease-keys=100000"}, "--sidecar-memory-limit=64Mi: a full lease table of 100000 keys (--sidecar-lease-keys) takes up to 77 MiB"},
		{[]string{"--sidecar-memory-request=16Mi", "--sidecar-memory-limit=16Mi"}, "--sidecar-memory-limit=16Mi: a full lease table of 16384 keys"},
		{[]string{"--sidecar-lease-horizon=soon"}, `invalid value "soon" for flag -sidecar-lease-horizon: want a duration such as 2s`},
		{[]string{"--sidecar-lease-horizon=-1s"}, "--sidecar-lease-horizon=-1s: want 0 (leases off) to 1m0s"},
		{[]string{"--sidecar-lease-horizon=2m"}, "--sidecar-lease-horizon=2m0s: want 0 (leases off) to 1m0s"},
		{[]string{"--sidecar-redis-timeout=500us"}, "--sidecar-redis-timeout=500µs: want 1ms-10s"},
		{[]string{"--sidecar-redis-timeout=-50ms"}, "--sidecar-redis-timeout=-50ms: want 1ms-10s"},
		{[]string{"--sidecar-redis-timeout=11s"}, "--sidecar-redis-timeout=11s: want 1ms-10s"},
	} {
		t.Run(tt.args[0], func(t *testing.T) {
			g := NewWithT(t)
			_, err := parseFlags(tt.args...)
			g.Expect(err).To(MatchError(ContainSubstring(tt.want)))
		})
	}

	t.Run("every mistake at once", func(t *testing.T) {
		g := NewWithT(t)
		_, err := parseFlags("--sidecar-failure-mode=Sometimes", "--sidecar-max-procs=100", "--sidecar-redis-timeout=1m")
		g.Expect(err).To(MatchError(ContainSubstring("--sidecar-failure-mode")))
		g.Expect(err).To(MatchError(ContainSubstring("--sidecar-max-procs")))
		g.Expect(err).To(MatchError(ContainSubstring("--sidecar-redis-timeout")))
	})

	t.Run("a larger table fits a larger limit", func(t *testing.T) {
		g := NewWithT(t)
		_, err := parseFlags("--sidecar-lease-keys=100000", "--sidecar-memory-limit=192Mi")
		g.Expect(err).NotTo(HaveOccurred())
	})
}

// --sidecar-trusted-hops: 0 (the peer address) unless set, 0-16, a bad value refused at start.
func TestSidecarTrustedHopsFlag(t *testing.T) {
	g := NewWithT(t)
	cfg, err := parseFlags()
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(cfg.SidecarTrustedHops).To(BeZero(), "unset: the connection's peer address")
	for _, n := range []string{"0", "1", "16"} {
		cfg, err = parseFlags("--sidecar-trusted-hops=" + n)
		g.Expect(err).NotTo(HaveOccurred(), n)
		g.Expect(strconv.Itoa(cfg.SidecarTrustedHops)).To(Equal(n))
	}
	for arg, want := range map[string]string{
		"--sidecar-trusted-hops=-1":  "--sidecar-trusted-hops=-1: want 0-16 proxies",
		"--sidecar-trusted-hops=17":  "--sidecar-trusted-hops=17: want 0-16 proxies",
		"--sidecar-trusted-hops=two": `invalid value "two" for flag -sidecar-trusted-hops`,
	} {
		_, err := parseFlags(arg)
		g.Expect(err).To(MatchError(ContainSubstring(want)), arg)
	}
}

// The --sidecar-redis-tls-* flags fill SidecarRedisTLS; a client certificate without its
// Secret, a bad Secret name or version, or TLS settings for a sidecar URL without TLS are
// refused at start.
func TestSidecarRedisTLSFlags(t *testing.T) {
	g := NewWithT(t)
	cfg, err := parseFlags("--sidecar-redis-url=rediss://redis.internal:6380", "--sidecar-redis-tls-secret=redline-redis-tls",
		"--sidecar-redis-tls-client-cert", "--sidecar-redis-tls-server-name=redis.internal", "--sidecar-redis-tls-min-version=1.3")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(cfg.SidecarRedisTLS).To(Equal(SidecarTLS{Secret: "redline-redis-tls", ClientCertificate: true, ServerName: "redis.internal", MinVersion: "1.3"}))

	cfg, err = parseFlags()
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(cfg.SidecarRedisTLS).To(BeZero(), "unset: nothing mounted, the system's CAs")

	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"--sidecar-redis-tls-client-cert"}, "--sidecar-redis-tls-client-cert needs --sidecar-redis-tls-secret"},
		{[]string{"--sidecar-redis-tls-secret=Redis_TLS"}, `--sidecar-redis-tls-secret="Redis_TLS": a lowercase RFC 1123 subdomain`},
		{[]string{"--sidecar-redis-tls-min-version=1.0"}, `TLS minimum version "1.0": want 1.2 or 1.3`},
		{[]string{"--sidecar-redis-url=redis://redis:6379", "--sidecar-redis-tls-secret=redline-redis-tls"},
			"the --sidecar-redis-tls-* flags need a rediss:// or rediss+sentinel:// Redis URL for sidecars, got redis://redis:6379"},
	} {
		t.Run(tt.args[len(tt.args)-1], func(t *testing.T) {
			_, err := parseFlags(tt.args...)
			NewWithT(t).Expect(err).To(MatchError(ContainSubstring(tt.want)))
		})
	}

	// Sidecars on the manager's Redis verify the same name, at the same versions.
	tlsCfg := SidecarTLS{Secret: "s"}
	tlsCfg.DefaultFrom(redisconn.TLSOptions{CAFile: "/m/ca.crt", ServerName: "redis.internal", MinVersion: "1.3"})
	g.Expect(tlsCfg).To(Equal(SidecarTLS{Secret: "s", ServerName: "redis.internal", MinVersion: "1.3"}), "never the manager's files")
	tlsCfg = SidecarTLS{ServerName: "own.internal", MinVersion: "1.2"}
	tlsCfg.DefaultFrom(redisconn.TLSOptions{ServerName: "redis.internal", MinVersion: "1.3"})
	g.Expect(tlsCfg).To(Equal(SidecarTLS{ServerName: "own.internal", MinVersion: "1.2"}), "the sidecar flags win")
}
