package e2e

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/redis/go-redis/v9"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/redline-dev/redline/api/v1alpha1"
	"github.com/redline-dev/redline/internal/controller/redisbackend"
	"github.com/redline-dev/redline/internal/testutil/redistest"
	"github.com/redline-dev/redline/internal/testutil/stack"
)

// Issue 24: a tenant that stalls Redis (a huge key of its own, a script) stalls every tenant
// on it; a RedisBackend gives such a tenant a Redis of its own.
var _ = Describe("Namespaces on Redis backends of their own", func() {
	It("admits exactly each namespace's limit on its backend, and a stalled backend changes nothing for the others", func(ctx SpecContext) {
		type tenant struct {
			ns      string
			srv     *redistest.Server // nil: the manager's Redis
			admin   *redis.Client
			proxies []string
			cars    []*stack.Sidecar
		}
		tenants := []*tenant{{ns: "e2e-backend-a"}, {ns: "e2e-backend-b"}, {ns: "e2e-backend-default"}}
		for i, t := range tenants[:2] {
			password := fmt.Sprintf("backend-admin-%d", i)
			srv, err := redistest.Start("--requirepass", password)
			Expect(err).NotTo(HaveOccurred())
			DeferCleanup(func() { _ = srv.Close() })
			t.srv = srv
			t.admin = redis.NewClient(&redis.Options{Addr: srv.Addr(), Password: password, MaxRetries: -1})
			DeferCleanup(func() { _ = t.admin.Close() })
			name := "e2e-" + t.ns
			Expect(st.Client.Create(ctx, &corev1.Secret{
				ObjectMeta: metav1.ObjectMeta{Namespace: stack.ManagerNamespace, Name: name},
				Data:       map[string][]byte{redisbackend.PasswordKey: []byte(password)},
			})).To(Succeed())
			Expect(st.Client.Create(ctx, &v1alpha1.RedisBackend{
				ObjectMeta: metav1.ObjectMeta{Name: name},
				Spec: v1alpha1.RedisBackendSpec{
					URL: srv.URL(), CredentialsSecret: name,
					NamespaceSelector: metav1.LabelSelector{MatchLabels: map[string]string{corev1.LabelMetadataName: t.ns}},
				},
			})).To(Succeed())
		}
		tenants[2].admin = redisClient()
		DeferCleanup(func() { _ = tenants[2].admin.Close() })

		for _, t := range tenants {
			Expect(st.CreateNamespace(ctx, t.ns)).To(Succeed())
			p := policy("limit", "/", v1alpha1.FixedWindow, exactLimit, v1alpha1.FailureModeClosed)
			p.Namespace = t.ns
			Expect(st.ApplyPolicy(ctx, p)).To(Succeed())
		}
		for _, t := range tenants {
			_, err := st.WaitProgrammed(ctx, t.ns, "limit", time.Minute)
			Expect(err).NotTo(HaveOccurred())
			app := stack.App{Namespace: t.ns, Name: "shop", Replicas: 2, Labels: appLabels, UpstreamPort: upstreamPort}
			Expect(st.CreateDeployment(ctx, app)).To(Succeed())
			pods, err := st.WaitPods(ctx, app, time.Minute)
			Expect(err).NotTo(HaveOccurred())
			for _, pod := range pods {
				want := st.Redis.URL()
				if t.srv != nil {
					want = t.srv.URL()
				}
				// Every pod names its namespace's ConfigMap alike; the manager writes the
				// backend's URL there, which the sidecar takes over the cluster's.
				Eventually(func() string { return podRedisURL(ctx, &pod) }).WithTimeout(time.Minute).WithPolling(100*time.Millisecond).
					Should(Equal(want), "%s's pods get its backend's URL", t.ns)
			}
			// Each namespace's Redis user is on its backend before its sidecars start.
			waitIsolated(ctx, t.ns)
			t.cars, err = st.RunSidecars(ctx, pods, upstream.Addr)
			Expect(err).NotTo(HaveOccurred())
			if t.srv != nil {
				for _, sc := range t.cars {
					Expect(sc.Env).To(ContainElement("REDLINE_NAMESPACE_REDIS_URL="+t.srv.URL()), "the sidecar process is given its namespace's Redis")
				}
			}
			for _, sc := range t.cars {
				t.proxies = append(t.proxies, sc.ProxyURL)
			}
			DeferCleanup(func() {
				for _, sc := range t.cars {
					_ = sc.Stop()
				}
			})
		}

		sendAll := func(key string, ts []*tenant) map[string]stack.Tally {
			out := map[string]stack.Tally{}
			var mu sync.Mutex
			var wg sync.WaitGroup
			for _, t := range ts {
				wg.Go(func() {
					tally := stack.Send(ctx, t.proxies, 3*exactLimit, 8, func(i int) stack.Request {
						return stack.Request{Path: fmt.Sprintf("/item/%d", i), Header: http.Header{keyHeader: {key}}}
					})
					mu.Lock()
					out[t.ns] = tally
					mu.Unlock()
				})
			}
			wg.Wait()
			return out
		}

		By("every namespace admits exactly its limit, counted on its own Redis")
		key := freshKey("backends")
		for ns, tally := range sendAll(key, tenants) {
			Expect(tally.Failed).To(BeZero(), "%s: first failure: %s", ns, tally.FirstFailure)
			Expect(tally.Admitted).To(Equal(exactLimit), "%s admits its limit exactly", ns)
			Expect(tally.Limited).To(Equal(2 * exactLimit))
		}
		for _, t := range tenants {
			for _, other := range tenants {
				keys, err := other.admin.Keys(ctx, "rl:{"+t.ns+"/*").Result()
				Expect(err).NotTo(HaveOccurred())
				if other == t {
					Expect(keys).NotTo(BeEmpty(), "%s's counters and heartbeats are on its Redis", t.ns)
				} else {
					Expect(keys).To(BeEmpty(), "%s's keys are on %s's Redis too", t.ns, other.ns)
				}
			}
		}

		By("backend A stalls (SIGSTOP): B and the default admit exactly, from Redis, while A decides by its failure mode")
		before := map[string]float64{}
		for _, t := range tenants[1:] {
			before[t.ns] = degradedDecisions(ctx, t.cars)
		}
		Expect(tenants[0].srv.Pause()).To(Succeed())
		resumed := false
		resume := func() {
			if !resumed {
				resumed = true
				Expect(tenants[0].srv.Resume()).To(Succeed())
			}
		}
		DeferCleanup(resume)
		stalled := freshKey("stalled")
		results := sendAll(stalled, tenants)
		for _, t := range tenants[1:] {
			tally := results[t.ns]
			Expect(tally.Failed).To(BeZero(), "%s: first failure: %s", t.ns, tally.FirstFailure)
			Expect(tally.Admitted).To(Equal(exactLimit), "%s admits its limit exactly while A is stalled", t.ns)
			Expect(tally.Limited).To(Equal(2 * exactLimit))
			Expect(degradedDecisions(ctx, t.cars)).To(Equal(before[t.ns]), "no decision of %s was made by its failure mode", t.ns)
			GinkgoWriter.Printf("%s during A's stall: %d admitted, %d limited in %s\n", t.ns, tally.Admitted, tally.Limited, tally.Elapsed)
		}
		a := results[tenants[0].ns]
		Expect(a.Admitted).To(BeZero(), "A's policy fails closed while its Redis is stalled")
		Expect(degradedDecisions(ctx, tenants[0].cars)).To(BeNumerically(">", 0), "A decided by its failure mode")
		resume()

		By("A's Redis back: A admits exactly its limit again")
		Eventually(func(g Gomega) {
			fresh := freshKey("back")
			tally := stack.Send(ctx, tenants[0].proxies, 3*exactLimit, 8, func(i int) stack.Request {
				return stack.Request{Path: fmt.Sprintf("/item/%d", i), Header: http.Header{keyHeader: {fresh}}}
			})
			g.Expect(tally.Failed).To(BeZero(), "first failure: %s", tally.FirstFailure)
			g.Expect(tally.Admitted).To(Equal(exactLimit))
		}).WithTimeout(time.Minute).WithPolling(2 * time.Second).Should(Succeed())
	})
})

// degradedDecisions adds the sidecars' decisions made by a failure mode.
func degradedDecisions(ctx context.Context, cars []*stack.Sidecar) float64 {
	GinkgoHelper()
	total := 0.0
	for _, sc := range cars {
		v, err := sc.Metric(ctx, "redline_sidecar_degraded_decisions_total", nil)
		Expect(err).NotTo(HaveOccurred())
		total += v
	}
	return total
}

// podRedisURL is the Redis URL the pod's sidecar starts on: its namespace's, from the
// ConfigMap the manager writes (optional, as kubelet reads it), else the cluster's in its spec.
func podRedisURL(ctx context.Context, pod *corev1.Pod) string {
	GinkgoHelper()
	var cluster, namespace string
	for _, c := range slices.Concat(pod.Spec.InitContainers, pod.Spec.Containers) {
		for _, e := range c.Env {
			switch {
			case e.Name == "REDLINE_REDIS_URL":
				cluster = e.Value
			case e.Name == "REDLINE_NAMESPACE_REDIS_URL" && e.ValueFrom != nil && e.ValueFrom.ConfigMapKeyRef != nil:
				ref := e.ValueFrom.ConfigMapKeyRef
				var cm corev1.ConfigMap
				err := st.Client.Get(ctx, client.ObjectKey{Namespace: pod.Namespace, Name: ref.Name}, &cm)
				Expect(client.IgnoreNotFound(err)).To(Succeed())
				namespace = cm.Data[ref.Key]
			}
		}
	}
	if namespace != "" {
		return namespace
	}
	return cluster
}
