package controller_test

import (
	"context"
	"fmt"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/redis/go-redis/v9"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	crcontroller "sigs.k8s.io/controller-runtime/pkg/controller"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	v1alpha1 "github.com/redline-dev/redline/api/v1alpha1"
	"github.com/redline-dev/redline/internal/backend"
	"github.com/redline-dev/redline/internal/controller"
	"github.com/redline-dev/redline/internal/controller/loop"
	"github.com/redline-dev/redline/internal/controller/tenantacl"
	"github.com/redline-dev/redline/internal/keyscheme"
	"github.com/redline-dev/redline/internal/redisacl"
	"github.com/redline-dev/redline/internal/sidecar/contract"
	"github.com/redline-dev/redline/internal/testutil/redistest"
)

const aclAdminPassword = "acl-admin"

// startTenantACL runs a manager with only the tenant ACL reconciler, against srv (whose default
// user needs aclAdminPassword), until the returned function is called.
func startTenantACL(srv *redistest.Server, mode string, rotation time.Duration, keyNS string, hooks ...redis.Hook) func() {
	admin := redis.NewClient(&redis.Options{Addr: srv.Addr(), Password: aclAdminPassword, MaxRetries: -1})
	for _, h := range hooks {
		admin.AddHook(h)
	}
	stop := startTenantACLManager(controller.TenantACLConfig{
		Mode: mode, SecretName: "redline-redis",
		KeySecret: types.NamespacedName{Namespace: keyNS, Name: "redline-redis-acl"},
		Rotation:  rotation, RedisTimeout: 2 * time.Second, MaxBackoff: time.Second,
	}, backend.New("", "", admin, nil, nil, 0, time.Minute, nil))
	return func() { stop(); _ = admin.Close() }
}

// startTenantACLManager runs a manager of its own with only the tenant ACL reconciler of c
// until the returned function is called. With def, c's backends are built as cmd/manager
// builds them: def, the manager's Redis, serves every namespace no RedisBackend (read through
// the manager's cache) selects.
func startTenantACLManager(c controller.TenantACLConfig, def *backend.Backend) func() {
	GinkgoHelper()
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme: k8s.Scheme(), Metrics: metricsserver.Options{BindAddress: "0"},
		// Each spec starts its own manager in this process: the controller's name repeats.
		Controller: config.Controller{SkipNameValidation: new(true)},
	})
	Expect(err).NotTo(HaveOccurred())
	if def != nil {
		c.Backends = backend.NewRegistry(def, mgr.GetCache())
	}
	Expect(controller.SetupTenantACL(mgr, c)).To(Succeed())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer GinkgoRecover()
		defer close(done)
		Expect(mgr.Start(ctx)).To(Succeed())
	}()
	return func() { cancel(); <-done }
}

func tenantNamespace(prefix string) string {
	ns := fmt.Sprintf("%s-%d", prefix, time.Now().UnixNano()%1_000_000_000)
	Expect(k8s.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})).To(Succeed())
	return ns
}

func tenantPolicy(ns string) {
	p := &v1alpha1.RateLimitPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: ns},
		Spec: v1alpha1.RateLimitPolicySpec{
			TargetSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
			Rules: []v1alpha1.Rule{{
				Name: "r", Key: []v1alpha1.KeyPart{{Header: "X-Key"}},
				Limit: v1alpha1.Limit{Requests: 10, Window: metav1.Duration{Duration: time.Minute}},
			}},
		},
	}
	Expect(k8s.Create(context.Background(), p)).To(Succeed())
}

func tenantSecret(g Gomega, ns string) (user, password string) {
	var s corev1.Secret
	g.Expect(k8s.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "redline-redis"}, &s)).To(Succeed())
	g.Expect(s.Labels).To(HaveKeyWithValue(loop.ManagedByLabel, loop.ManagedByValue))
	return string(s.Data[contract.RedisUsernameKey]), string(s.Data[contract.RedisSecretKey])
}

func isolation(g Gomega, ns string) *metav1.Condition {
	var p v1alpha1.RateLimitPolicy
	g.Expect(k8s.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "p"}, &p)).To(Succeed())
	c := meta.FindStatusCondition(p.Status.Conditions, v1alpha1.ConditionTenantIsolation)
	g.Expect(c).NotTo(BeNil(), "no TenantIsolation condition yet")
	return c
}

func pingAs(srv *redistest.Server, user, password string) error {
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), Username: user, Password: password, MaxRetries: -1})
	defer c.Close()
	return c.Ping(context.Background()).Err()
}

var _ = Describe("Tenant Redis users", Ordered, func() {
	var srv *redistest.Server
	BeforeAll(func() {
		var err error
		srv, err = redistest.Start("--requirepass", aclAdminPassword)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { _ = srv.Close() })
	})

	It("gives each namespace a user limited to its keys, keeps its Secret, rotates and removes it", func(ctx SpecContext) {
		keyNS := tenantNamespace("redline-acl-key")
		stop := startTenantACL(srv, tenantacl.ModeAuto, 6*time.Second, keyNS)
		defer stop()
		a, b := tenantNamespace("tenant-a"), tenantNamespace("tenant-b")
		tenantPolicy(a)
		tenantPolicy(b)

		var userA, pwA, userB, pwB string
		Eventually(func(g Gomega) {
			userA, pwA = tenantSecret(g, a)
			userB, pwB = tenantSecret(g, b)
		}).WithTimeout(20 * time.Second).Should(Succeed())
		Expect(userA).To(Equal(redisacl.Username(a)))
		Expect(pwA).NotTo(Equal(pwB))
		Eventually(func(g Gomega) {
			c := isolation(g, a)
			g.Expect(c.Status).To(Equal(metav1.ConditionTrue))
			g.Expect(c.Reason).To(Equal(v1alpha1.ReasonTenantIsolated))
		}).WithTimeout(20 * time.Second).Should(Succeed())
		// The key the passwords come from is in the manager's namespace, not the tenants'.
		var key corev1.Secret
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: keyNS, Name: "redline-redis-acl"}, &key)).To(Succeed())
		Expect(key.Data["key"]).To(HaveLen(32))

		// A's credentials reach A's keys only.
		ca := redis.NewClient(&redis.Options{Addr: srv.Addr(), Username: userA, Password: pwA, MaxRetries: -1})
		defer ca.Close()
		Expect(ca.Do(ctx, "evalsha", "0000000000000000000000000000000000000000", 1, keyscheme.Key(a, "p", "r", "k")+":swc").Err()).
			To(MatchError(HavePrefix("NOSCRIPT")), "its own key: allowed, the script is simply unknown")
		Expect(ca.Do(ctx, "del", keyscheme.Key(b, "p", "r", "k")+":swc").Err()).To(MatchError(HavePrefix("NOPERM")))
		Expect(ca.Do(ctx, "script", "flush").Err()).To(MatchError(HavePrefix("NOPERM")))
		Expect(pingAs(srv, userB, pwB)).To(Succeed())

		// A tenant editing, deleting or freezing its Secret gets it written back.
		edit(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: a, Name: "redline-redis"}}, func(s *corev1.Secret) {
			s.Data[contract.RedisSecretKey] = []byte("tenant-was-here")
			s.Immutable = new(true)
		})
		Eventually(func(g Gomega) {
			_, pw := tenantSecret(g, a)
			g.Expect(pw).NotTo(Equal("tenant-was-here"))
			g.Expect(pingAs(srv, userA, pw)).To(Succeed())
		}).WithTimeout(20 * time.Second).Should(Succeed())
		Expect(k8s.Delete(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: b, Name: "redline-redis"}})).To(Succeed())
		Eventually(func(g Gomega) {
			_, pw := tenantSecret(g, b)
			g.Expect(pingAs(srv, userB, pw)).To(Succeed())
		}).WithTimeout(20 * time.Second).Should(Succeed())

		// Rotation: a new password in the Secret; the previous one still authenticates for a
		// period, then no longer.
		_, before := tenantSecret(Default, a)
		var after string
		Eventually(func(g Gomega) {
			_, after = tenantSecret(g, a)
			g.Expect(after).NotTo(Equal(before))
		}).WithTimeout(20 * time.Second).Should(Succeed())
		Expect(pingAs(srv, userA, after)).To(Succeed())
		Expect(pingAs(srv, userA, before)).To(Succeed(), "the previous password stays valid one period")
		Eventually(func() error { return pingAs(srv, userA, before) }).WithTimeout(20 * time.Second).
			Should(MatchError(ContainSubstring("WRONGPASS")))
		Expect(ca.Ping(ctx).Err()).To(Succeed(), "a connection opened before the rotations stays authenticated")

		// The namespace's last policy goes: so do its user and its Secret.
		Expect(k8s.Delete(ctx, &v1alpha1.RateLimitPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: b, Name: "p"}})).To(Succeed())
		Eventually(func() bool {
			err := k8s.Get(ctx, client.ObjectKey{Namespace: b, Name: "redline-redis"}, &corev1.Secret{})
			return apierrors.IsNotFound(err)
		}).WithTimeout(20 * time.Second).Should(BeTrue())
		admin := redis.NewClient(&redis.Options{Addr: srv.Addr(), Password: aclAdminPassword})
		defer admin.Close()
		Expect(admin.Do(ctx, "acl", "getuser", userB).Val()).To(BeNil())
	})

	It("sets a namespace's user at most once in 10 seconds, however often its tenant edits the Secret", func(ctx SpecContext) {
		setusers := &setuserCounter{}
		start := time.Now()
		stop := startTenantACL(srv, tenantacl.ModeAuto, time.Hour, tenantNamespace("redline-acl-key"), setusers)
		defer stop()
		ns := tenantNamespace("tenant-churn")
		tenantPolicy(ns)
		user := redisacl.Username(ns)
		Eventually(func(g Gomega) { tenantSecret(g, ns) }).WithTimeout(20 * time.Second).Should(Succeed())
		for i := range 30 {
			edit(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "redline-redis"}}, func(s *corev1.Secret) {
				s.Data[contract.RedisSecretKey] = fmt.Appendf(nil, "tenant-edit-%d", i)
			})
			Eventually(func(g Gomega) {
				_, pw := tenantSecret(g, ns)
				g.Expect(pw).NotTo(HavePrefix("tenant-edit-"))
			}).WithTimeout(20*time.Second).Should(Succeed(), "edit %d written back", i)
		}
		// One at the start, then at most one per 10 s of the run.
		most := 1 + int(time.Since(start)/(10*time.Second)) + 1
		GinkgoWriter.Printf("ACL SETUSER %s: %d for 30 Secret edits in %s (bound %d)\n", user, setusers.count(user), time.Since(start).Round(time.Millisecond), most)
		Expect(setusers.count(user)).To(And(BeNumerically(">=", 1), BeNumerically("<=", most)))
	})

	// A Redis Cluster's nodes learn of a new replica one after the other: CLUSTER SLOTS leaves
	// a replica out until its replication offset is not 0 (a new cluster's for up to 10 s),
	// and each node learns that offset by gossip at its own time, so listings taken from
	// different nodes differ for a while. The restart watcher reports a node the first time
	// it lists it; the namespace's user must reach the replica however the listings that
	// follow (the reconcile's, the watcher's) leave it out.
	It("gives a replica the namespace's user though the listings after the one that first showed it leave it out", func(ctx SpecContext) {
		replicaGetsTheUser(&laggingView{lag: 2 * time.Second})
	})

	It("gives a replica the namespace's user though the reconcile's listing leaves out one the watcher's shows", func(ctx SpecContext) {
		replicaGetsTheUser(&laggingView{lag: 2 * time.Second, reconcilesOnly: true})
	})

	It("falls back to the admin's shared credential, and says so, where Redis refuses ACL commands", func(ctx SpecContext) {
		refusing, err := redistest.Start("--requirepass", aclAdminPassword, "--rename-command", "ACL", "")
		Expect(err).NotTo(HaveOccurred())
		defer refusing.Close()
		keyNS := tenantNamespace("redline-acl-key")
		stop := startTenantACL(refusing, tenantacl.ModeAuto, time.Hour, keyNS)
		defer stop()
		ns := tenantNamespace("tenant-shared")
		// The admin's shared Secret, as before per-namespace users: left as it is.
		shared := &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "redline-redis"},
			Data:       map[string][]byte{contract.RedisSecretKey: []byte(aclAdminPassword)},
		}
		Expect(k8s.Create(ctx, shared)).To(Succeed())
		tenantPolicy(ns)
		Eventually(func(g Gomega) {
			c := isolation(g, ns)
			g.Expect(c.Status).To(Equal(metav1.ConditionFalse))
			g.Expect(c.Reason).To(Equal(v1alpha1.ReasonRedisACLUnavailable))
			g.Expect(c.Message).To(ContainSubstring("any tenant holding it can read, change or delete every namespace's Redis keys"))
		}).WithTimeout(20 * time.Second).Should(Succeed())
		var s corev1.Secret
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "redline-redis"}, &s)).To(Succeed())
		Expect(s.Data).To(Equal(shared.Data), "the admin's Secret is not touched")
		Expect(s.Labels).NotTo(HaveKey(loop.ManagedByLabel))
	})

	It("says tenants are not isolated when Redis's default user needs no password", func(ctx SpecContext) {
		open, err := redistest.Start()
		Expect(err).NotTo(HaveOccurred())
		defer open.Close()
		stop := startTenantACL(open, tenantacl.ModeAuto, time.Hour, tenantNamespace("redline-acl-key"))
		defer stop()
		ns := tenantNamespace("tenant-open")
		tenantPolicy(ns)
		Eventually(func(g Gomega) {
			c := isolation(g, ns)
			g.Expect(c.Status).To(Equal(metav1.ConditionFalse))
			g.Expect(c.Reason).To(Equal(v1alpha1.ReasonRedisDefaultUserOpen))
		}).WithTimeout(20 * time.Second).Should(Succeed())
	})

	It("says tenants are not isolated when told not to set users", func(ctx SpecContext) {
		stop := startTenantACL(srv, tenantacl.ModeOff, time.Hour, tenantNamespace("redline-acl-key"))
		defer stop()
		ns := tenantNamespace("tenant-off")
		tenantPolicy(ns)
		Eventually(func(g Gomega) {
			c := isolation(g, ns)
			g.Expect(c.Status).To(Equal(metav1.ConditionFalse))
			g.Expect(c.Reason).To(Equal(v1alpha1.ReasonTenantACLDisabled))
		}).WithTimeout(20 * time.Second).Should(Succeed())
		Expect(apierrors.IsNotFound(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "redline-redis"}, &corev1.Secret{}))).To(BeTrue())
	})
})

// setuserCounter counts the ACL SETUSER commands the manager sends, per user.
type setuserCounter struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *setuserCounter) count(user string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[user]
}

func (c *setuserCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (c *setuserCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if a := cmd.Args(); len(a) >= 3 && fmt.Sprint(a[0]) == "acl" && fmt.Sprint(a[1]) == "setuser" {
			c.mu.Lock()
			if c.n == nil {
				c.n = map[string]int{}
			}
			c.n[fmt.Sprint(a[2])]++
			c.mu.Unlock()
		}
		return next(ctx, cmd)
	}
}

func (c *setuserCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// replicaGetsTheUser runs the tenant ACL reconciler on two nodes, a master and a replica the
// listings show as view says (none before view.join), and expects the namespace's user on the
// replica after it joined.
func replicaGetsTheUser(view *laggingView) {
	GinkgoHelper()
	master, err := redistest.Start("--requirepass", aclAdminPassword)
	Expect(err).NotTo(HaveOccurred())
	defer master.Close()
	replica, err := redistest.Start("--requirepass", aclAdminPassword)
	Expect(err).NotTo(HaveOccurred())
	defer replica.Close()
	admin := func(s *redistest.Server) *redis.Client {
		c := redis.NewClient(&redis.Options{Addr: s.Addr(), Password: aclAdminPassword, MaxRetries: -1})
		DeferCleanup(func() { _ = c.Close() })
		return c
	}
	ma, ra := admin(master), admin(replica)
	nodes := func(ctx context.Context, fn func(context.Context, *redis.Client) error) error {
		if err := fn(ctx, ma); err != nil {
			return err
		}
		if view.lists(ctx) {
			return fn(ctx, ra)
		}
		return nil
	}
	stop := startTenantACLManager(controller.TenantACLConfig{
		Mode: tenantacl.ModeAuto, SecretName: "redline-redis",
		KeySecret: types.NamespacedName{Namespace: tenantNamespace("redline-acl-key"), Name: "redline-redis-acl"},
		Rotation:  time.Hour, RedisTimeout: 2 * time.Second, MaxBackoff: 5 * time.Second,
		CheckInterval: 100 * time.Millisecond,
	}, backend.New("", "", ma, nodes, nil, 0, time.Minute, nil))
	defer stop()
	ns := tenantNamespace("tenant-replica")
	tenantPolicy(ns)
	var user, pw string
	Eventually(func(g Gomega) {
		user, pw = tenantSecret(g, ns)
		g.Expect(pingAs(master, user, pw)).To(Succeed())
	}).WithTimeout(20 * time.Second).Should(Succeed())
	Expect(pingAs(replica, user, pw)).To(MatchError(ContainSubstring("WRONGPASS")), "the replica is not listed yet")

	view.join()
	Eventually(view.hidden).WithTimeout(20*time.Second).Should(BeTrue(), "no listing left the replica out")
	Eventually(func() error { return pingAs(replica, user, pw) }).WithTimeout(20*time.Second).
		Should(Succeed(), "the replica never got the namespace's user")
}

// laggingView is a node listing as a Redis Cluster's nodes give it while they learn of a new
// replica. After join, the first listing that shows the replica is the watcher's read from a
// node that knows of it; for lag after that, the listings come from nodes that do not: every
// listing, or with reconcilesOnly the reconciles' only (the watcher's reads keep showing it).
// After lag, every listing shows it.
type laggingView struct {
	lag            time.Duration
	reconcilesOnly bool

	mu     sync.Mutex
	joined bool
	first  time.Time // when a listing first showed the replica
	hid    bool      // a listing left it out after join
}

func (v *laggingView) join() {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.joined = true
}

// lists says whether the listing of ctx (a reconcile's, or the watcher's) shows the replica.
func (v *laggingView) lists(ctx context.Context) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	if !v.joined {
		return false
	}
	reconcile := crcontroller.ReconcileIDFromContext(ctx) != ""
	hide := false
	switch {
	case v.first.IsZero():
		hide = reconcile
		if !hide {
			v.first = time.Now()
		}
	case time.Since(v.first) < v.lag:
		hide = reconcile || !v.reconcilesOnly
	}
	v.hid = v.hid || hide
	return !hide
}

// hidden says whether a listing left the replica out after it joined.
func (v *laggingView) hidden() bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.hid
}
