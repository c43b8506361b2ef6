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

var _ = Describe("Token budgets in the schema", func() {
	ctx := context.Background()
	// costRule is a rule of requests per minute under algorithm (the default when ""), with
	// this cost; limit edits the limit.
	costRule := func(algorithm string, requests int64, cost map[string]any) map[string]any {
		r := rawRule("1m")
		r["limit"].(map[string]any)["requests"] = requests
		if algorithm != "" {
			r["algorithm"] = algorithm
		}
		r["cost"] = cost
		return r
	}
	response := func(kv ...any) map[string]any {
		c := map[string]any{"from": "Response"}
		for i := 0; i < len(kv); i += 2 {
			c[kv[i].(string)] = kv[i+1]
		}
		return c
	}
	withBurst := func(r map[string]any, burst int64) map[string]any {
		r["limit"].(map[string]any)["burst"] = burst
		return r
	}

	DescribeTable("accepts and compiles a cost the rule can hold and settle",
		func(rule map[string]any, want policydoc.Cost) {
			ns := newNamespace(ctx)
			u := rawPolicy(ns, "c", rule)
			Expect(k8s.Create(ctx, u)).To(Succeed())
			Expect(decodeAndCompile(Default, u)).To(Succeed())
			Eventually(func(g Gomega) {
				doc := readDocument(g, ctx, ns)
				g.Expect(doc.Policies).To(HaveLen(1))
				g.Expect(doc.Policies[0].Rules[0].Cost).To(HaveValue(Equal(want)))
			}, timeout, interval).Should(Succeed())
		},
		Entry("the algorithm's default, every other default resolved", costRule("", 10_000, response()),
			policydoc.Cost{From: "Response", Usage: "Auto", Header: "redline-cost", DefaultHold: 1000, MinOutput: 1, OnError: "Used", TimeoutMS: 60_000, UnsizedBody: "Refuse"}),
		Entry("a SlidingWindowLog, which holds beside its log", costRule("SlidingWindowLog", 1000, response()),
			policydoc.Cost{From: "Response", Usage: "Auto", Header: "redline-cost", DefaultHold: 1000, MinOutput: 1, OnError: "Used", TimeoutMS: 60_000, UnsizedBody: "Refuse"}),
		Entry("a budget under 1000 holds at most itself", costRule("FixedWindow", 300, response()),
			policydoc.Cost{From: "Response", Usage: "Auto", Header: "redline-cost", DefaultHold: 300, MinOutput: 1, OnError: "Used", TimeoutMS: 60_000, UnsizedBody: "Refuse"}),
		Entry("a TokenBucket holds up to its burst, over requests", withBurst(costRule("TokenBucket", 1000, response("defaultHold", int64(4000))), 5000),
			policydoc.Cost{From: "Response", Usage: "Auto", Header: "redline-cost", DefaultHold: 4000, MinOutput: 1, OnError: "Used", TimeoutMS: 60_000, UnsizedBody: "Refuse"}),
		Entry("every field given", costRule("SlidingWindowCounter", 100_000, response(
			"usage", "Anthropic", "header", "X-Usage-Tokens", "defaultHold", int64(8000), "minOutput", int64(0), "onError", "Zero", "timeout", "5m")),
			policydoc.Cost{From: "Response", Usage: "Anthropic", Header: "x-usage-tokens", DefaultHold: 8000, MinOutput: 0, OnError: "Zero", TimeoutMS: 300_000, UnsizedBody: "Refuse"}),
		Entry("unsized bodies held, as before", costRule("FixedWindow", 300, response("unsizedBody", "Hold")),
			policydoc.Cost{From: "Response", Usage: "Auto", Header: "redline-cost", DefaultHold: 300, MinOutput: 1, OnError: "Used", TimeoutMS: 60_000}),
		Entry("the header only", costRule("FixedWindow", 100, response("usage", "Header", "timeout", "1h")),
			policydoc.Cost{From: "Response", Usage: "Header", Header: "redline-cost", DefaultHold: 100, MinOutput: 1, OnError: "Used", TimeoutMS: 3_600_000}),
	)

	It("fills the defaults in the stored object, and leaves a cost from the request as it was", func() {
		ns := newNamespace(ctx)
		Expect(k8s.Create(ctx, rawPolicy(ns, "budget", costRule("", 10_000, response())))).To(Succeed())
		p := expectProgrammed(ctx, ns, "budget")
		Expect(*p.Spec.Rules[0].Cost).To(Equal(v1alpha1.Cost{
			From: v1alpha1.CostFromResponse, Usage: v1alpha1.UsageAuto, Header: v1alpha1.DefaultCostHeader,
			MinOutput: new(int64(1)), OnError: v1alpha1.OnErrorUsed, Timeout: &metav1.Duration{Duration: time.Minute},
		}), "defaultHold is left to the controller: 1000, or the capacity when smaller")

		// A SlidingWindowLog of 100 requests takes cost: {} (from: Request), whose defaults
		// apply with from: Response only, and compiles to the document a previous sidecar reads.
		Expect(k8s.Create(ctx, rawPolicy(ns, "requests", costRule("SlidingWindowLog", 100, map[string]any{})))).To(Succeed())
		p = expectProgrammed(ctx, ns, "requests")
		Expect(p.Spec.Rules[0].Cost.From).To(Equal(v1alpha1.CostFromRequest))
		Eventually(func(g Gomega) {
			doc := readDocument(g, ctx, ns)
			g.Expect(doc.Policies).To(HaveLen(2))
			g.Expect(doc.Policies[1].Name).To(Equal("requests"))
			g.Expect(doc.Policies[1].Rules[0].Cost).To(BeNil())
		}, timeout, interval).Should(Succeed())
	})
})
