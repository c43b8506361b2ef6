package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/redline-dev/redline/internal/redisacl"
	"github.com/redline-dev/redline/internal/testutil/redistest"
	"github.com/redline-dev/redline/internal/testutil/stack"
	"github.com/redline-dev/redline/internal/testutil/tlstest"
)

// managerBinary builds this command (or takes REDLINE_MANAGER_BIN).
func managerBinary(t *testing.T) string {
	t.Helper()
	if bin := os.Getenv(stack.EnvManagerBin); bin != "" {
		return bin
	}
	bin := filepath.Join(t.TempDir(), "manager")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go build ./cmd/manager: %v\n%s", err, out)
	}
	return bin
}

// A bad cluster-wide sidecar default stops the manager at start, with a message naming the
// flag, before it connects to anything: nothing broken is ever injected. No API server or
// Redis is given, so a manager that got past its flags would fail differently.
func TestManagerRefusesBadSidecarDefaults(t *testing.T) {
	bin := managerBinary(t)
	for _, tt := range []struct {
		name string
		args []string
		want []string
	}{
		{"values out of bounds, all reported", []string{"--sidecar-failure-mode=closed", "--sidecar-redis-pool-size=1", "--sidecar-redis-timeout=1m", "--sidecar-memory-request=1Gi"},
			[]string{`--sidecar-failure-mode=\"closed\": want one of Open, Closed, LocalFallback`, "--sidecar-redis-pool-size=1: want 2-1024",
				"--sidecar-redis-timeout=1m0s: want 1ms-10s", "--sidecar-memory-request=1Gi is more than --sidecar-memory-limit=64Mi"}},
		{"trusted hops beyond the bound", []string{"--sidecar-trusted-hops=17"},
			[]string{"--sidecar-trusted-hops=17: want 0-16 proxies"}},
		{"a webhook client CA that is not there", []string{"--webhook-client-ca-file=/nonexistent/ca.crt"},
			[]string{"--webhook-client-ca-file: reading the webhook's client CA"}},
		{"webhook client names without a CA", []string{"--webhook-client-names=kube-apiserver"},
			[]string{"--webhook-client-names needs --webhook-client-ca-file"}},
		{"a value that does not parse", []string{"--sidecar-memory-limit=lots"},
			[]string{`invalid value "lots" for flag -sidecar-memory-limit: want a resource quantity`}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, bin, tt.args...)
			// Nowhere to connect: a manager past its flags would fail on these instead.
			cmd.Env = append(os.Environ(), "KUBECONFIG="+filepath.Join(t.TempDir(), "missing"), "REDLINE_REDIS_URL=redis://127.0.0.1:1")
			var out bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &out
			err := cmd.Run()
			var exit *exec.ExitError
			g.Expect(errors.As(err, &exit)).To(BeTrue(), "the manager must exit with an error, got %v\n%s", err, out.String())
			g.Expect(ctx.Err()).NotTo(HaveOccurred(), "the manager must exit at once, not run")
			for _, w := range tt.want {
				g.Expect(out.String()).To(ContainSubstring(w))
			}
		})
	}
}

// unreachableKubeconfig writes a kubeconfig naming an API server nothing listens on: the
// manager's Redis checks run before anything needs it.
func unreachableKubeconfig(t *testing.T) string {
	t.Helper()
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`), 0o600); err != nil {
		t.Fatal(err)
	}
	return kubeconfig
}

// runToExit runs the manager with --redis-tenant-acl=required against redisURL and the
// kubeconfig, expects it to exit with an error by itself within a minute, and returns what it
// printed.
func runToExit(g *WithT, bin, kubeconfig, redisURL string, args ...string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, append([]string{"--redis-tenant-acl=required", "--metrics-bind-address=0", "--health-probe-bind-address=0"}, args...)...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+kubeconfig, "REDLINE_REDIS_URL="+redisURL)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	var exit *exec.ExitError
	g.Expect(errors.As(err, &exit)).To(BeTrue(), "the manager must exit with an error, got %v\n%s", err, out.String())
	g.Expect(ctx.Err()).NotTo(HaveOccurred(), "the manager must exit by itself\n%s", out.String())
	return out.String()
}

// --redis-tenant-acl=required stops the manager at start when Redis refuses ACL commands (a
// managed service), naming the flag, instead of running with tenants sharing one credential;
// a Redis that answers ACLs gets it past the probe. The API server named is unreachable: the
// probe runs before anything needs it.
func TestManagerRequiredTenantACLRefusesARedisWithoutACLs(t *testing.T) {
	bin := managerBinary(t)
	kubeconfig := unreachableKubeconfig(t)
	run := func(g *WithT, redisURL string) string {
		return runToExit(g, bin, kubeconfig, redisURL)
	}
	t.Run("Redis refuses ACL commands", func(t *testing.T) {
		g := NewWithT(t)
		srv, err := redistest.Start("--rename-command", "ACL", "")
		g.Expect(err).NotTo(HaveOccurred(), "starting redis-server")
		t.Cleanup(func() { _ = srv.Close() })
		out := run(g, srv.URL())
		g.Expect(out).To(ContainSubstring("--redis-tenant-acl=required"))
		g.Expect(out).To(ContainSubstring(redisacl.ErrUnavailable.Error()))
	})
	t.Run("Redis answers ACL commands", func(t *testing.T) {
		g := NewWithT(t)
		srv, err := redistest.Start()
		g.Expect(err).NotTo(HaveOccurred(), "starting redis-server")
		t.Cleanup(func() { _ = srv.Close() })
		out := run(g, srv.URL())
		g.Expect(out).NotTo(ContainSubstring("--redis-tenant-acl=required"))
		g.Expect(out).To(ContainSubstring("creating manager"), "past the probe, the manager fails on the API server")
	})
}

// The manager authenticates as the ACL user --redis-username names, with the password of
// --redis-password-file: against a Redis whose default user is off, it gets past the ACL probe
// (run as that user) with the flag, and is refused without it.
func TestManagerAuthenticatesAsRedisUsername(t *testing.T) {
	bin := managerBinary(t)
	dir := t.TempDir()
	kubeconfig := unreachableKubeconfig(t)
	pwFile := filepath.Join(dir, "password")
	if err := os.WriteFile(pwFile, []byte("admin-secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	srv, err := redistest.Start("--user", "default", "off", "--user", "redline-admin", "on", ">admin-secret", "~*", "&*", "+@all")
	if err != nil {
		t.Fatalf("starting redis-server: %v", err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	run := func(g *WithT, args ...string) string {
		return runToExit(g, bin, kubeconfig, srv.URL(), append([]string{"--redis-password-file=" + pwFile}, args...)...)
	}
	t.Run("as the named user", func(t *testing.T) {
		g := NewWithT(t)
		out := run(g, "--redis-username=redline-admin")
		g.Expect(out).NotTo(ContainSubstring("--redis-tenant-acl=required"))
		g.Expect(out).To(ContainSubstring("creating manager"), "past the probe, the manager fails on the API server")
	})
	t.Run("as the default user", func(t *testing.T) {
		g := NewWithT(t)
		out := run(g)
		g.Expect(out).To(ContainSubstring("--redis-tenant-acl=required"))
		g.Expect(out).NotTo(ContainSubstring("creating manager"))
	})
}

// With Sentinel, --redis-tenant-acl=required also stops the manager when the sentinels have
// no password (anyone reaching them could point the group at a server of their own), naming
// Sentinel; sentinels with a password, which the manager reads from
// --redis-sentinel-password-file, get it past the probe. A URL for sidecars that carries the
// sentinels' credentials is refused before anything connects.
func TestManagerRequiredTenantACLRefusesUnprotectedSentinels(t *testing.T) {
	bin := managerBinary(t)
	kubeconfig := unreachableKubeconfig(t)
	run := func(g *WithT, redisURL string, args ...string) string {
		return runToExit(g, bin, kubeconfig, redisURL, args...)
	}
	t.Run("sentinels without a password", func(t *testing.T) {
		g := NewWithT(t)
		grp, err := redistest.StartSentinel()
		g.Expect(err).NotTo(HaveOccurred(), "starting the sentinel group")
		t.Cleanup(func() { _ = grp.Close() })
		out := run(g, grp.URL())
		g.Expect(out).To(ContainSubstring("--redis-tenant-acl=required"))
		g.Expect(out).To(ContainSubstring("SentinelUnprotected"))
	})
	t.Run("sentinels with a password, given by file", func(t *testing.T) {
		g := NewWithT(t)
		grp, err := redistest.StartSentinelWith(redistest.SentinelOptions{Password: "sentinel-admin"})
		g.Expect(err).NotTo(HaveOccurred(), "starting the sentinel group")
		t.Cleanup(func() { _ = grp.Close() })
		pwFile := filepath.Join(t.TempDir(), "sentinel-password")
		g.Expect(os.WriteFile(pwFile, []byte("sentinel-admin\n"), 0o600)).To(Succeed())
		out := run(g, grp.URL(), "--redis-sentinel-password-file="+pwFile)
		g.Expect(out).NotTo(ContainSubstring("--redis-tenant-acl=required"))
		g.Expect(out).To(ContainSubstring("creating manager"), "past the probe, the manager fails on the API server")
	})
	t.Run("the sentinels' password in the sidecars' URL", func(t *testing.T) {
		g := NewWithT(t)
		out := run(g, "redis+sentinel://:sentinel-admin@127.0.0.1:1/mymaster")
		g.Expect(out).To(ContainSubstring("carries credentials every tenant could read"))
	})
}

// The manager reaches a Redis that speaks TLS only and requires client certificates with its
// --redis-tls-* flags: --redis-tenant-acl=required's probe runs ACL commands on every node over
// TLS, a single server and a Sentinel group (sentinels over TLS too) alike, and past it the
// manager fails on the unreachable API server. Without its client certificate the probe fails
// naming the certificate; TLS flags with a redis:// URL stop it before anything connects.
func TestManagerOverTLS(t *testing.T) {
	bin := managerBinary(t)
	kubeconfig := unreachableKubeconfig(t)
	g := NewWithT(t)
	ca, err := tlstest.NewCA("redis-ca")
	g.Expect(err).NotTo(HaveOccurred())
	node, err := ca.Node("127.0.0.1")
	g.Expect(err).NotTo(HaveOccurred())
	server, err := tlstest.Write(filepath.Join(t.TempDir(), "server"), ca, node)
	g.Expect(err).NotTo(HaveOccurred())
	pair, err := ca.Client("redline-manager")
	g.Expect(err).NotTo(HaveOccurred())
	client, err := tlstest.Write(filepath.Join(t.TempDir(), "client"), ca, pair)
	g.Expect(err).NotTo(HaveOccurred())
	serverTLS := redistest.TLSServer{CertFile: server.Cert, KeyFile: server.Key, CAFile: server.CA, AuthClients: true}
	withCert := []string{"--redis-tls-ca-file=" + client.CA, "--redis-tls-cert-file=" + client.Cert, "--redis-tls-key-file=" + client.Key, "--redis-tls-min-version=1.3"}

	run := func(g *WithT, redisURL string, args ...string) string {
		return runToExit(g, bin, kubeconfig, redisURL, args...)
	}
	t.Run("one server, with its certificate", func(t *testing.T) {
		g := NewWithT(t)
		srv, err := redistest.StartTLS(serverTLS)
		g.Expect(err).NotTo(HaveOccurred())
		t.Cleanup(func() { _ = srv.Close() })
		out := run(g, srv.URL(), withCert...)
		g.Expect(out).NotTo(ContainSubstring("--redis-tenant-acl=required"))
		g.Expect(out).To(ContainSubstring("creating manager"), "past the probe, the manager fails on the API server")
	})
	t.Run("one server, without a certificate", func(t *testing.T) {
		g := NewWithT(t)
		srv, err := redistest.StartTLS(serverTLS)
		g.Expect(err).NotTo(HaveOccurred())
		t.Cleanup(func() { _ = srv.Close() })
		out := run(g, srv.URL(), "--redis-tls-ca-file="+client.CA)
		g.Expect(out).To(ContainSubstring("--redis-tenant-acl=required"))
		g.Expect(out).To(ContainSubstring("tls: certificate required"))
	})
	t.Run("a Sentinel group over TLS", func(t *testing.T) {
		g := NewWithT(t)
		grp, err := redistest.StartSentinelWith(redistest.SentinelOptions{Password: "sentinel-admin", TLS: &serverTLS})
		g.Expect(err).NotTo(HaveOccurred(), "starting the sentinel group")
		t.Cleanup(func() { _ = grp.Close() })
		pwFile := filepath.Join(t.TempDir(), "sentinel-password")
		g.Expect(os.WriteFile(pwFile, []byte("sentinel-admin\n"), 0o600)).To(Succeed())
		out := run(g, grp.URL(), append(withCert, "--redis-sentinel-password-file="+pwFile)...)
		g.Expect(out).NotTo(ContainSubstring("--redis-tenant-acl=required"))
		g.Expect(out).To(ContainSubstring("creating manager"), "past the probe (nodes and sentinels), the manager fails on the API server")
	})
	t.Run("TLS flags with a URL without TLS", func(t *testing.T) {
		g := NewWithT(t)
		out := run(g, "redis://127.0.0.1:1", "--redis-tls-ca-file="+client.CA)
		g.Expect(out).To(ContainSubstring("TLS options are set but the redis URL does not use TLS"))
	})
	t.Run("sidecar TLS flags with a URL without TLS", func(t *testing.T) {
		g := NewWithT(t)
		out := run(g, "redis://127.0.0.1:1", "--sidecar-redis-tls-secret=redline-redis-tls")
		g.Expect(out).To(ContainSubstring("the --sidecar-redis-tls-* flags need a rediss:// or rediss+sentinel:// Redis URL for sidecars"))
	})
}
