package e2e

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/redis/go-redis/v9"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/redline-dev/redline/api/v1alpha1"
	"github.com/redline-dev/redline/internal/fleet"
	"github.com/redline-dev/redline/internal/keyscheme"
	"github.com/redline-dev/redline/internal/limiter/scripts"
	"github.com/redline-dev/redline/internal/sidecar/contract"
	"github.com/redline-dev/redline/internal/testutil/stack"
)

const (
	attackerNamespace = "e2e-attacker"
	victimNamespace   = "e2e-victim"
	victimReplicas    = 2
)

// Tenant A (attackerNamespace) holds its own Redis credentials, read from its own Secret as
// any of its pods could, and attacks tenant B (two sidecars of its own) while B sends three
// times its limit: every attack is refused, and B admits exactly its limit.
var _ = Describe("Two tenants on one Redis", func() {
	It("keeps B's limits exact while A attacks its keys, scripts and heartbeats", func(ctx SpecContext) {
		Expect(st.CreateNamespace(ctx, attackerNamespace)).To(Succeed())
		own := policy("own", "/", v1alpha1.FixedWindow, 10, v1alpha1.FailureModeClosed)
		own.Namespace = attackerNamespace
		Expect(st.ApplyPolicy(ctx, own)).To(Succeed())

		Expect(st.CreateNamespace(ctx, victimNamespace)).To(Succeed())
		const victimPolicy = "victim-limit"
		vp := policy(victimPolicy, "/", v1alpha1.FixedWindow, exactLimit, v1alpha1.FailureModeClosed)
		vp.Namespace = victimNamespace
		Expect(st.ApplyPolicy(ctx, vp)).To(Succeed())
		_, err := st.WaitProgrammed(ctx, victimNamespace, victimPolicy, time.Minute)
		Expect(err).NotTo(HaveOccurred())
		app := stack.App{Namespace: victimNamespace, Name: "shop", Replicas: victimReplicas, Labels: appLabels, UpstreamPort: upstreamPort}
		Expect(st.CreateDeployment(ctx, app)).To(Succeed())
		victimPods, err := st.WaitPods(ctx, app, time.Minute)
		Expect(err).NotTo(HaveOccurred())
		// B's Secret exists before its sidecars start (they read it at every connection anyway).
		Eventually(func() error {
			return st.Client.Get(ctx, client.ObjectKey{Namespace: victimNamespace, Name: "redline-redis"}, &corev1.Secret{})
		}).WithTimeout(time.Minute).Should(Succeed())
		victims, err := st.RunSidecars(ctx, victimPods, upstream.Addr)
		Expect(err).NotTo(HaveOccurred())
		var victimProxies []string
		for _, sc := range victims {
			victimProxies = append(victimProxies, sc.ProxyURL)
		}

		var user, password string
		Eventually(func(g Gomega) {
			var s corev1.Secret
			g.Expect(st.Client.Get(ctx, client.ObjectKey{Namespace: attackerNamespace, Name: "redline-redis"}, &s)).To(Succeed())
			user, password = string(s.Data[contract.RedisUsernameKey]), string(s.Data[contract.RedisSecretKey])
			g.Expect(password).NotTo(BeEmpty())
		}).WithTimeout(time.Minute).Should(Succeed())
		for _, ns := range []string{victimNamespace, attackerNamespace} {
			waitIsolated(ctx, ns)
		}
		attacker := redis.NewClient(&redis.Options{Addr: st.Redis.Addr(), Username: user, Password: password, MaxRetries: -1})
		defer func() { _ = attacker.Close() }()
		Expect(attacker.Ping(ctx).Err()).To(Succeed(), "A's credentials work")

		key := freshKey("tenant")
		counter := keyscheme.Key(victimNamespace, victimPolicy, "per-client", key) + ":swc"
		group := fleet.GroupKey(victimNamespace, victimPolicy)
		fw, _ := scripts.For("FixedWindow")
		ret := scripts.LeaseReturn()
		attacks := [][]any{
			{"del", counter},
			{"set", counter, "0", "px", "86400000"},
			{"decrby", counter, "1000"},
			{"evalsha", ret.SHA, 1, counter, 86400000, 0, 1000},
			{"evalsha", fw.SHA, 1, counter, 1000000, 86400000, 1},
			{"eval", "return redis.call('del', KEYS[1])", 1, counter},
			{"script", "flush"},
			{"script", "load", "return 1"},
			{"zadd", group, "99999999999999", "ghost"},
			{"evalsha", fleet.Scripts()[0].SHA, 2, group, group + ":cfg", "ghost", 86400000, "h"},
			{"flushall"},
			{"config", "set", "maxclients", "1"},
			{"client", "kill", "type", "normal"},
		}
		stop := make(chan struct{})
		var wg sync.WaitGroup
		var mu sync.Mutex
		refused, other := 0, []string{}
		wg.Go(func() {
			for {
				for _, a := range attacks {
					select {
					case <-stop:
						return
					default:
					}
					err := attacker.Do(context.Background(), a...).Err()
					mu.Lock()
					if err != nil && strings.HasPrefix(err.Error(), "NOPERM") {
						refused++
					} else {
						other = append(other, a[0].(string)+": "+errString(err))
					}
					mu.Unlock()
				}
			}
		})
		t := stack.Send(ctx, victimProxies, 3*exactLimit, 12, func(i int) stack.Request {
			return stack.Request{Path: fmt.Sprintf("/item/%d", i), Header: http.Header{keyHeader: {key}}}
		})
		close(stop)
		wg.Wait()
		Expect(other).To(BeEmpty(), "every attack is refused")
		Expect(refused).To(BeNumerically(">=", len(attacks)))
		Expect(t.Failed).To(BeZero(), "first failure: %s", t.FirstFailure)
		Expect(t.Admitted).To(Equal(exactLimit), "B's limit holds exactly")
		Expect(t.Limited).To(Equal(2 * exactLimit))

		// B's heartbeats count B's three sidecars, no ghost; its scripts are all there.
		admin := redisClient()
		defer func() { _ = admin.Close() }()
		members, err := fleet.Members(ctx, admin, victimNamespace, victimPolicy, fleet.TTL(fleet.DefaultInterval))
		Expect(err).NotTo(HaveOccurred())
		Expect(members).To(HaveLen(victimReplicas))
		Expect(members).NotTo(HaveKey("ghost"))
		Expect(admin.ScriptExists(ctx, fw.SHA, ret.SHA, fleet.Scripts()[0].SHA).Val()).To(Equal([]bool{true, true, true}))
		for _, sc := range victims {
			Expect(sc.Stop()).To(Succeed())
		}
	})
})

func errString(err error) string {
	if err == nil {
		return "accepted"
	}
	return err.Error()
}

// The suite runs what the chart installs: the manager with none of the intervals, bounds and
// modes the chart leaves to the binary (so tenant ACLs at --redis-tenant-acl=auto and the
// script and restart checks at backend.DefaultCheckInterval), on a Redis whose default user
// has a password only the manager holds, so every sidecar is its namespace's own user.
var _ = Describe("The end-to-end stack", func() {
	It("runs the manager at its defaults, with per-namespace Redis users", func() {
		for _, a := range st.ManagerArgs() {
			for _, f := range []string{"--script-check-interval", "--redis-tenant-acl", "--max-backoff", "--resync-interval", "--budget-interval", "--redis-timeout"} {
				Expect(a).NotTo(HavePrefix(f), "the e2e manager runs with %s: the chart runs the default", a)
			}
		}
		Expect(redisAdminPassword).NotTo(BeEmpty())
		for _, sc := range sidecars {
			Expect(sc.Env).NotTo(ContainElement(ContainSubstring(redisAdminPassword)), "sidecar of %s holds the admin password", sc.Pod.Name)
			Expect(sc.Args).To(ContainElement(HavePrefix("--"+contract.FlagRedisCredentialsDir+"=")), "sidecar of %s reads no credentials", sc.Pod.Name)
		}
	})
})
