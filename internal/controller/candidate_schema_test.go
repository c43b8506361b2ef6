package controller_test

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

	DescribeTable("accepts and compiles a candidate its algorithm can enforce",
		func(algorithm string, candidate map[string]any) {
			ns := newNamespace(ctx)
			u := rawPolicy(ns, "c", rule(algorithm, candidate))
			Expect(k8s.Create(ctx, u)).To(Succeed())
			Expect(decodeAndCompile(Default, u)).To(Succeed())
		},
		Entry("a burst inherited from a TokenBucket rule", "TokenBucket",
			map[string]any{"limit": map[string]any{"requests": int64(10), "window": "1m", "burst": int64(20)}}),
		Entry("its own TokenBucket under a FixedWindow rule", "FixedWindow",
			map[string]any{"algorithm": "TokenBucket", "limit": map[string]any{"requests": int64(10), "window": "1m", "burst": int64(20)}}),
		Entry("a SlidingWindowCounter candidate of a SlidingWindowLog rule, over 10000", "SlidingWindowLog",
			map[string]any{"algorithm": "SlidingWindowCounter", "limit": map[string]any{"requests": int64(50000), "window": "1m"}}),
	)
})
