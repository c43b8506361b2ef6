package controller_test

import (
	"context"
	"fmt"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/redline-dev/redline/api/v1alpha1"
	"github.com/redline-dev/redline/internal/backend"
	"github.com/redline-dev/redline/internal/fleet"
	"github.com/redline-dev/redline/internal/testutil/fleettest"
)

// suiteTTL is the suite manager's HeartbeatTTL (suite_test.go).
const suiteTTL = 10 * time.Second

var _ = Describe("What the manager reads of sidecar heartbeats", func() {
	// Issue 24: a tenant's 40 heartbeat groups of 10,000 members with 256-byte names took the
	// manager over its 256Mi limit at every reconcile of the namespace.
	It("reads a stuffed namespace within its bound, says so on its policies, and enforces the others'", func(ctx SpecContext) {
		stuffedNS, victim := newNamespace(ctx), newNamespace(ctx)
		names := make([]string, 40)
		for i := range names {
			names[i] = fmt.Sprintf("p-%02d", i)
			Expect(k8s.Create(ctx, policy(stuffedNS, names[i], 100))).To(Succeed())
		}
		Expect(k8s.Create(ctx, policy(stuffedNS, "small", 100))).To(Succeed())
		Expect(k8s.Create(ctx, policy(victim, "api", 100))).To(Succeed())
		hash := expectProgrammed(ctx, stuffedNS, "small").Status.ConfigHash
		for _, n := range names {
			expectProgrammed(ctx, stuffedNS, n)
		}
		victimHash := expectProgrammed(ctx, victim, "api").Status.ConfigHash

		By("the tenant writing 40 groups of 10,000 live members of 256-byte names and hashes")
		stuffed, err := fleettest.Stuff(ctx, rdb, stuffedNS, names, 10000, 256, strings.Repeat("f", 256))
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func(ctx context.Context) { _ = stuffed.Delete(ctx) })
		// Everything beats again every 2s, well within the manager's TTL, while it is checked.
		var beaten time.Time
		beat := func(g Gomega) {
			if time.Since(beaten) < 2*time.Second {
				return
			}
			g.Expect(stuffed.Refresh(ctx)).To(Succeed())
			for _, pod := range []string{"small-a", "small-b", "small-c"} {
				_, err := fleet.Announce(ctx, rdb, stuffedNS, pod, hash, suiteTTL, []string{"small"})
				g.Expect(err).NotTo(HaveOccurred())
			}
			for _, pod := range []string{"api-a", "api-b"} {
				_, err := fleet.Announce(ctx, rdb, victim, pod, victimHash, suiteTTL, []string{"api"})
				g.Expect(err).NotTo(HaveOccurred())
			}
			beaten = time.Now()
		}

		Eventually(func(g Gomega) {
			beat(g)
			for _, n := range names {
				c := condition(g, ctx, stuffedNS, n, v1alpha1.ConditionEnforced)
				g.Expect(c.Status).To(Equal(metav1.ConditionUnknown), "%s: %s", n, c.Message)
				g.Expect(c.Reason).To(Equal(v1alpha1.ReasonSidecarReportsOverBound))
				g.Expect(c.Message).To(HavePrefix(fmt.Sprintf("10000 live sidecars report for this policy, more than the %d heartbeats the manager reads of one policy, or than were left of the %d",
					fleet.MaxMembers, fleet.NamespaceMembers)))
			}
			// The namespace's small group is still read, and another namespace is untouched.
			c := condition(g, ctx, stuffedNS, "small", v1alpha1.ConditionEnforced)
			g.Expect(c.Status).To(Equal(metav1.ConditionTrue), c.Message)
			g.Expect(c.Message).To(HavePrefix("3 of 3 live sidecars"))
			c = condition(g, ctx, victim, "api", v1alpha1.ConditionEnforced)
			g.Expect(c.Status).To(Equal(metav1.ConditionTrue), c.Message)
			g.Expect(c.Message).To(HavePrefix("2 of 2 live sidecars"))
			g.Expect(eventReasons(ctx, stuffedNS, names[0])).To(ContainElement(v1alpha1.ReasonSidecarReportsOverBound))
		}, timeout, interval).Should(Succeed())
		Eventually(beat).Should(Succeed())

		By("measuring one reading of the stuffed groups: the manager's before (fleet.Read of each) and now")
		readTotal, readHeld := fleettest.Allocation(func() any {
			var all []fleet.Report
			for _, n := range names {
				r, err := fleet.Read(ctx, rdb, stuffedNS, n, suiteTTL)
				Expect(err).NotTo(HaveOccurred())
				all = append(all, r)
			}
			return all
		})
		reports := &backend.Sidecars{Client: rdb, TTL: suiteTTL}
		var got []fleet.Summary
		sumTotal, sumHeld := fleettest.Allocation(func() any {
			got = reports.Summaries(ctx, stuffedNS, hash, append(names, "small"))
			return got
		})
		entry := fmt.Sprintf("40 groups of 10,000 members of 256 bytes: before, fleet.Read of each allocates %.1f MiB and holds %.1f MiB; "+
			"now, Summaries allocates %.2f MiB and holds %.2f MiB", fleettest.MiB(readTotal), fleettest.MiB(readHeld), fleettest.MiB(sumTotal), fleettest.MiB(sumHeld))
		AddReportEntry("manager's reading of a stuffed namespace", entry)
		GinkgoWriter.Println(entry)
		Expect(got[len(names)].Current).To(BeEquivalentTo(3))
		// A bound the manager's concurrent reconciles cannot reach by noise, and a tenth of before.
		Expect(sumTotal).To(BeNumerically("<", 24<<20))
		Expect(sumHeld).To(BeNumerically("<", 16<<20))
	})

	// A document that is not written leaves nothing to compare the sidecars' reports with: its
	// groups are not read at all (the last key access Redis records stops moving).
	It("does not read the groups of a namespace whose document is not written", func(ctx SpecContext) {
		ns := newNamespace(ctx)
		Expect(k8s.Create(ctx, policy(ns, "small", 10))).To(Succeed())
		hash := expectProgrammed(ctx, ns, "small").Status.ConfigHash
		// A long TTL on the keys: the group must outlive the check below.
		_, err := fleet.Announce(ctx, rdb, ns, "pod-a", hash, time.Minute, []string{"small"})
		Expect(err).NotTo(HaveOccurred())
		key := fleet.GroupKey(ns, "small")

		wide := policy(ns, "wide", 10)
		wide.Spec.Rules = nil
		for i := range 32 {
			r := policy(ns, "x", 10).Spec.Rules[0]
			r.Name = fmt.Sprintf("r%d", i)
			for j := range 16 {
				v := strings.Repeat("v", 1600)
				r.Match.Headers = append(r.Match.Headers, v1alpha1.HeaderMatch{Name: fmt.Sprintf("X-H%d", j), Value: &v})
			}
			wide.Spec.Rules = append(wide.Spec.Rules, r)
		}
		Expect(k8s.Create(ctx, wide)).To(Succeed())
		DeferCleanup(func(ctx context.Context) { _ = k8s.Delete(ctx, wide) })
		Eventually(func(g Gomega) {
			g.Expect(condition(g, ctx, ns, "small", v1alpha1.ConditionProgrammed).Reason).To(Equal(v1alpha1.ReasonDocumentTooLarge))
			c := condition(g, ctx, ns, "small", v1alpha1.ConditionEnforced)
			g.Expect(c.Status).To(Equal(metav1.ConditionUnknown))
			g.Expect(c.Reason).To(Equal(v1alpha1.ReasonNotWritten))
		}, timeout, interval).Should(Succeed())
		// The manager reconciles every 300ms; a read would keep the idle time at 0.
		Eventually(func() int64 {
			return int64(rdb.ObjectIdleTime(ctx, key).Val() / time.Second)
		}, timeout, interval).Should(BeNumerically(">=", 3))
		Expect(rdb.Exists(ctx, key).Val()).To(BeEquivalentTo(1))
	})
})
