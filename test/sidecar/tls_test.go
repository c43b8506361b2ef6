package sidecar_test

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/redline-dev/redline/internal/fleet"
	"github.com/redline-dev/redline/internal/sidecar/contract"
	"github.com/redline-dev/redline/internal/testutil/kubeletdir"
	"github.com/redline-dev/redline/internal/testutil/redistest"
	"github.com/redline-dev/redline/internal/testutil/sidecartest"
	"github.com/redline-dev/redline/internal/testutil/tlstest"
)

// The sidecar binary against a Redis that speaks TLS only and requires client certificates,
// with the CA, certificate and key mounted as the injector mounts the namespace's TLS Secret:
// it decides on Redis's counts and heartbeats there. When the Secret rotates to a certificate
// Redis does not trust, its new connections are refused (the failure mode decides); when it
// rotates again to one Redis trusts, new connections are accepted, with no restart.
func TestSidecarOverTLSWithARotatingClientCertificate(t *testing.T) {
	// What redis-server (OpenSSL) logs for a client certificate its CA did not sign.
	const refusedCert = "certificate verify failed"
	g := NewWithT(t)
	ctx := context.Background()
	ca, err := tlstest.NewCA("redis-ca")
	g.Expect(err).NotTo(HaveOccurred())
	node, err := ca.Node("127.0.0.1")
	g.Expect(err).NotTo(HaveOccurred())
	files, err := tlstest.Write(filepath.Join(t.TempDir(), "server"), ca, node)
	g.Expect(err).NotTo(HaveOccurred())
	srv, err := redistest.StartTLS(redistest.TLSServer{CertFile: files.Cert, KeyFile: files.Key, CAFile: files.CA, AuthClients: true})
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { _ = srv.Close() })
	admin := srv.Client("")
	t.Cleanup(func() { _ = admin.Close() })

	mount := filepath.Join(t.TempDir(), "redis-tls")
	secret := func(p tlstest.Pair) {
		t.Helper()
		g.Expect(kubeletdir.Write(mount, map[string][]byte{
			contract.RedisTLSCAKey: ca.PEM, contract.RedisTLSCertKey: p.CertPEM, contract.RedisTLSKeyKey: p.KeyPEM,
		})).To(Succeed())
	}
	first, err := ca.Client("shop-pod")
	g.Expect(err).NotTo(HaveOccurred())
	secret(first)

	e := newEnv(t, "web")
	e.write(t, sidecartest.Document(e.namespace, "p", "r", "web", 3, time.Hour, "x-key", "Closed"))
	up := newUpstream(t)
	s := start(t, "pod-0", e, srv.URL(), up.addr(), true,
		"--"+contract.FlagRedisTLSCAFile+"="+filepath.Join(mount, contract.RedisTLSCAKey),
		"--"+contract.FlagRedisTLSCertFile+"="+filepath.Join(mount, contract.RedisTLSCertKey),
		"--"+contract.FlagRedisTLSKeyFile+"="+filepath.Join(mount, contract.RedisTLSKeyKey))

	decide := func(key string) string {
		d, err := check(httpClient, s, `{"policy":"p","rule":"r","key":["`+key+`"]}`)
		if err != nil {
			return err.Error()
		}
		return outcome(d)
	}
	key := fmt.Sprint("tls-", time.Now().UnixNano())
	var got []string
	for range 4 {
		got = append(got, decide(key))
	}
	g.Expect(got).To(Equal([]string{"allowed/redis", "allowed/redis", "allowed/redis", "refused/redis"}), "the limit of 3, counted in the TLS Redis")
	g.Eventually(func() int64 { return admin.Exists(ctx, fleet.GroupKey(e.namespace, "p")).Val() }).
		WithTimeout(10*time.Second).Should(BeEquivalentTo(1), "the sidecar heartbeats over TLS")

	// The Secret rotates to a certificate of a CA Redis does not trust; the connections open
	// are closed, and the new ones are refused: the failure mode (Closed) decides.
	otherCA, err := tlstest.NewCA("not-redis-ca")
	g.Expect(err).NotTo(HaveOccurred())
	untrusted, err := otherCA.Client("shop-pod")
	g.Expect(err).NotTo(HaveOccurred())
	secret(untrusted)
	g.Expect(srv.Log()).NotTo(ContainSubstring(refusedCert), "no connection refused before")
	g.Expect(admin.ClientKillByFilter(ctx, "TYPE", "normal").Err()).To(Succeed())
	g.Eventually(func() string { return decide(fmt.Sprint("tls-untrusted-", time.Now().UnixNano())) }).
		WithTimeout(30 * time.Second).Should(Equal("refused/failclosed"))
	g.Eventually(srv.Log).WithTimeout(30*time.Second).Should(ContainSubstring(refusedCert),
		"Redis refused the new certificate in the handshake")

	// Rotated again, to a certificate Redis trusts: decided by Redis again, no restart.
	second, err := ca.Client("shop-pod")
	g.Expect(err).NotTo(HaveOccurred())
	secret(second)
	g.Eventually(func() string { return decide(fmt.Sprint("tls-again-", time.Now().UnixNano())) }).
		WithTimeout(30 * time.Second).Should(Equal("allowed/redis"))
}
