package controller_test

import (
	"context"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
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
