package v1alpha1_test

import (
	"context"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/redline-dev/redline/api/v1alpha1"
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

	DescribeTable("the API server refuses invalid calendar and long windows with a message",
		func(mutate func(*v1alpha1.RateLimitPolicy), message string) {
			ns := newNamespace(ctx)
			p := policy(ns, "invalid", 100)
			mutate(p)
			err := k8s.Create(ctx, p)
			Expect(err).To(HaveOccurred())
			Expect(apierrors.IsInvalid(err)).To(BeTrue(), "%v", err)
			Expect(err.Error()).To(ContainSubstring(message))
		},
		Entry("a rolling window over 31 days", func(p *v1alpha1.RateLimitPolicy) {
			p.Spec.Rules[0].Limit.Window = metav1.Duration{Duration: 745 * time.Hour}
		}, "limit.window must be between 1s and 744h"),
		Entry("a fixed window over 24h", func(p *v1alpha1.RateLimitPolicy) {
			p.Spec.Rules[0].Algorithm = v1alpha1.FixedWindow
			p.Spec.Rules[0].Limit.Window = metav1.Duration{Duration: 48 * time.Hour}
		}, "limit.window longer than 24h needs algorithm SlidingWindowCounter"),
		Entry("a calendar with SlidingWindowCounter", func(p *v1alpha1.RateLimitPolicy) {
			p.Spec.Rules[0].Limit = v1alpha1.Limit{Requests: 10, Calendar: day("")}
		}, "limit.calendar needs algorithm FixedWindow"),
		Entry("a calendar and a window", func(p *v1alpha1.RateLimitPolicy) {
			fixed(p, day(""))
			p.Spec.Rules[0].Limit.Window = metav1.Duration{Duration: time.Hour}
		}, "limit sets either window (a rolling or fixed length) or calendar"),
		Entry("a first weekday for a day", func(p *v1alpha1.RateLimitPolicy) {
			fixed(p, &v1alpha1.CalendarWindow{Unit: v1alpha1.CalendarDay, FirstWeekday: "Sunday"})
		}, "calendar.firstWeekday is only for unit: Week"),
		Entry("a billing day for a week", func(p *v1alpha1.RateLimitPolicy) {
			fixed(p, &v1alpha1.CalendarWindow{Unit: v1alpha1.CalendarWeek, BillingDay: 3})
		}, "calendar.billingDay is only for unit: Month"),
		Entry("a billing day of 32", func(p *v1alpha1.RateLimitPolicy) {
			fixed(p, &v1alpha1.CalendarWindow{Unit: v1alpha1.CalendarMonth, BillingDay: 32})
		}, "should be less than or equal to 31"),
		Entry("a year", func(p *v1alpha1.RateLimitPolicy) {
			fixed(p, &v1alpha1.CalendarWindow{Unit: "Year"})
		}, `supported values: "Day", "Week", "Month"`),
		Entry("a zone name with a space", func(p *v1alpha1.RateLimitPolicy) { fixed(p, day("Europe/Berlin ")) }, "spec.rules[0].limit.calendar.timeZone"),
		Entry("a candidate calendar with SlidingWindowCounter", func(p *v1alpha1.RateLimitPolicy) {
			p.Spec.Rules[0].Candidate = &v1alpha1.CandidateLimit{Limit: v1alpha1.Limit{Requests: 10, Calendar: day("")}}
		}, "candidate.limit.calendar needs algorithm FixedWindow"),
		Entry("a candidate's fixed window over 24h", func(p *v1alpha1.RateLimitPolicy) {
			p.Spec.Rules[0].Candidate = &v1alpha1.CandidateLimit{Algorithm: v1alpha1.FixedWindow,
				Limit: v1alpha1.Limit{Requests: 10, Window: metav1.Duration{Duration: 48 * time.Hour}}}
		}, "candidate.limit.window longer than 24h needs algorithm SlidingWindowCounter"),
	)

	DescribeTable("the API server accepts token budgets and candidates on calendar and long windows",
		func(mutate func(*v1alpha1.RateLimitPolicy)) {
			ns := newNamespace(ctx)
			p := policy(ns, "valid", 100)
			mutate(p)
			Expect(k8s.Create(ctx, p)).To(Succeed())
		},
		Entry("a token budget per day in a zone", func(p *v1alpha1.RateLimitPolicy) {
			fixed(p, day("Europe/Berlin"))
			p.Spec.Rules[0].Cost = &v1alpha1.Cost{From: v1alpha1.CostFromResponse}
		}),
		Entry("a candidate month over a day's quota", func(p *v1alpha1.RateLimitPolicy) {
			fixed(p, day("Asia/Tokyo"))
			p.Spec.Rules[0].Candidate = &v1alpha1.CandidateLimit{Limit: v1alpha1.Limit{Requests: 20000,
				Calendar: &v1alpha1.CalendarWindow{Unit: v1alpha1.CalendarMonth, TimeZone: "Asia/Tokyo"}}}
		}),
		Entry("a candidate rolling week over a per-minute rule", func(p *v1alpha1.RateLimitPolicy) {
			p.Spec.Rules[0].Candidate = &v1alpha1.CandidateLimit{Limit: v1alpha1.Limit{Requests: 5000, Window: metav1.Duration{Duration: 168 * time.Hour}}}
		}),
	)
})
