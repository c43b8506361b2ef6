package controller_test

import (
	"context"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/redline-dev/redline/api/v1alpha1"
	"github.com/redline-dev/redline/internal/policydoc"
)

var _ = Describe("Calendar and long windows", func() {
	var ctx context.Context
	BeforeEach(func() { ctx = context.Background() })

	day := func(zone string) *v1alpha1.CalendarWindow {
		return &v1alpha1.CalendarWindow{Unit: v1alpha1.CalendarDay, TimeZone: zone}
	}
	fixed := func(p *v1alpha1.RateLimitPolicy, c *v1alpha1.CalendarWindow) {
		p.Spec.Rules[0].Algorithm = v1alpha1.FixedWindow
		p.Spec.Rules[0].Limit = v1alpha1.Limit{Requests: 1000, Calendar: c}
	}

	It("compiles a day in Berlin, a billing month and a week-long rolling window", func() {
		ns := newNamespace(ctx)
		p := policy(ns, "quotas", 10)
		fixed(p, day("Europe/Berlin"))
		month, week := p.Spec.Rules[0], p.Spec.Rules[0]
		month.Name, month.Limit.Calendar = "month", &v1alpha1.CalendarWindow{Unit: v1alpha1.CalendarMonth, BillingDay: 31, TimeZone: "America/New_York"}
		week.Name, week.Algorithm, week.Limit = "week", v1alpha1.SlidingWindowCounter, v1alpha1.Limit{Requests: 5000, Window: metav1.Duration{Duration: 168 * time.Hour}}
		p.Spec.Rules = append(p.Spec.Rules, month, week)
		Expect(k8s.Create(ctx, p)).To(Succeed())
		expectProgrammed(ctx, ns, "quotas")
		Eventually(func(g Gomega) {
			doc, _ := document(g, ctx, ns)
			rules := doc.Policies[0].Rules
			g.Expect(rules).To(HaveLen(3))
			g.Expect(rules[0].Calendar).To(Equal(&policydoc.Calendar{Unit: "Day", Zone: "Europe/Berlin"}))
			g.Expect(rules[0].WindowMS).To(BeEquivalentTo(26 * time.Hour / time.Millisecond))
			g.Expect(rules[1].Calendar).To(Equal(&policydoc.Calendar{Unit: "Month", Zone: "America/New_York", BillingDay: 31}))
			g.Expect(rules[2].Calendar).To(BeNil())
			g.Expect(rules[2].WindowMS).To(BeEquivalentTo(168 * time.Hour / time.Millisecond))
		}, timeout, interval).Should(Succeed())
	})

	It("refuses a zone its zone data does not know, in the policy's status", func() {
		ns := newNamespace(ctx)
		Expect(k8s.Create(ctx, policy(ns, "good", 100))).To(Succeed())
		bad := policy(ns, "mars", 100)
		fixed(bad, day("Mars/Olympus_Mons")) // a name the schema's pattern lets through
		Expect(k8s.Create(ctx, bad)).To(Succeed())
		expectProgrammed(ctx, ns, "good")
		Eventually(func(g Gomega) {
			c := condition(g, ctx, ns, "mars", v1alpha1.ConditionAccepted)
			g.Expect(c.Status).To(Equal(metav1.ConditionFalse))
			g.Expect(c.Reason).To(Equal("Invalid"))
			g.Expect(c.Message).To(ContainSubstring(`unknown time zone "Mars/Olympus_Mons"`))
		}, timeout, interval).Should(Succeed())
		Eventually(func(g Gomega) {
			doc, _ := document(g, ctx, ns)
			g.Expect(policyNames(doc)).To(Equal([]string{"good"}))
		}, timeout, interval).Should(Succeed())
	})
})
