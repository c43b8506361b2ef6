package v1alpha1_test

import (
	"context"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
)

var _ = Describe("Schema", func() {
	ctx := context.Background()

	DescribeTable("refuses windows Go cannot decode, saying what to write",
		func(window string) {
			ns := newNamespace(ctx)
			err := k8s.Create(ctx, rawPolicy(ns, "p", rawRule(window)))
			Expect(apierrors.IsInvalid(err)).To(BeTrue(), "window %q: %v", window, err)
			Expect(err.Error()).To(ContainSubstring("write 24h for 1d"))
		},
		Entry("days", "1d"), Entry("weeks", "1w"), Entry("days and hours", "1d2h"),
		Entry("a space", "1 h"), Entry("ISO 8601", "PT1H"), Entry("upper case unit", "1H"),
		Entry("a word", "1hour"), Entry("no unit", "60"), Entry("years", "1y"), Entry("a comma", "1,5h"),
		Entry("an exponent", "1e3s"),
	)

	DescribeTable("refuses windows out of range or unparseable",
		func(window string) {
			ns := newNamespace(ctx)
			err := k8s.Create(ctx, rawPolicy(ns, "p", rawRule(window)))
			Expect(apierrors.IsInvalid(err)).To(BeTrue(), "window %q: %v", window, err)
			Expect(err.Error()).To(ContainSubstring("limit.window"))
		},
		Entry("negative", "-1h"), Entry("zero", "0"), Entry("over 744h in seconds", "2678401s"),
		Entry("overflowing int64", "9999999999999999h"), Entry("too long", "1h0m0s0ms0us0ns00000s"),
	)
})
