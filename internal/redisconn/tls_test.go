package redisconn_test

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"github.com/redis/go-redis/v9"

	"github.com/redline-dev/redline/internal/redisconn"
	"github.com/redline-dev/redline/internal/testutil/kubeletdir"
	"github.com/redline-dev/redline/internal/testutil/redistest"
	"github.com/redline-dev/redline/internal/testutil/tlstest"
)

// tlsSetup is a CA, a loopback redis-server certificate it signed and a client certificate,
// written as a kubernetes.io/tls Secret with its CA is mounted.
type tlsSetup struct {
	ca     *tlstest.CA
	server tlstest.Files // the server's ca.crt, tls.crt, tls.key
	client tlstest.Files // the client's
}

func newTLSSetup(t *testing.T, hosts ...string) tlsSetup {
	t.Helper()
	g := NewWithT(t)
	ca, err := tlstest.NewCA("redline-test-ca")
	g.Expect(err).NotTo(HaveOccurred())
	if len(hosts) == 0 {
		hosts = []string{"127.0.0.1"}
	}
	node, err := ca.Node(hosts...)
	g.Expect(err).NotTo(HaveOccurred())
	server, err := tlstest.Write(filepath.Join(t.TempDir(), "server"), ca, node)
	g.Expect(err).NotTo(HaveOccurred())
	cl, err := ca.Client("redline-sidecar")
	g.Expect(err).NotTo(HaveOccurred())
	client, err := tlstest.Write(filepath.Join(t.TempDir(), "client"), ca, cl)
	g.Expect(err).NotTo(HaveOccurred())
	return tlsSetup{ca: ca, server: server, client: client}
}

func (s tlsSetup) serverTLS(authClients bool) redistest.TLSServer {
	return redistest.TLSServer{CertFile: s.server.Cert, KeyFile: s.server.Key, CAFile: s.server.CA, AuthClients: authClients}
}

func startTLS(t *testing.T, cfg redistest.TLSServer, extra ...string) *redistest.Server {
	t.Helper()
	srv, err := redistest.StartTLS(cfg, extra...)
	if err != nil {
		t.Fatalf("starting redis-server with TLS: %v", err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	return srv
}

// ping builds a client of url with tlsOpts and pings once, on a fresh connection.
func ping(t *testing.T, url string, tlsOpts redisconn.TLSOptions) error {
	t.Helper()
	c, err := redisconn.NewClient(url, redisconn.Options{TLS: tlsOpts, DialTimeout: 5 * time.Second, ReadTimeout: 5 * time.Second, WriteTimeout: 5 * time.Second, PoolTimeout: 5 * time.Second})
	if err != nil {
		return err
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return c.Ping(ctx).Err()
}

// A rediss:// server whose certificate a private CA signed: verified with that CA, refused
// with the system's CAs or another CA, with an error that says what is wrong with the
// certificate.
func TestTLSServerVerifiedWithAPrivateCA(t *testing.T) {
	g := NewWithT(t)
	s := newTLSSetup(t)
	srv := startTLS(t, s.serverTLS(false))
	g.Expect(srv.URL()).To(HavePrefix("rediss://"))

	g.Expect(ping(t, srv.URL(), redisconn.TLSOptions{CAFile: s.client.CA})).To(Succeed())

	err := ping(t, srv.URL(), redisconn.TLSOptions{})
	g.Expect(err).To(MatchError(ContainSubstring("x509: certificate signed by unknown authority")))
	g.Expect(err).To(MatchError(ContainSubstring("the server's certificate is not signed by a CA in the system's CAs")))

	other := newTLSSetup(t)
	err = ping(t, srv.URL(), redisconn.TLSOptions{CAFile: other.client.CA})
	g.Expect(err).To(MatchError(ContainSubstring("x509: certificate signed by unknown authority")))
	g.Expect(err).To(MatchError(ContainSubstring("not signed by a CA in the CA bundle " + other.client.CA)))

	// TLS options on a URL without TLS are a mistake, not a plaintext connection.
	_, err = redisconn.NewClient("redis://"+srv.Addr(), redisconn.Options{TLS: redisconn.TLSOptions{CAFile: s.client.CA}})
	g.Expect(err).To(MatchError(ContainSubstring("the redis URL does not use TLS")))
}

// Each connection verifies the host it dials unless a server name is given: a certificate
// for a DNS name only is refused at 127.0.0.1, accepted under that name, and a name the
// certificate does not carry is refused naming both.
func TestTLSServerName(t *testing.T) {
	g := NewWithT(t)
	s := newTLSSetup(t, "redis.redline.internal")
	cfg := s.serverTLS(false)
	cfg.ServerName = "redis.redline.internal"
	srv := startTLS(t, cfg)

	err := ping(t, srv.URL(), redisconn.TLSOptions{CAFile: s.client.CA})
	g.Expect(err).To(MatchError(ContainSubstring("x509: cannot validate certificate for 127.0.0.1 because it doesn't contain any IP SANs")))
	g.Expect(err).To(MatchError(ContainSubstring("the host dialed, 127.0.0.1")))

	g.Expect(ping(t, srv.URL(), redisconn.TLSOptions{CAFile: s.client.CA, ServerName: "redis.redline.internal"})).To(Succeed())

	err = ping(t, srv.URL(), redisconn.TLSOptions{CAFile: s.client.CA, ServerName: "other.redline.internal"})
	g.Expect(err).To(MatchError(ContainSubstring("certificate is valid for redis.redline.internal, not other.redline.internal")))
	g.Expect(err).To(MatchError(ContainSubstring("the server name other.redline.internal")))
}

// A Redis that requires client certificates (tls-auth-clients yes) takes a client that
// presents one its CA signed, and refuses one that presents none or one of another CA.
func TestTLSClientCertificate(t *testing.T) {
	g := NewWithT(t)
	s := newTLSSetup(t)
	srv := startTLS(t, s.serverTLS(true))

	g.Expect(ping(t, srv.URL(), redisconn.TLSOptions{CAFile: s.client.CA, CertFile: s.client.Cert, KeyFile: s.client.Key})).To(Succeed())

	err := ping(t, srv.URL(), redisconn.TLSOptions{CAFile: s.client.CA})
	g.Expect(err).To(MatchError(ContainSubstring("certificate required")), "no client certificate")

	other := newTLSSetup(t)
	err = ping(t, srv.URL(), redisconn.TLSOptions{CAFile: s.client.CA, CertFile: other.client.Cert, KeyFile: other.client.Key})
	g.Expect(err).To(MatchError(ContainSubstring("tls: unknown certificate authority")), "a client certificate of another CA")

	// A certificate without its key, or a key of another certificate, fails at once.
	_, err = redisconn.NewClient(srv.URL(), redisconn.Options{TLS: redisconn.TLSOptions{CertFile: s.client.Cert}})
	g.Expect(err).To(MatchError(ContainSubstring("needs both its certificate file and its key file")))
	_, err = redisconn.NewClient(srv.URL(), redisconn.Options{TLS: redisconn.TLSOptions{CertFile: s.client.Cert, KeyFile: other.client.Key}})
	g.Expect(err).To(MatchError(ContainSubstring("private key does not match public key")))
	_, err = redisconn.NewClient(srv.URL(), redisconn.Options{TLS: redisconn.TLSOptions{CAFile: s.client.Key}})
	g.Expect(err).To(MatchError(ContainSubstring("no PEM certificate in it")))
}

// The minimum version is 1.2 unless 1.3 is asked for: a Redis that speaks TLS 1.2 only is
// reached by default and refused with 1.3.
func TestTLSMinimumVersion(t *testing.T) {
	g := NewWithT(t)
	s := newTLSSetup(t)
	srv := startTLS(t, s.serverTLS(false), "--tls-protocols", "TLSv1.2")

	g.Expect(ping(t, srv.URL(), redisconn.TLSOptions{CAFile: s.client.CA})).To(Succeed())
	g.Expect(ping(t, srv.URL(), redisconn.TLSOptions{CAFile: s.client.CA, MinVersion: redisconn.TLSVersion13})).
		To(MatchError(ContainSubstring("protocol version")))
	_, err := redisconn.NewClient(srv.URL(), redisconn.Options{TLS: redisconn.TLSOptions{MinVersion: "1.1"}})
	g.Expect(err).To(MatchError(ContainSubstring(`TLS minimum version "1.1": want 1.2 or 1.3`)))
}

// A client certificate, its key and the CA bundle mounted from a Secret rotate: each new
// connection uses the files as they are then, connections already open keep theirs, and a
// rotation to files that do not parse is reported once while the last good ones stay in use.
func TestTLSFilesRotate(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	s := newTLSSetup(t)
	srv := startTLS(t, s.serverTLS(true))
	other := newTLSSetup(t) // a CA the server does not trust

	dir := filepath.Join(t.TempDir(), "redis-tls")
	mount := func(ca []byte, p tlstest.Pair) {
		t.Helper()
		g.Expect(kubeletdir.Write(dir, map[string][]byte{"ca.crt": ca, "tls.crt": p.CertPEM, "tls.key": p.KeyPEM})).To(Succeed())
	}
	first, err := s.ca.Client("pod-0")
	g.Expect(err).NotTo(HaveOccurred())
	mount(s.ca.PEM, first)

	var (
		mu       sync.Mutex
		reported []error
	)
	c, err := redisconn.NewClient(srv.URL(), redisconn.Options{
		PoolSize: 64, DialTimeout: 5 * time.Second, ReadTimeout: 5 * time.Second, WriteTimeout: 5 * time.Second, PoolTimeout: 5 * time.Second,
		TLS: redisconn.TLSOptions{CAFile: filepath.Join(dir, "ca.crt"), CertFile: filepath.Join(dir, "tls.crt"), KeyFile: filepath.Join(dir, "tls.key")},
		TLSFileError: func(err error) {
			mu.Lock()
			defer mu.Unlock()
			reported = append(reported, err)
		},
	})
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { _ = c.Close() })
	// Each call on a connection of its own, never given back: every one is a new dial.
	fresh := func() error {
		conn := c.(*redis.Client).Conn()
		t.Cleanup(func() { _ = conn.Close() })
		return conn.Ping(ctx).Err()
	}
	held := c.(*redis.Client).Conn()
	t.Cleanup(func() { _ = held.Close() })
	g.Expect(held.Ping(ctx).Err()).To(Succeed())

	// A certificate the server does not trust: new connections present it and are refused, the open one goes on.
	untrusted, err := other.ca.Client("pod-0")
	g.Expect(err).NotTo(HaveOccurred())
	mount(s.ca.PEM, untrusted)
	g.Expect(fresh()).To(MatchError(ContainSubstring("tls: unknown certificate authority")))
	g.Expect(held.Ping(ctx).Err()).To(Succeed())

	// A new certificate of the server's CA: new connections are accepted.
	second, err := s.ca.Client("pod-0")
	g.Expect(err).NotTo(HaveOccurred())
	mount(s.ca.PEM, second)
	g.Expect(fresh()).To(Succeed())

	// A certificate that does not parse: reported once, the last good pair stays in use.
	mount(s.ca.PEM, tlstest.Pair{CertPEM: []byte("not a certificate\n"), KeyPEM: second.KeyPEM})
	g.Expect(fresh()).To(Succeed())
	g.Expect(fresh()).To(Succeed())
	mu.Lock()
	g.Expect(reported).To(HaveLen(1))
	g.Expect(reported[0]).To(MatchError(And(ContainSubstring("tls.crt"), ContainSubstring("last good content"))))
	mu.Unlock()

	// Rotations between good pairs while connections are being made: every one is accepted
	// (kubelet swaps the files at once, and a handshake reads a pair as a whole).
	third, err := s.ca.Client("pod-0")
	g.Expect(err).NotTo(HaveOccurred())
	var wg sync.WaitGroup
	failures := make(chan error, 64)
	for range 8 {
		wg.Go(func() {
			for range 4 {
				if err := fresh(); err != nil {
					failures <- err
				}
			}
		})
	}
	for i := range 6 {
		mount(s.ca.PEM, []tlstest.Pair{second, third}[i%2])
	}
	wg.Wait()
	close(failures)
	var failed []error
	for err := range failures {
		failed = append(failed, err)
	}
	g.Expect(failed).To(BeEmpty())
	mu.Lock()
	g.Expect(reported).To(HaveLen(1), "a pair read across a rotation is read again, not reported")
	mu.Unlock()

	// A CA bundle without the server's CA: new connections refuse the server.
	mount(other.ca.PEM, second)
	g.Expect(fresh()).To(MatchError(ContainSubstring("the server's certificate is not signed by a CA in the CA bundle")))
	g.Expect(held.Ping(ctx).Err()).To(Succeed())
}

// A Sentinel group that speaks TLS only (data servers and sentinels, client certificates
// required, replication and the sentinels' own links over TLS): a client finds the master
// through the sentinels over TLS, the manager's client verifies it with a majority of them
// and its node listing reaches the master, the replica and every sentinel; the sidecar's
// sentinel credentials (read at each connection) authenticate over TLS. Without a client
// certificate the sentinels refuse.
func TestTLSSentinel(t *testing.T) {
	g := NewWithT(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s := newTLSSetup(t)
	serverTLS := s.serverTLS(true)
	grp, err := redistest.StartSentinelWith(redistest.SentinelOptions{Password: "sentinel-admin", TLS: &serverTLS})
	g.Expect(err).NotTo(HaveOccurred(), "starting a TLS sentinel group")
	t.Cleanup(func() { _ = grp.Close() })
	g.Expect(grp.URL()).To(HavePrefix("rediss+sentinel://"))

	clientTLS := redisconn.TLSOptions{CAFile: s.client.CA, CertFile: s.client.Cert, KeyFile: s.client.Key}
	base := redisconn.Options{TLS: clientTLS, DialTimeout: 5 * time.Second, ReadTimeout: 5 * time.Second, WriteTimeout: 5 * time.Second, PoolTimeout: 5 * time.Second, PoolSize: 2}

	manager := base
	manager.SentinelPassword, manager.VerifyMaster = "sentinel-admin", true
	mc, err := redisconn.NewClient(grp.URL(), manager)
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { _ = mc.Close() })
	g.Expect(mc.Set(ctx, "tls-k", "v", time.Minute).Err()).To(Succeed())
	g.Expect(grp.Master().Client("").Get(ctx, "tls-k").Val()).To(Equal("v"), "written on the group's master")

	nodes, err := redisconn.NewNodes(grp.URL(), manager, mc)
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { _ = nodes.Close() })
	var seen []string
	g.Expect(nodes.Each(ctx, func(ctx context.Context, n *redis.Client) error {
		seen = append(seen, n.Options().Addr)
		return n.Ping(ctx).Err()
	})).To(Succeed())
	g.Expect(seen).To(ConsistOf(grp.Master().Addr(), grp.Replica().Addr()))
	sentinels := 0
	g.Expect(nodes.EachSentinel(ctx, func(ctx context.Context, sc *redis.Client) error {
		sentinels++
		return sc.Ping(ctx).Err()
	})).To(Succeed())
	g.Expect(sentinels).To(Equal(3))

	sidecar := base
	sidecar.SentinelCredentials = func(context.Context) (string, string, error) { return "", "sentinel-admin", nil }
	sc, err := redisconn.NewClient(grp.URL(), sidecar)
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { _ = sc.Close() })
	g.Expect(sc.Get(ctx, "tls-k").Val()).To(Equal("v"))

	noCert := manager
	noCert.TLS = redisconn.TLSOptions{CAFile: s.client.CA}
	nc, err := redisconn.NewClient(grp.URL(), noCert)
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { _ = nc.Close() })
	g.Expect(nc.Ping(ctx).Err()).To(MatchError(ContainSubstring("certificate required")))
}

// A Redis Cluster that speaks TLS only, to clients and on its bus, requiring client
// certificates: the client reaches every master through the slot map (each node verified
// under the address the map gives), and Nodes lists them all over TLS.
func TestTLSCluster(t *testing.T) {
	g := NewWithT(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s := newTLSSetup(t)
	cl, err := redistest.StartClusterTLS(3, s.serverTLS(true))
	g.Expect(err).NotTo(HaveOccurred(), "starting a TLS cluster")
	t.Cleanup(func() { _ = cl.Close() })
	g.Expect(cl.URL()).To(HavePrefix("rediss://"))

	opts := redisconn.Options{TLS: redisconn.TLSOptions{CAFile: s.client.CA, CertFile: s.client.Cert, KeyFile: s.client.Key},
		DialTimeout: 5 * time.Second, ReadTimeout: 5 * time.Second, WriteTimeout: 5 * time.Second, PoolTimeout: 5 * time.Second, PoolSize: 2}
	c, err := redisconn.NewClient(cl.URL(), opts)
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { _ = c.Close() })
	g.Expect(c).To(BeAssignableToTypeOf(&redis.ClusterClient{}))
	// Keys in every slot range, so that every master is dialed.
	for i := range 30 {
		g.Expect(c.Set(ctx, fmt.Sprint("tls-cluster-", i), i, time.Minute).Err()).To(Succeed())
	}
	nodes, err := redisconn.NewNodes(cl.URL(), opts, c)
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { _ = nodes.Close() })
	var seen []string
	g.Expect(nodes.Each(ctx, func(ctx context.Context, n *redis.Client) error {
		seen = append(seen, n.Options().Addr)
		return n.Ping(ctx).Err()
	})).To(Succeed())
	g.Expect(seen).To(ConsistOf(cl.Addrs()))
}
