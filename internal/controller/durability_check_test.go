package controller_test

import (
	"context"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/redline-dev/redline/api/v1alpha1"
	"github.com/redline-dev/redline/internal/controller/memorypolicy"
)

// The suite's redis-server starts without persistence and without replicas, as redistest
// starts every server. Each step sets what an admin would with CONFIG SET and waits for the
// policies to say what it means.
var _ = Describe("Redis durability", func() {
	It("warns a long-window policy while a restart would lose its counts, and a rule whose durability Redis cannot give", func() {
		ctx := context.Background()
		ns := newNamespace(ctx)
		long := policy(ns, "month", 100)
		long.Spec.Rules[0].Limit.Window = metav1.Duration{Duration: 2 * time.Hour}
		Expect(k8s.Create(ctx, long)).To(Succeed())
		aof := policy(ns, "aof", 100)
		aof.Spec.Rules[0].Durability = &v1alpha1.Durability{Mode: v1alpha1.DurabilityAppendOnlyFile}
		Expect(k8s.Create(ctx, aof)).To(Succeed())
		replica := policy(ns, "replica", 100)
		replica.Spec.Rules[0].Durability = &v1alpha1.Durability{Mode: v1alpha1.DurabilityReplica}
		Expect(k8s.Create(ctx, replica)).To(Succeed())
		Expect(k8s.Create(ctx, policy(ns, "short", 100))).To(Succeed())
		DeferCleanup(func() {
			Expect(rdb.ConfigSet(ctx, "save", "").Err()).To(Succeed())
			Expect(rdb.ConfigSet(ctx, "appendonly", "no").Err()).To(Succeed())
			// Every long-window policy of the suite's other specs turned True with the file on:
			// wait until the manager turned them all back, so that the status writes and Events
			// of that pass fall within this spec, not the next one.
			Eventually(func(g Gomega) {
				var list v1alpha1.RateLimitPolicyList
				g.Expect(k8s.List(ctx, &list)).To(Succeed())
				for _, p := range list.Items {
					if c := meta.FindStatusCondition(p.Status.Conditions, v1alpha1.ConditionRedisDurability); c != nil {
						g.Expect(c.Status).NotTo(Equal(metav1.ConditionTrue), "%s/%s", p.Namespace, p.Name)
					}
				}
			}, timeout, interval).Should(Succeed())
		})
		expect := func(name string, status metav1.ConditionStatus, reason, text string) {
			GinkgoHelper()
			Eventually(func(g Gomega) {
				c := condition(g, ctx, ns, name, v1alpha1.ConditionRedisDurability)
				g.Expect(c.Status).To(Equal(status), "%s: %s", c.Reason, c.Message)
				g.Expect(c.Reason).To(Equal(reason))
				g.Expect(c.Message).To(ContainSubstring(text))
			}, timeout, interval).Should(Succeed())
		}

		expect("month", metav1.ConditionFalse, v1alpha1.ReasonCountsLostOnRestart, "rule per-api-key counts a 2h0m0s window in "+redisSrv.Addr()+"'s memory, which runs with appendonly no")
		Eventually(func(g Gomega) []string { return eventsAbout(g, ctx, ns, "RateLimitPolicy", "month") }, timeout, interval).
			Should(ContainElement(HavePrefix("Warning/" + v1alpha1.ReasonCountsLostOnRestart + ": ")))
		expect("replica", metav1.ConditionFalse, v1alpha1.ReasonNoReplica, "has no replica connected")

		// RDB snapshots bound the loss to what was counted since the last one: said, not Durable.
		Expect(rdb.ConfigSet(ctx, "save", "3600 1").Err()).To(Succeed())
		expect("month", metav1.ConditionFalse, v1alpha1.ReasonCountsLostSinceSnapshot, `runs with appendonly no and RDB snapshots only (save "3600 1"`)
		Eventually(func(g Gomega) []string { return eventsAbout(g, ctx, ns, "RateLimitPolicy", "month") }, timeout, interval).
			Should(ContainElement(HavePrefix("Warning/" + v1alpha1.ReasonCountsLostSinceSnapshot + ": ")))
		Expect(rdb.ConfigSet(ctx, "save", "").Err()).To(Succeed())
		expect("month", metav1.ConditionFalse, v1alpha1.ReasonCountsLostOnRestart, `and no RDB snapshots (save "")`)

		Expect(rdb.ConfigSet(ctx, "appendonly", "yes").Err()).To(Succeed())
		expect("month", metav1.ConditionTrue, v1alpha1.ReasonDurable, "on all 1 Redis masters")
		Eventually(func(g Gomega) []string { return eventsAbout(g, ctx, ns, "RateLimitPolicy", "month") }, timeout, interval).
			Should(ContainElement(HavePrefix("Normal/" + v1alpha1.ReasonDurable + ": ")))
		// This machine's Redis is 7.0: WAITAOF is unknown, and the rule asking for it is told.
		info, err := rdb.Info(ctx, "server").Result()
		Expect(err).NotTo(HaveOccurred())
		if (memorypolicy.NodeDurability{Version: infoValue(info, "redis_version")}).WaitAOF() {
			expect("aof", metav1.ConditionTrue, v1alpha1.ReasonDurable, "")
		} else {
			expect("aof", metav1.ConditionFalse, v1alpha1.ReasonDurabilityUnsupported, "which has no WAITAOF (7.2 or later)")
			Eventually(func(g Gomega) []string { return eventsAbout(g, ctx, ns, "RateLimitPolicy", "aof") }, timeout, interval).
				Should(ContainElement(HavePrefix("Warning/" + v1alpha1.ReasonDurabilityUnsupported + ": rule per-api-key asks durability AppendOnlyFile")))
		}

		// A short window without durability is not concerned: no condition.
		Consistently(func(g Gomega) bool {
			var p v1alpha1.RateLimitPolicy
			g.Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "short"}, &p)).To(Succeed())
			return meta.FindStatusCondition(p.Status.Conditions, v1alpha1.ConditionRedisDurability) == nil
		}, time.Second, interval).Should(BeTrue())
	})
})

// infoValue is field's value in an INFO reply.
func infoValue(info, field string) string {
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
			return v
		}
	}
	return ""
}
