package controller_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/redis/go-redis/v9"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/redline-dev/redline/api/v1alpha1"
	"github.com/redline-dev/redline/internal/controller"
	"github.com/redline-dev/redline/internal/controller/redisbackend"
	"github.com/redline-dev/redline/internal/controller/tenantacl"
	"github.com/redline-dev/redline/internal/fleet"
	"github.com/redline-dev/redline/internal/limiter/scripts"
	"github.com/redline-dev/redline/internal/redisacl"
	"github.com/redline-dev/redline/internal/sidecar/contract"
	"github.com/redline-dev/redline/internal/testutil/redistest"
)

// backendSecretsNamespace is the suite manager's namespace for RedisBackends' Secrets.
const backendSecretsNamespace = "redline-backends"

// redisBackend is a RedisBackend for url selecting namespaces by selector.
func redisBackend(name, url, secret string, selector map[string]string) *v1alpha1.RedisBackend {
	return &v1alpha1.RedisBackend{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1alpha1.RedisBackendSpec{
			URL: url, CredentialsSecret: secret,
			NamespaceSelector: metav1.LabelSelector{MatchLabels: selector},
		},
	}
}

func backendSecret(name, password string) *corev1.Secret {
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: backendSecretsNamespace, Name: name},
		Data:       map[string][]byte{redisbackend.PasswordKey: []byte(password)},
	}
}

func backendCondition(g Gomega, ctx context.Context, name string) (*metav1.Condition, *v1alpha1.RedisBackend) {
	var rb v1alpha1.RedisBackend
	g.Expect(k8s.Get(ctx, client.ObjectKey{Name: name}, &rb)).To(Succeed())
	c := meta.FindStatusCondition(rb.Status.Conditions, v1alpha1.ConditionReady)
	g.Expect(c).NotTo(BeNil(), "RedisBackend %s has no Ready condition yet", name)
	return c, &rb
}

// hasUser says whether c's server has the namespace's ACL user.
func hasUser(ctx context.Context, c *redis.Client, ns string) (bool, error) {
	err := c.Do(ctx, "ACL", "GETUSER", redisacl.Username(ns)).Err()
	switch {
	case errors.Is(err, redis.Nil):
		return false, nil
	case err != nil:
		return false, err
	}
	return true, nil
}

// envOf is the value a container's environment variable resolves to, as kubelet resolves it:
// literal, or from a key of a ConfigMap in ns (the injector names the sidecars' Redis settings
// of a namespace on a backend that way, so that its patch reveals none of them).
func envOf(g Gomega, ctx context.Context, ns string, c *corev1.Container, name string) string {
	for _, e := range c.Env {
		if e.Name != name {
			continue
		}
		if e.ValueFrom == nil || e.ValueFrom.ConfigMapKeyRef == nil {
			return e.Value
		}
		ref := e.ValueFrom.ConfigMapKeyRef
		var cm corev1.ConfigMap
		err := k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: ref.Name}, &cm)
		if apierrors.IsNotFound(err) && ref.Optional != nil && *ref.Optional {
			return "" // as the kubelet starts the container: without the variable
		}
		g.Expect(err).NotTo(HaveOccurred())
		return cm.Data[ref.Key]
	}
	return ""
}

// redisURLOf is the Redis URL the sidecar c starts on, as it reads its environment: its
// namespace's Redis from the ConfigMap when that names one, else the cluster's default.
func redisURLOf(g Gomega, ctx context.Context, ns string, c *corev1.Container) string {
	if url := envOf(g, ctx, ns, c, contract.EnvNamespaceRedisURL); url != "" {
		return url
	}
	return envOf(g, ctx, ns, c, contract.EnvRedisURL)
}

// startBackendTenantACL runs the tenant ACL reconciler over the suite's backends (the suite's
// manager runs everything else) until the returned function is called.
func startBackendTenantACL(keyNS string) func() {
	return startTenantACLManager(controller.TenantACLConfig{
		Mode: tenantacl.ModeAuto, SecretName: "redline-redis", Backends: suiteBackends,
		KeySecret:    types.NamespacedName{Namespace: keyNS, Name: "redline-redis-acl"},
		RedisTimeout: 2 * time.Second, MaxBackoff: time.Second,
	}, nil)
}

var _ = Describe("RedisBackends", Ordered, func() {
	var (
		srvA, srvB     *redistest.Server
		adminA, adminB *redis.Client
		nsA, nsB, nsD  string
		beA, beB       string
		labelB         string
	)
	BeforeAll(func(ctx SpecContext) {
		err := k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: backendSecretsNamespace}})
		if !apierrors.IsAlreadyExists(err) {
			Expect(err).NotTo(HaveOccurred())
		}
		srvA, err = redistest.Start("--requirepass", "admin-a", "--maxclients", "77")
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { _ = srvA.Close() })
		srvB, err = redistest.Start("--requirepass", "admin-b")
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { _ = srvB.Close() })
		adminA = redis.NewClient(&redis.Options{Addr: srvA.Addr(), Password: "admin-a", MaxRetries: -1})
		adminB = redis.NewClient(&redis.Options{Addr: srvB.Addr(), Password: "admin-b", MaxRetries: -1})
		DeferCleanup(func() { _ = adminA.Close(); _ = adminB.Close() })

		suffix := fmt.Sprint(time.Now().UnixNano() % 1_000_000)
		beA, beB = "backend-a-"+suffix, "backend-b-"+suffix
		labelB = "tier-b-" + suffix
		nsA, nsB, nsD = newNamespace(ctx), newNamespace(ctx), newNamespace(ctx)
		edit(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: nsB}}, func(n *corev1.Namespace) {
			n.Labels = map[string]string{"redline.test/backend": labelB}
		})
		Expect(k8s.Create(ctx, backendSecret(beA, "admin-a"))).To(Succeed())
		Expect(k8s.Create(ctx, backendSecret(beB, "admin-b"))).To(Succeed())
		// A by the namespace's name, which only the API server sets; B by a label.
		Expect(k8s.Create(ctx, redisBackend(beA, srvA.URL(), beA, map[string]string{corev1.LabelMetadataName: nsA}))).To(Succeed())
		Expect(k8s.Create(ctx, redisBackend(beB, srvB.URL(), beB, map[string]string{"redline.test/backend": labelB}))).To(Succeed())
		// The suite's other specs count the manager's Redis's namespaces and workloads.
		DeferCleanup(func(ctx context.Context) {
			for _, name := range []string{beA, beB} {
				_ = k8s.Delete(ctx, &v1alpha1.RedisBackend{ObjectMeta: metav1.ObjectMeta{Name: name}})
			}
			for _, ns := range []string{nsA, nsB, nsD} {
				_ = k8s.DeleteAllOf(ctx, &appsv1.ReplicaSet{}, client.InNamespace(ns))
				_ = k8s.DeleteAllOf(ctx, &appsv1.Deployment{}, client.InNamespace(ns))
				_ = k8s.DeleteAllOf(ctx, &v1alpha1.RateLimitPolicy{}, client.InNamespace(ns))
			}
		})
		for _, ns := range []string{nsA, nsB, nsD} {
			Expect(k8s.Create(ctx, policy(ns, "p", 100))).To(Succeed())
		}
	})

	It("refuses a backend that selects nothing or carries credentials in its URL", func(ctx SpecContext) {
		empty := redisBackend("empty-selector", "redis://127.0.0.1:6379", "", nil)
		err := k8s.Create(ctx, empty)
		Expect(err).To(HaveOccurred())
		Expect(err.Error()).To(ContainSubstring("spec.namespaceSelector must select something"))
		creds := redisBackend("creds-in-url", "redis://default:secret@127.0.0.1:6379", "", map[string]string{"a": "b"})
		Expect(k8s.Create(ctx, creds)).To(MatchError(ContainSubstring("spec.url")))
	})

	It("serves each namespace from its backend: scripts, status, heartbeats, memory policy, budget and the injected URL", func(ctx SpecContext) {
		for _, be := range []string{beA, beB} {
			Eventually(func(g Gomega) {
				c, rb := backendCondition(g, ctx, be)
				g.Expect(c.Status).To(Equal(metav1.ConditionTrue), "%s: %s", c.Reason, c.Message)
				g.Expect(rb.Status.Namespaces).To(Equal(int32(1)))
			}, timeout, interval).Should(Succeed())
		}
		hashA := expectProgrammed(ctx, nsA, "p").Status.ConfigHash
		expectProgrammed(ctx, nsB, "p")
		expectProgrammed(ctx, nsD, "p")
		for _, admin := range []*redis.Client{adminA, adminB} {
			missing, err := scripts.Missing(ctx, admin)
			Expect(err).NotTo(HaveOccurred())
			Expect(missing).To(BeEmpty(), "every backend holds the scripts")
		}

		By("Enforced reads the heartbeats of A's namespace from A, not from the manager's Redis")
		Eventually(func(g Gomega) {
			_, err := fleet.Announce(ctx, adminA, nsA, "pod-a", hashA, suiteTTL, []string{"p"})
			g.Expect(err).NotTo(HaveOccurred())
			c := condition(g, ctx, nsA, "p", v1alpha1.ConditionEnforced)
			g.Expect(c.Status).To(Equal(metav1.ConditionTrue), "%s: %s", c.Reason, c.Message)
		}, timeout, interval).Should(Succeed())
		_, err := fleet.Announce(ctx, rdb, nsB, "pod-b", hashA, suiteTTL, []string{"p"})
		Expect(err).NotTo(HaveOccurred())
		Consistently(func(g Gomega) {
			c := condition(g, ctx, nsB, "p", v1alpha1.ConditionEnforced)
			g.Expect(c.Reason).To(Equal(v1alpha1.ReasonNoSidecars), "a heartbeat in the manager's Redis is not B's")
		}, 2*time.Second, 200*time.Millisecond).Should(Succeed())

		By("each policy carries its own Redis's memory policy")
		Expect(adminA.ConfigSet(ctx, "maxmemory", "100mb").Err()).To(Succeed())
		Expect(adminA.ConfigSet(ctx, "maxmemory-policy", "allkeys-lru").Err()).To(Succeed())
		Eventually(func(g Gomega) {
			g.Expect(condition(g, ctx, nsA, "p", v1alpha1.ConditionRedisMemoryPolicy).Reason).To(Equal(v1alpha1.ReasonEvictionPossible))
			g.Expect(condition(g, ctx, nsB, "p", v1alpha1.ConditionRedisMemoryPolicy).Status).To(Equal(metav1.ConditionTrue))
			g.Expect(condition(g, ctx, nsD, "p", v1alpha1.ConditionRedisMemoryPolicy).Status).To(Equal(metav1.ConditionTrue))
			g.Expect(gauge(g, "redline_redis_counts_evictable", map[string]string{"backend": beA})).To(Equal(1.0))
		}, timeout, interval).Should(Succeed())

		By("the connection budget of A is A's maxclients")
		Eventually(func(g Gomega) {
			g.Expect(gauge(g, "redline_redis_maxclients", map[string]string{"backend": beA})).To(Equal(77.0))
		}, timeout, interval).Should(Succeed())

		By("the injector gives A's pods A's URL, and the default's pods not")
		for ns, want := range map[string]string{nsA: srvA.URL(), nsB: srvB.URL()} {
			d := injectedDeployment(ns, "web", 2, "")
			Expect(k8s.Create(ctx, d)).To(Succeed())
			rs := replicaSetOf(d)
			Expect(k8s.Create(ctx, rs)).To(Succeed())
			Eventually(func(g Gomega) {
				g.Expect(redisURLOf(g, ctx, ns, admitSidecar(g, ctx, k8s, rs))).To(Equal(want))
			}, timeout, interval).Should(Succeed())
		}
		d := injectedDeployment(nsD, "web", 2, "")
		Expect(k8s.Create(ctx, d)).To(Succeed())
		rs := replicaSetOf(d)
		Expect(k8s.Create(ctx, rs)).To(Succeed())
		Eventually(func(g Gomega) {
			url := redisURLOf(g, ctx, nsD, admitSidecar(g, ctx, k8s, rs))
			g.Expect(url).NotTo(Or(Equal(srvA.URL()), Equal(srvB.URL())))
		}, timeout, interval).Should(Succeed())
	})

	It("gives each namespace its Redis user on its backend only, and moves it when the namespace moves", func(ctx SpecContext) {
		stop := startBackendTenantACL(newNamespace(ctx))
		defer stop()
		where := func(g Gomega, ns string) []bool {
			var out []bool
			for _, c := range []*redis.Client{adminA, adminB, rdb} {
				ok, err := hasUser(ctx, c, ns)
				g.Expect(err).NotTo(HaveOccurred())
				out = append(out, ok)
			}
			return out
		}
		Eventually(func(g Gomega) {
			g.Expect(where(g, nsA)).To(Equal([]bool{true, false, false}), "A's user on A only")
			g.Expect(where(g, nsB)).To(Equal([]bool{false, true, false}), "B's user on B only")
			g.Expect(where(g, nsD)).To(Equal([]bool{false, false, true}), "the default namespace's on the manager's Redis only")
			g.Expect(condition(g, ctx, nsA, "p", v1alpha1.ConditionTenantIsolation).Message).To(ContainSubstring("RedisBackend " + beA))
		}, timeout, interval).Should(Succeed())
		Eventually(func(g Gomega) {
			var s corev1.Secret
			g.Expect(k8s.Get(ctx, client.ObjectKey{Namespace: nsA, Name: "redline-redis"}, &s)).To(Succeed())
			c := redis.NewClient(&redis.Options{Addr: srvA.Addr(), Username: string(s.Data[contract.RedisUsernameKey]), Password: string(s.Data[contract.RedisSecretKey]), MaxRetries: -1})
			defer c.Close()
			g.Expect(c.Ping(ctx).Err()).To(Succeed(), "A's sidecars log in to A with their Secret")
		}, timeout, interval).Should(Succeed())

		By("B's namespace leaves its backend: its user goes from B to the manager's Redis")
		edit(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: nsB}}, func(n *corev1.Namespace) {
			n.Labels = map[string]string{}
		})
		Eventually(func(g Gomega) {
			g.Expect(where(g, nsB)).To(Equal([]bool{false, false, true}))
			_, rb := backendCondition(g, ctx, beB)
			g.Expect(rb.Status.Namespaces).To(BeZero())
		}, timeout, interval).Should(Succeed())
		edit(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: nsB}}, func(n *corev1.Namespace) {
			n.Labels = map[string]string{"redline.test/backend": labelB}
		})
		Eventually(func(g Gomega) {
			g.Expect(where(g, nsB)).To(Equal([]bool{false, true, false}))
		}, timeout, interval).Should(Succeed())
	})

	It("keeps a namespace on the oldest backend that selects it, and says so on the newer", func(ctx SpecContext) {
		newer := "newer-" + beA
		Expect(k8s.Create(ctx, redisBackend(newer, srvB.URL(), beB, map[string]string{corev1.LabelMetadataName: nsA}))).To(Succeed())
		DeferCleanup(func(ctx context.Context) {
			_ = k8s.Delete(ctx, &v1alpha1.RedisBackend{ObjectMeta: metav1.ObjectMeta{Name: newer}})
		})
		Eventually(func(g Gomega) {
			_, rb := backendCondition(g, ctx, newer)
			g.Expect(rb.Status.Conflicts).To(Equal([]string{nsA}))
			g.Expect(rb.Status.Namespaces).To(BeZero())
			_, old := backendCondition(g, ctx, beA)
			g.Expect(old.Status.Namespaces).To(Equal(int32(1)))
		}, timeout, interval).Should(Succeed())
	})

	It("never serves a namespace from the manager's Redis while its backend is not ready", func(ctx SpecContext) {
		nsE := newNamespace(ctx)
		broken := "broken-" + beA
		Expect(k8s.Create(ctx, redisBackend(broken, srvB.URL(), broken, map[string]string{corev1.LabelMetadataName: nsE}))).To(Succeed())
		DeferCleanup(func(ctx context.Context) {
			_ = k8s.Delete(ctx, &v1alpha1.RedisBackend{ObjectMeta: metav1.ObjectMeta{Name: broken}})
		})
		Eventually(func(g Gomega) {
			c, _ := backendCondition(g, ctx, broken)
			g.Expect(c.Reason).To(Equal(v1alpha1.ReasonBackendSecretError))
			g.Expect(c.Message).To(ContainSubstring("not found"))
		}, timeout, interval).Should(Succeed())
		Expect(k8s.Create(ctx, policy(nsE, "p", 100))).To(Succeed())
		Eventually(func(g Gomega) {
			c := condition(g, ctx, nsE, "p", v1alpha1.ConditionProgrammed)
			g.Expect(c.Status).To(Equal(metav1.ConditionFalse))
			g.Expect(c.Reason).To(Equal(v1alpha1.ReasonRedisUnavailable))
			g.Expect(c.Message).To(ContainSubstring("RedisBackend " + broken + " is not ready"))
		}, timeout, interval).Should(Succeed())

		By("its Secret appears: the namespace is served by its backend")
		Expect(k8s.Create(ctx, backendSecret(broken, "admin-b"))).To(Succeed())
		expectProgrammed(ctx, nsE, "p")
		Eventually(func(g Gomega) {
			c, _ := backendCondition(g, ctx, broken)
			g.Expect(c.Status).To(Equal(metav1.ConditionTrue), "%s: %s", c.Reason, c.Message)
		}, timeout, interval).Should(Succeed())
	})

	It("says so when a backend's admin credentials are wrong", func(ctx SpecContext) {
		wrong := "wrong-" + beA
		Expect(k8s.Create(ctx, backendSecret(wrong, "not-the-password"))).To(Succeed())
		Expect(k8s.Create(ctx, redisBackend(wrong, srvA.URL(), wrong, map[string]string{corev1.LabelMetadataName: "no-such-namespace"}))).To(Succeed())
		DeferCleanup(func(ctx context.Context) {
			_ = k8s.Delete(ctx, &v1alpha1.RedisBackend{ObjectMeta: metav1.ObjectMeta{Name: wrong}})
		})
		Eventually(func(g Gomega) {
			c, _ := backendCondition(g, ctx, wrong)
			g.Expect(c.Reason).To(Equal(v1alpha1.ReasonBackendUnavailable))
			g.Expect(strings.ToUpper(c.Message)).To(ContainSubstring("WRONGPASS"))
		}, timeout, interval).Should(Succeed())
	})
})
