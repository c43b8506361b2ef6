package v1alpha1_test

import (
	"context"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

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
})
