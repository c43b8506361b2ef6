package controller_test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/redis/go-redis/v9"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/redline-dev/redline/api/v1alpha1"
	"github.com/redline-dev/redline/internal/backend"
	"github.com/redline-dev/redline/internal/controller"
	"github.com/redline-dev/redline/internal/controller/tenantacl"
	"github.com/redline-dev/redline/internal/keyscheme"
	"github.com/redline-dev/redline/internal/limiter"
	"github.com/redline-dev/redline/internal/redisacl"
	"github.com/redline-dev/redline/internal/redisconn"
	"github.com/redline-dev/redline/internal/sidecar/contract"
	"github.com/redline-dev/redline/internal/testutil/redistest"
)

const sentinelAdminPassword = "sentinel-admin"

// startTenantACLSentinel runs a manager with only the tenant ACL reconciler against a
// Sentinel group, wired as cmd/manager wires it: the nodes and the sentinels from the URL, the
// admin's credentials from options, never from the URL.
func startTenantACLSentinel(grp *redistest.Sentinel, keyNS string) func() {
	opts := redisconn.Options{
		Password: aclAdminPassword, SentinelPassword: grp.Password(), VerifyMaster: true,
		DialTimeout: time.Second, ReadTimeout: time.Second, WriteTimeout: time.Second,
	}
	rdb, err := redisconn.NewClient(grp.URL(), opts)
	Expect(err).NotTo(HaveOccurred())
	nodes, err := redisconn.NewNodes(grp.URL(), opts, rdb)
	Expect(err).NotTo(HaveOccurred())
	// As the manager wires it: the manager's Redis is a backend, the default.
	stop := startTenantACLManager(controller.TenantACLConfig{
		Mode: tenantacl.ModeAuto, SecretName: "redline-redis",
		KeySecret:    types.NamespacedName{Namespace: keyNS, Name: "redline-redis-acl"},
		RedisTimeout: 5 * time.Second, MaxBackoff: time.Second,
	}, backend.New("", grp.URL(), rdb, nodes.Each, nodes.EachSentinel, 0, time.Minute, nil))
	return func() { stop(); _ = nodes.Close(); _ = rdb.Close() }
}

// secretData is the namespace's credentials Secret, as a sidecar mounts it.
func secretData(g Gomega, ns string) map[string][]byte {
	var s corev1.Secret
	g.Expect(k8s.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "redline-redis"}, &s)).To(Succeed())
	return s.Data
}

var _ = Describe("Tenant Redis users with Sentinel", func() {
	It("gives sidecars a sentinel user that can look the master up and follow a failover, and nothing else", func(ctx SpecContext) {
		grp, err := redistest.StartSentinelWith(redistest.SentinelOptions{Password: sentinelAdminPassword, DataPassword: aclAdminPassword})
		Expect(err).NotTo(HaveOccurred(), "starting the sentinel group")
		DeferCleanup(func() { _ = grp.Close() })
		stop := startTenantACLSentinel(grp, tenantNamespace("redline-acl-key"))
		defer stop()
		ns := tenantNamespace("tenant-sentinel")
		tenantPolicy(ns)

		var data map[string][]byte
		Eventually(func(g Gomega) {
			data = secretData(g, ns)
			g.Expect(data).To(HaveKeyWithValue(contract.RedisSentinelUsernameKey, []byte(redisacl.SentinelReaderUser)))
			c := isolation(g, ns)
			g.Expect(c.Status).To(Equal(metav1.ConditionTrue), c.Message)
			g.Expect(c.Message).To(ContainSubstring("reached without TLS"), "what a network attacker can do without TLS")
		}).WithTimeout(30 * time.Second).Should(Succeed())
		sentinelUser, sentinelPW := string(data[contract.RedisSentinelUsernameKey]), string(data[contract.RedisSentinelSecretKey])

		// The takeover that worked with the sentinels' password in the URL: every step is
		// refused to what the namespace holds, on every sentinel, while the lookups work.
		rec, err := redistest.StartRecorder()
		Expect(err).NotTo(HaveOccurred())
		defer func() { _ = rec.Close() }()
		for _, s := range grp.Sentinels {
			reader := &redis.Options{Addr: s.Addr(), Username: sentinelUser, Password: sentinelPW, MaxRetries: -1}
			sc := redis.NewSentinelClient(reader)
			Expect(sc.GetMasterAddrByName(ctx, redistest.SentinelMasterName).Result()).To(Equal([]string{"127.0.0.1", strconv.Itoa(grp.Master().Port)}))
			Expect(sc.Replicas(ctx, redistest.SentinelMasterName).Err()).To(Succeed())
			Expect(sc.Sentinels(ctx, redistest.SentinelMasterName).Err()).To(Succeed())
			_ = sc.Close()
			tc := redis.NewClient(reader)
			for _, cmd := range [][]any{
				{"sentinel", "remove", redistest.SentinelMasterName},
				{"sentinel", "monitor", redistest.SentinelMasterName, rec.Host(), rec.Port(), 1},
				{"sentinel", "monitor", "other", rec.Host(), rec.Port(), 1},
				{"sentinel", "failover", redistest.SentinelMasterName},
				{"sentinel", "set", redistest.SentinelMasterName, "quorum", 1},
				{"sentinel", "set", redistest.SentinelMasterName, "auth-pass", "x"},
				{"sentinel", "reset", "*"},
				{"sentinel", "config", "set", "resolve-hostnames", "yes"},
				{"sentinel", "debug"},
				{"sentinel", "flushconfig"},
				{"sentinel", "simulate-failure", "crash-after-election"},
				{"sentinel", "is-master-down-by-addr", "127.0.0.1", grp.Master().Port, 0, "*"},
				{"sentinel", "slaves", redistest.SentinelMasterName},
				{"sentinel", "master", redistest.SentinelMasterName},
				{"sentinel", "masters"},
				{"acl", "setuser", sentinelUser, "+@all"},
				{"acl", "list"},
				{"acl", "whoami"},
				{"client", "kill", "type", "pubsub"},
				{"client", "list"},
				{"publish", "+switch-master", "mymaster 127.0.0.1 1 " + rec.Host() + " " + rec.Port()},
				{"info"},
				{"shutdown"},
			} {
				Expect(tc.Do(ctx, cmd...).Err()).To(MatchError(HavePrefix("NOPERM")), "%v on %s", cmd, s.Addr())
			}
			// CONFIG and DEBUG do not exist in a sentinel (SENTINEL CONFIG and DEBUG above).
			for _, cmd := range [][]any{{"config", "set", "sentinel-pass", "x"}, {"debug", "sleep", 0}} {
				Expect(tc.Do(ctx, cmd...).Err()).To(MatchError(ContainSubstring("unknown command")), "%v on %s", cmd, s.Addr())
			}
			ps := tc.PSubscribe(ctx, "*")
			_, err := ps.Receive(ctx)
			Expect(err).To(MatchError(HavePrefix("NOPERM")), "PSUBSCRIBE")
			_ = ps.Close()
			ps = tc.Subscribe(ctx, "+sdown")
			_, err = ps.Receive(ctx)
			Expect(err).To(MatchError(HavePrefix("NOPERM")), "a channel go-redis does not follow")
			_ = ps.Close()
			// Neither the namespace's data user nor no credential gets in.
			dataUser := redis.NewClient(&redis.Options{Addr: s.Addr(), Username: string(data[contract.RedisUsernameKey]),
				Password: string(data[contract.RedisSecretKey]), MaxRetries: -1})
			Expect(dataUser.Ping(ctx).Err()).To(MatchError(HavePrefix("WRONGPASS")))
			_ = dataUser.Close()
			anonymous := redis.NewClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1})
			Expect(anonymous.Ping(ctx).Err()).To(MatchError(HavePrefix("NOAUTH")))
			_ = anonymous.Close()
			_ = tc.Close()
		}
		addr, err := grp.MasterAddr(ctx)
		Expect(err).NotTo(HaveOccurred())
		Expect(addr).To(Equal(grp.Master().Addr()), "the group still names its own master")

		// A sidecar: the URL without credentials, the Secret's files mounted, the scripts
		// loaded by the manager (here by the admin, on both data nodes).
		dir := GinkgoT().TempDir()
		for k, v := range data {
			Expect(os.WriteFile(filepath.Join(dir, k), v, 0o600)).To(Succeed())
		}
		for _, srv := range []*redistest.Server{grp.Master(), grp.Replica()} {
			admin := redis.NewClient(&redis.Options{Addr: srv.Addr(), Password: aclAdminPassword, MaxRetries: -1})
			for _, sc := range redisacl.SidecarScripts() {
				Expect(admin.ScriptLoad(ctx, sc.Source).Err()).To(Succeed())
			}
			_ = admin.Close()
		}
		sidecar, err := redisconn.NewClient(grp.URL(), redisconn.Options{
			Credentials:         redisconn.FileCredentials(dir, contract.RedisUsernameKey, contract.RedisSecretKey, ""),
			SentinelCredentials: redisconn.FileCredentials(dir, contract.RedisSentinelUsernameKey, contract.RedisSentinelSecretKey, ""),
			DialTimeout:         time.Second, ReadTimeout: time.Second, WriteTimeout: time.Second,
		})
		Expect(err).NotTo(HaveOccurred())
		defer sidecar.Close()
		lim, err := limiter.New(sidecar, limiter.Options{LeaseHorizon: -1})
		Expect(err).NotTo(HaveOccurred())
		defer lim.Close()
		limit := limiter.Limit{Algorithm: limiter.FixedWindow, Requests: 1000, Window: time.Minute, FailureMode: limiter.FailureModeClosed}
		decide := func() limiter.Source {
			r, err := lim.Allow(ctx, keyscheme.Key(ns, "p", "r", "k"), limit, 1)
			Expect(err).NotTo(HaveOccurred())
			return r.Source
		}
		Expect(decide()).To(Equal(limiter.SourceRedis))

		Expect(grp.Master().Stop()).To(Succeed())
		Expect(grp.WaitMaster(ctx, grp.Replica())).To(Succeed())
		Eventually(decide).WithTimeout(30*time.Second).WithPolling(100*time.Millisecond).
			Should(Equal(limiter.SourceRedis), "the promoted replica decides, found through +switch-master with the sentinel reader")

		data2, conns := rec.Received()
		Expect(conns).To(BeZero(), "nothing connected to the would-be master (%q)", data2)
	})

	It("says tenants are not isolated where the sentinels have no password", func(ctx SpecContext) {
		grp, err := redistest.StartSentinelWith(redistest.SentinelOptions{DataPassword: aclAdminPassword})
		Expect(err).NotTo(HaveOccurred(), "starting the sentinel group")
		DeferCleanup(func() { _ = grp.Close() })
		stop := startTenantACLSentinel(grp, tenantNamespace("redline-acl-key"))
		defer stop()
		ns := tenantNamespace("tenant-open-sentinel")
		tenantPolicy(ns)
		Eventually(func(g Gomega) {
			c := isolation(g, ns)
			g.Expect(c.Status).To(Equal(metav1.ConditionFalse))
			g.Expect(c.Reason).To(Equal(v1alpha1.ReasonSentinelUnprotected))
			g.Expect(c.Message).To(ContainSubstring("SENTINEL REMOVE and MONITOR"))
		}).WithTimeout(30 * time.Second).Should(Succeed())
		Expect(secretData(Default, ns)).NotTo(HaveKey(contract.RedisSentinelSecretKey), "no sentinel user to hand out")
	})
})
