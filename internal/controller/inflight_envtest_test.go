package controller_test

import (
	"context"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	v1alpha1 "github.com/redline-dev/redline/api/v1alpha1"
	"github.com/redline-dev/redline/internal/policydoc"
)

var _ = Describe("In-flight rules", func() {
	var ctx context.Context
	BeforeEach(func() { ctx = context.Background() })

	It("accepts an in-flight rule and compiles it beside a limit per window", func() {
		ns := newNamespace(ctx)
		p := policy(ns, "slots", 10)
		slots := p.Spec.Rules[0]
		slots.Name, slots.Limit = "slots", v1alpha1.Limit{InFlight: ptr.To[int64](16), Queue: &v1alpha1.InFlightQueue{Size: 8, Timeout: metav1.Duration{Duration: 30 * time.Second}}}
		p.Spec.Rules = append(p.Spec.Rules, slots)
		Expect(k8s.Create(ctx, p)).To(Succeed())
		expectProgrammed(ctx, ns, "slots")
		Eventually(func(g Gomega) {
			doc, _ := document(g, ctx, ns)
			g.Expect(doc.Policies[0].Rules).To(HaveLen(2))
			g.Expect(doc.Policies[0].Rules[1].InFlight).To(BeEquivalentTo(16))
			g.Expect(doc.Policies[0].Rules[1].Algorithm).To(BeEmpty())
			g.Expect(doc.Policies[0].Rules[1].Queue).To(Equal(&policydoc.Queue{Size: 8, TimeoutMS: 30_000}))
		}, timeout, interval).Should(Succeed())
	})
})
