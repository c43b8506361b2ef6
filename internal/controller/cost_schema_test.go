package controller_test

import (
	"context"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
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
	candidate := func(r map[string]any) map[string]any {
		r["candidate"] = map[string]any{"limit": map[string]any{"requests": int64(10), "window": "1m"}}
		return r
	}

	DescribeTable("refuses a cost the rule cannot hold and settle, saying why",
		func(rule map[string]any, message string) {
			ns := newNamespace(ctx)
			err := k8s.Create(ctx, rawPolicy(ns, "c", rule))
			Expect(apierrors.IsInvalid(err)).To(BeTrue(), "%v", err)
			Expect(err.Error()).To(ContainSubstring(message))
		},
		Entry("a candidate", candidate(costRule("", 10_000, response())),
			"cost.from: Response cannot have a candidate (not supported yet)"),
		Entry("a candidate of its own algorithm", candidate(costRule("FixedWindow", 10_000, response())),
			"cost.from: Response cannot have a candidate"),
		Entry("defaultHold over requests, algorithm inherited", costRule("", 500, response("defaultHold", int64(501))),
			"cost.defaultHold must be at most the limit's capacity"),
		Entry("defaultHold over a TokenBucket's burst", withBurst(costRule("TokenBucket", 5000, response("defaultHold", int64(2001))), 2000),
			"cost.defaultHold must be at most the limit's capacity"),
		Entry("minOutput over requests", costRule("FixedWindow", 500, response("minOutput", int64(501))),
			"cost.minOutput must be at most the limit's capacity"),
		Entry("a zero defaultHold", costRule("", 500, response("defaultHold", int64(0))), "cost.defaultHold"),
		Entry("a negative minOutput", costRule("", 500, response("minOutput", int64(-1))), "cost.minOutput"),
		Entry("a defaultHold over 1e9", costRule("", 1_000_000_000, response("defaultHold", int64(1_000_000_001))), "cost.defaultHold"),
		Entry("a header with a space", costRule("", 500, response("header", "Redline Cost")), "cost.header"),
		Entry("a header with a colon", costRule("", 500, response("header", "Redline-Cost:")), "cost.header"),
		Entry("a header of 65 characters", costRule("", 500, response("header", strings.Repeat("x", 65))), "cost.header"),
		Entry("an empty header", costRule("", 500, response("header", "")), "cost.header"),
		Entry("a timeout of 2h", costRule("", 500, response("timeout", "2h")), "cost.timeout must be between 1s and 1h"),
		Entry("a timeout of 500ms", costRule("", 500, response("timeout", "500ms")), "cost.timeout must be between 1s and 1h"),
		Entry("a timeout in days", costRule("", 500, response("timeout", "1d")), "cost.timeout must be a duration"),
		Entry("an unknown usage", costRule("", 500, response("usage", "Cohere")), "cost.usage"),
		Entry("an unknown source", costRule("", 500, map[string]any{"from": "Body"}), "cost.from"),
		Entry("an unknown onError", costRule("", 500, response("onError", "Half")), "cost.onError"),
		Entry("an unknown unsizedBody", costRule("", 500, response("unsizedBody", "Maybe")), "cost.unsizedBody"),
		Entry("unsizedBody Refuse with usage Header", costRule("", 500, response("usage", "Header", "unsizedBody", "Refuse")),
			"cost.unsizedBody: Refuse cannot go with usage: Header"),
		Entry("refused: Counted", func() map[string]any {
			r := costRule("", 500, response())
			r["refused"] = "Counted"
			return r
		}(), "refused: Counted cannot go with cost.from: Response"),
	)

	It("refuses every header the sidecar may not remove, whatever its case", func() {
		ns := newNamespace(ctx)
		for _, name := range policydoc.ReservedCostHeaders {
			for _, spelling := range []string{name, strings.ToUpper(name)} {
				err := k8s.Create(ctx, rawPolicy(ns, "c", costRule("", 500, response("header", spelling))))
				Expect(apierrors.IsInvalid(err)).To(BeTrue(), "header %s: %v", spelling, err)
				Expect(err.Error()).To(ContainSubstring("cost.header must not be a hop-by-hop or framing field"))
			}
		}
	})

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
