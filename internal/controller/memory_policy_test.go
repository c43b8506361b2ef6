package controller_test

import (
	"context"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/redline-dev/redline/api/v1alpha1"
)

// The suite's redis-server starts without maxmemory, as redis-server does. Each step sets what
// an admin would with CONFIG SET and waits for every policy to say what it means.
var _ = Describe("Redis memory policy", func() {
	It("warns every policy, with an Event and a metric, while a node can evict counts", func() {
		ctx := context.Background()
		ns := newNamespace(ctx)
		Expect(k8s.Create(ctx, policy(ns, "mem", 100))).To(Succeed())
		DeferCleanup(func() {
			Expect(rdb.ConfigSet(ctx, "maxmemory", "0").Err()).To(Succeed())
			Expect(rdb.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err()).To(Succeed())
		})
		expect := func(status metav1.ConditionStatus, reason, text string) {
			GinkgoHelper()
			Eventually(func(g Gomega) {
				c := condition(g, ctx, ns, "mem", v1alpha1.ConditionRedisMemoryPolicy)
				g.Expect(c.Status).To(Equal(status), "%s: %s", c.Reason, c.Message)
				g.Expect(c.Reason).To(Equal(reason))
				g.Expect(c.Message).To(ContainSubstring(text))
			}, timeout, interval).Should(Succeed())
		}

		expect(metav1.ConditionTrue, v1alpha1.ReasonNoMaxmemory, "maxmemory 0 on "+redisSrv.Addr())

		Expect(rdb.ConfigSet(ctx, "maxmemory", "100mb").Err()).To(Succeed())
		Expect(rdb.ConfigSet(ctx, "maxmemory-policy", "allkeys-lru").Err()).To(Succeed())
		expect(metav1.ConditionFalse, v1alpha1.ReasonEvictionPossible, "counts can be evicted by another tenant's writes: "+redisSrv.Addr()+" (maxmemory-policy allkeys-lru")
		Eventually(func(g Gomega) []string { return eventsAbout(g, ctx, ns, "RateLimitPolicy", "mem") }, timeout, interval).
			Should(ContainElement(HavePrefix("Warning/" + v1alpha1.ReasonEvictionPossible + ": counts can be evicted")))
		Eventually(func(g Gomega) float64 {
			return gauge(g, "redline_redis_counts_evictable", map[string]string{"node": redisSrv.Addr(), "maxmemory_policy": "allkeys-lru"})
		}, timeout, interval).Should(Equal(1.0))

		// Every Redline key has a TTL: a volatile policy evicts them as well.
		Expect(rdb.ConfigSet(ctx, "maxmemory-policy", "volatile-ttl").Err()).To(Succeed())
		expect(metav1.ConditionFalse, v1alpha1.ReasonEvictionPossible, "(maxmemory-policy volatile-ttl")

		Expect(rdb.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err()).To(Succeed())
		expect(metav1.ConditionTrue, v1alpha1.ReasonNoEviction, "maxmemory-policy noeviction on all 1 Redis nodes")
		Eventually(func(g Gomega) []string { return eventsAbout(g, ctx, ns, "RateLimitPolicy", "mem") }, timeout, interval).
			Should(ContainElement(HavePrefix("Normal/" + v1alpha1.ReasonNoEviction + ": ")))
		Eventually(func(g Gomega) float64 {
			return gauge(g, "redline_redis_counts_evictable", map[string]string{"node": redisSrv.Addr(), "maxmemory_policy": "noeviction"})
		}, timeout, interval).Should(Equal(0.0))
	})
})
