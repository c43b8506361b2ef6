package v1alpha1_test

import (
	"context"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/redline-dev/redline/api/v1alpha1"
)

var _ = Describe("In-flight rules", func() {
	var ctx context.Context
	BeforeEach(func() { ctx = context.Background() })

	DescribeTable("the API server refuses invalid in-flight rules with a message",
		func(mutate func(*v1alpha1.RateLimitPolicy), message string) {
			ns := newNamespace(ctx)
			p := policy(ns, "invalid", 100)
			mutate(p)
			err := k8s.Create(ctx, p)
			Expect(err).To(HaveOccurred())
			Expect(apierrors.IsInvalid(err)).To(BeTrue(), "%v", err)
			Expect(err.Error()).To(ContainSubstring(message))
		},
		Entry("inFlight beside requests and window", func(p *v1alpha1.RateLimitPolicy) {
			p.Spec.Rules[0].Limit.InFlight = ptr.To[int64](4)
		}, "limit sets either requests and window (requests per window) or inFlight (requests in progress at once), not both"),
		Entry("inFlight over its bound", func(p *v1alpha1.RateLimitPolicy) {
			p.Spec.Rules[0].Limit = v1alpha1.Limit{InFlight: ptr.To[int64](100_001)}
		}, "should be less than or equal to 100000"),
		Entry("inFlight with a cost", func(p *v1alpha1.RateLimitPolicy) {
			p.Spec.Rules[0].Limit = v1alpha1.Limit{InFlight: ptr.To[int64](4)}
			p.Spec.Rules[0].Cost = &v1alpha1.Cost{From: v1alpha1.CostFromResponse}
		}, "limit.inFlight cannot go with cost"),
		Entry("inFlight with a candidate", func(p *v1alpha1.RateLimitPolicy) {
			p.Spec.Rules[0].Limit = v1alpha1.Limit{InFlight: ptr.To[int64](4)}
			p.Spec.Rules[0].Candidate = &v1alpha1.CandidateLimit{Limit: v1alpha1.Limit{Requests: 5, Window: metav1.Duration{Duration: time.Minute}}}
		}, "limit.inFlight cannot have a candidate"),
		Entry("a candidate inFlight", func(p *v1alpha1.RateLimitPolicy) {
			p.Spec.Rules[0].Candidate = &v1alpha1.CandidateLimit{Limit: v1alpha1.Limit{InFlight: ptr.To[int64](4)}}
		}, "candidate.limit.inFlight is not supported"),
		Entry("a queue on a limit per window", func(p *v1alpha1.RateLimitPolicy) {
			p.Spec.Rules[0].Limit.Queue = &v1alpha1.InFlightQueue{Size: 4, Timeout: metav1.Duration{Duration: time.Second}}
		}, "limit.queue needs limit.inFlight"),
		Entry("a queue too long to wait", func(p *v1alpha1.RateLimitPolicy) {
			p.Spec.Rules[0].Limit = v1alpha1.Limit{InFlight: ptr.To[int64](4), Queue: &v1alpha1.InFlightQueue{Size: 4, Timeout: metav1.Duration{Duration: time.Hour}}}
		}, "limit.queue.timeout must be between 1ms and 10m"),
		Entry("a queue too large", func(p *v1alpha1.RateLimitPolicy) {
			p.Spec.Rules[0].Limit = v1alpha1.Limit{InFlight: ptr.To[int64](4), Queue: &v1alpha1.InFlightQueue{Size: 10_001, Timeout: metav1.Duration{Duration: time.Second}}}
		}, "should be less than or equal to 10000"),
		Entry("onSlotLost on a limit per window", func(p *v1alpha1.RateLimitPolicy) {
			p.Spec.Rules[0].Limit.OnSlotLost = v1alpha1.SlotLostFinish
		}, "limit.onSlotLost needs limit.inFlight"),
		Entry("onSlotLost on a candidate's limit", func(p *v1alpha1.RateLimitPolicy) {
			p.Spec.Rules[0].Candidate = &v1alpha1.CandidateLimit{Limit: v1alpha1.Limit{Requests: 5, Window: metav1.Duration{Duration: time.Minute}, OnSlotLost: v1alpha1.SlotLostEnd}}
		}, "limit.onSlotLost needs limit.inFlight"),
		Entry("an unknown onSlotLost", func(p *v1alpha1.RateLimitPolicy) {
			p.Spec.Rules[0].Limit = v1alpha1.Limit{InFlight: ptr.To[int64](4), OnSlotLost: "Linger"}
		}, `supported values: "End", "Finish"`),
	)

	DescribeTable("the API server keeps what an in-flight rule does with a lost slot",
		func(limit v1alpha1.Limit, want v1alpha1.SlotLostAction) {
			ns := newNamespace(ctx)
			p := policy(ns, "valid", 100)
			p.Spec.Rules[0].Limit = limit
			Expect(k8s.Create(ctx, p)).To(Succeed())
			got := &v1alpha1.RateLimitPolicy{}
			Expect(k8s.Get(ctx, client.ObjectKeyFromObject(p), got)).To(Succeed())
			Expect(got.Spec.Rules[0].Limit.OnSlotLost).To(Equal(want))
		},
		Entry("left out: End, the default, without writing it", v1alpha1.Limit{InFlight: ptr.To[int64](4)}, v1alpha1.SlotLostAction("")),
		Entry("End", v1alpha1.Limit{InFlight: ptr.To[int64](4), OnSlotLost: v1alpha1.SlotLostEnd}, v1alpha1.SlotLostEnd),
		Entry("Finish beside a queue", v1alpha1.Limit{InFlight: ptr.To[int64](4), OnSlotLost: v1alpha1.SlotLostFinish,
			Queue: &v1alpha1.InFlightQueue{Size: 4, Timeout: metav1.Duration{Duration: time.Second}}}, v1alpha1.SlotLostFinish),
	)
})
