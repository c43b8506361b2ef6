package redisconn_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"github.com/redis/go-redis/v9"

	"github.com/redline-dev/redline/internal/redisacl"
	"github.com/redline-dev/redline/internal/redisconn"
	"github.com/redline-dev/redline/internal/testutil/redistest"
)

// One sentinel of three, pointed at a server an attacker runs (SENTINEL REMOVE and MONITOR,
// as anyone reaching an unprotected sentinel can), names that server as the master. The
// manager's client (VerifyMaster) and its node listing go only where a majority of the
// sentinels point: the attacker's server never receives the manager's password nor its
// client name, while the real master keeps answering. What the recorder does receive is the
// reconfigured sentinel's own probes.
func TestManagerAuthenticatesOnlyToTheMasterAMajorityOfSentinelsNames(t *testing.T) {
	g := NewWithT(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	grp, err := redistest.StartSentinel()
	g.Expect(err).NotTo(HaveOccurred(), "starting the sentinel group")
	t.Cleanup(func() { _ = grp.Close() })
	rec, err := redistest.StartRecorder()
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { _ = rec.Close() })

	// The data nodes' default user has no password, so they take any: the password is only
	// what would leak.
	const adminPassword = "manager-admin-secret"
	const clientName = "redline-manager"
	bad := grp.SentinelClient(grp.Sentinels[0])
	defer func() { _ = bad.Close() }()
	g.Expect(bad.Remove(ctx, redistest.SentinelMasterName).Err()).To(Succeed())
	g.Expect(bad.Monitor(ctx, redistest.SentinelMasterName, rec.Host(), rec.Port(), "1").Err()).To(Succeed())
	g.Expect(bad.GetMasterAddrByName(ctx, redistest.SentinelMasterName).Val()).To(Equal([]string{rec.Host(), rec.Port()}))

	opts := redisconn.Options{
		Password: adminPassword, ClientName: clientName, VerifyMaster: true,
		DialTimeout: time.Second, ReadTimeout: time.Second, WriteTimeout: time.Second, PoolSize: 2,
	}
	// A client per round: go-redis keeps the sentinel it first heard from, and each new one
	// asks them all again, so the reconfigured sentinel gets its chances to answer first.
	answered := 0
	for range 10 {
		c, err := redisconn.NewClient(grp.URL(), opts)
		g.Expect(err).NotTo(HaveOccurred())
		if err := c.Ping(ctx).Err(); err == nil {
			answered++
		} else {
			g.Expect(errors.Is(err, redisconn.ErrMasterUnverified) || bytes.Contains([]byte(err.Error()), []byte("majority"))).
				To(BeTrue(), "a refused ping is refused for the master being unverified, got %v", err)
		}
		_ = c.Close()
	}
	g.Expect(answered).To(BeNumerically(">", 0), "the real master answers the clients that heard from a good sentinel first")

	nodes, err := redisconn.NewNodes(grp.URL(), opts, nil)
	g.Expect(err).NotTo(HaveOccurred())
	defer func() { _ = nodes.Close() }()
	var listed []string
	g.Expect(nodes.Each(ctx, func(ctx context.Context, c *redis.Client) error {
		listed = append(listed, c.Options().Addr)
		return c.Ping(ctx).Err()
	})).To(Succeed())
	g.Expect(listed).To(ConsistOf(grp.Master().Addr(), grp.Replica().Addr()))

	data, _ := rec.Received()
	g.Expect(string(data)).NotTo(ContainSubstring(adminPassword), "the manager's password reached the attacker's server")
	g.Expect(string(data)).NotTo(ContainSubstring(clientName), "the manager connected to the attacker's server")
}

// A sidecar starts before its namespace's Secret exists (the volume is optional), and go-redis
// takes only static sentinel credentials. SentinelCredentials reads the files at every new
// sentinel connection: refused while they are missing, the same client reaches the master
// once they appear, without a restart. The reader set by the manager survives a sentinel's
// restart (it is in the sentinel's config).
func TestSentinelCredentialsAreReadAtEveryNewSentinelConnection(t *testing.T) {
	g := NewWithT(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	grp, err := redistest.StartSentinelWith(redistest.SentinelOptions{Password: "sentinel-admin"})
	g.Expect(err).NotTo(HaveOccurred(), "starting the sentinel group")
	t.Cleanup(func() { _ = grp.Close() })
	var sentinels []redisacl.Node
	for _, s := range grp.Sentinels {
		c := redis.NewClient(&redis.Options{Addr: s.Addr(), Password: grp.Password(), MaxRetries: -1})
		defer c.Close()
		sentinels = append(sentinels, c)
	}
	g.Expect(redisacl.EnsureSentinelReader(ctx, sentinels, "reader-pw")).To(Succeed())
	// Restarted, a sentinel still knows the reader.
	g.Expect(grp.Sentinels[0].Stop()).To(Succeed())
	g.Expect(grp.Sentinels[0].Start()).To(Succeed())

	dir := t.TempDir()
	c, err := redisconn.NewClient(grp.URL(), redisconn.Options{
		SentinelCredentials: redisconn.FileCredentials(dir, "sentinel-username", "sentinel-password", ""),
		DialTimeout:         time.Second, ReadTimeout: time.Second, WriteTimeout: time.Second,
	})
	g.Expect(err).NotTo(HaveOccurred())
	defer c.Close()
	g.Expect(c.Ping(ctx).Err()).To(MatchError(ContainSubstring("NOAUTH")), "no Secret yet: the sentinels refuse")

	g.Expect(os.WriteFile(filepath.Join(dir, "sentinel-username"), []byte(redisacl.SentinelReaderUser), 0o600)).To(Succeed())
	g.Expect(os.WriteFile(filepath.Join(dir, "sentinel-password"), []byte("reader-pw"), 0o600)).To(Succeed())
	g.Expect(c.Ping(ctx).Err()).To(Succeed(), "the same client, once the Secret is there")

	// Each sentinel, the restarted one included, lets the reader look the master up.
	for _, s := range grp.Sentinels {
		sc := redis.NewSentinelClient(&redis.Options{Addr: s.Addr(), Username: redisacl.SentinelReaderUser, Password: "reader-pw", MaxRetries: -1})
		g.Expect(sc.GetMasterAddrByName(ctx, redistest.SentinelMasterName).Err()).To(Succeed(), "on %s", s.Addr())
		_ = sc.Close()
	}
}
