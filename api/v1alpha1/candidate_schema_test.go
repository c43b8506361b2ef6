package v1alpha1_test

import (
	"context"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
)

var _ = Describe("Candidate limits in the schema", func() {
	ctx := context.Background()
	rule := func(algorithm string, candidate map[string]any) map[string]any {
		r := rawRule("1m")
		if algorithm != "" {
			r["algorithm"] = algorithm
		}
		r["candidate"] = candidate
		return r
	}

	DescribeTable("refuses a candidate its algorithm, or the rule's it inherits, cannot enforce",
		func(algorithm string, candidate map[string]any, message string) {
			ns := newNamespace(ctx)
			err := k8s.Create(ctx, rawPolicy(ns, "c", rule(algorithm, candidate)))
			Expect(apierrors.IsInvalid(err)).To(BeTrue(), "%v", err)
			Expect(err.Error()).To(ContainSubstring(message))
		},
		Entry("a burst, inherited SlidingWindowCounter", "",
			map[string]any{"limit": map[string]any{"requests": int64(10), "window": "1m", "burst": int64(20)}},
			"candidate.limit.burst is only valid when the candidate's algorithm"),
		Entry("a burst, its own FixedWindow over the rule's TokenBucket", "TokenBucket",
			map[string]any{"algorithm": "FixedWindow", "limit": map[string]any{"requests": int64(10), "window": "1m", "burst": int64(20)}},
			"candidate.limit.burst is only valid when the candidate's algorithm"),
		Entry("over 10000 with an inherited SlidingWindowLog", "SlidingWindowLog",
			map[string]any{"limit": map[string]any{"requests": int64(20000), "window": "1m"}},
			"candidate.limit.requests must be at most 10000"),
		Entry("a window Go cannot decode", "",
			map[string]any{"limit": map[string]any{"requests": int64(10), "window": "1d"}},
			"limit.window must be a duration"),
		Entry("zero requests", "",
			map[string]any{"limit": map[string]any{"requests": int64(0), "window": "1m"}},
			"candidate.limit.requests"),
		Entry("an unknown algorithm", "",
			map[string]any{"algorithm": "LeakyBucket", "limit": map[string]any{"requests": int64(10), "window": "1m"}},
			"candidate.algorithm"),
	)
})
