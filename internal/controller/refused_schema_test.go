package controller_test

import (
	"context"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
)

var _ = Describe("refused in the schema", func() {
	ctx := context.Background()

	It("compiles refused: Counted to countRefused, and refuses a value it does not know", func() {
		ns := newNamespace(ctx)
		r := rawRule("1m")
		r["refused"] = "Sometimes"
		err := k8s.Create(ctx, rawPolicy(ns, "bad", r))
		Expect(apierrors.IsInvalid(err)).To(BeTrue(), "%v", err)
		Expect(err.Error()).To(ContainSubstring("refused"))

		r["refused"] = "Counted"
		u := rawPolicy(ns, "counted", r)
		Expect(k8s.Create(ctx, u)).To(Succeed())
		Expect(decodeAndCompile(Default, u)).To(Succeed())
		Eventually(func(g Gomega) {
			doc := readDocument(g, ctx, ns)
			g.Expect(doc.Policies).To(HaveLen(1))
			g.Expect(doc.Policies[0].Rules[0].CountRefused).To(BeTrue())
		}, timeout, interval).Should(Succeed())
	})
})
