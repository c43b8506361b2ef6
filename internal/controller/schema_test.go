package controller_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/redline-dev/redline/api/v1alpha1"
	"github.com/redline-dev/redline/internal/controller/compile"
	"github.com/redline-dev/redline/internal/limiter"
)

// decodeAndCompile decodes what the API server stored as the controller's typed client would,
// and compiles it; every compiled rule must be one the limiter can enforce.
func decodeAndCompile(g Gomega, u *unstructured.Unstructured) error {
	data, err := json.Marshal(u.Object)
	g.Expect(err).NotTo(HaveOccurred())
	var p v1alpha1.RateLimitPolicy
	g.Expect(json.Unmarshal(data, &p)).To(Succeed(), "the API server stored what v1alpha1 cannot decode: %s", data)
	cp, err := compile.Policy(&p)
	if err != nil {
		return err
	}
	for _, r := range cp.Rules {
		lim := limiter.Limit{Algorithm: limiter.Algorithm(r.Algorithm), Requests: r.Requests,
			Window: msDuration(r.WindowMS), Burst: r.Burst}
		g.Expect(lim.Validate()).To(Succeed(), "compiled rule %+v", r)
	}
	return nil
}

var _ = Describe("Schema", func() {
	ctx := context.Background()

	DescribeTable("accepts every Go duration between 1s and 24h, and the controller compiles it",
		func(window string) {
			ns := newNamespace(ctx)
			u := rawPolicy(ns, "p", rawRule(window))
			Expect(k8s.Create(ctx, u)).To(Succeed(), "window %q", window)
			Expect(decodeAndCompile(Default, u)).To(Succeed())
			expectProgrammed(ctx, ns, "p")
		},
		Entry("hours and minutes", "1h30m"), Entry("a fraction", "1.5h"), Entry("a leading dot", ".5h"),
		Entry("a trailing dot", "1.s"), Entry("a plus sign", "+1m"), Entry("24h in ns", "86400000000000ns"),
		Entry("micro sign", "1s500µs"), Entry("Greek mu", "1s500μs"), Entry("us", "1s500us"),
		Entry("leading zeros", "0001s"), Entry("the largest", "24h"), Entry("the smallest", "1000ms"),
	)

	It("bounds SlidingWindowLog's requests, which Redis stores one by one", func() {
		ns := newNamespace(ctx)
		ok := rawRule("1m")
		ok["algorithm"] = "SlidingWindowLog"
		ok["limit"].(map[string]any)["requests"] = int64(v1alpha1.MaxSlidingWindowLogRequests)
		Expect(k8s.Create(ctx, rawPolicy(ns, "largest", ok))).To(Succeed())
		over := rawRule("1m")
		over["algorithm"] = "SlidingWindowLog"
		over["limit"].(map[string]any)["requests"] = int64(v1alpha1.MaxSlidingWindowLogRequests + 1)
		err := k8s.Create(ctx, rawPolicy(ns, "over", over))
		Expect(apierrors.IsInvalid(err)).To(BeTrue(), "%v", err)
		Expect(err.Error()).To(ContainSubstring("limit.requests must be at most 10000 with algorithm SlidingWindowLog"))
		other := rawRule("1m")
		other["limit"].(map[string]any)["requests"] = int64(v1alpha1.MaxRequests)
		Expect(k8s.Create(ctx, rawPolicy(ns, "counter", other))).To(Succeed())
		expectProgrammed(ctx, ns, "largest")
		expectProgrammed(ctx, ns, "counter")
	})

	// The property: whatever a user sends, the API server either refuses it with a message that
	// names the field, or stores an object that decodes into v1alpha1 and compiles (or that the
	// controller marks Accepted=False with its reason). Specs are random from a fixed seed, with
	// every duration and quantity format the API server's parsers are known to take; server-side
	// dry runs keep 600 cases within seconds, and a sample is created for real.
	It("stores only what decodes and compiles, for random specs", func() {
		rng := rand.New(rand.NewPCG(10, 2026))
		ns := newNamespace(ctx)
		var accepted, refused, invalid int
		var sample []*unstructured.Unstructured
		for i := range 600 {
			u := randomPolicy(rng, ns, fmt.Sprintf("p-%d", i))
			orig := u.DeepCopy()
			sent, _ := json.Marshal(u.Object["spec"])
			err := k8s.Create(ctx, u, client.DryRunAll)
			if err != nil {
				refused++
				Expect(apierrors.IsInvalid(err) || apierrors.IsBadRequest(err)).To(BeTrue(), "spec %s: %v", sent, err)
				Expect(err.Error()).To(ContainSubstring("spec."), "spec %s: the message names the field", sent)
				continue
			}
			accepted++
			if cerr := decodeAndCompile(Default, u); cerr != nil {
				invalid++
				Expect(cerr.Error()).To(ContainSubstring("spec."), "spec %s", sent)
			}
			if len(sample) < 8 {
				sample = append(sample, orig)
			}
		}
		GinkgoWriter.Printf("random specs: %d accepted (%d of them Accepted=False), %d refused\n", accepted, invalid, refused)
		Expect(accepted).To(BeNumerically(">", 100))
		Expect(refused).To(BeNumerically(">", 100))
		Expect(invalid).To(BeNumerically(">", 5))

		// Stored for real, each one gets a verdict from the controller.
		for _, u := range sample {
			Expect(k8s.Create(ctx, u)).To(Succeed())
		}
		for _, u := range sample {
			Eventually(func(g Gomega) {
				c := condition(g, ctx, ns, u.GetName(), v1alpha1.ConditionAccepted)
				g.Expect(c.ObservedGeneration).To(Equal(u.GetGeneration()))
				g.Expect(c.Message).NotTo(BeEmpty())
				if c.Status != "True" {
					g.Expect(c.Reason).To(Equal(v1alpha1.ReasonInvalid))
				}
			}, timeout, interval).Should(Succeed())
		}
	})
})

func msDuration(ms int64) time.Duration { return time.Duration(ms) * time.Millisecond }

func pick[T any](rng *rand.Rand, xs ...T) T { return xs[rng.IntN(len(xs))] }

// Each field is valid most of the time, so that accepted and refused specs are both common.
func field[T any](rng *rand.Rand, valid, tricky []T) T {
	if rng.IntN(10) == 0 {
		return pick(rng, tricky...)
	}
	return pick(rng, valid...)
}

// Windows: Go durations, the API server's "duration" format's extras (d, w, words, spaces),
// ISO 8601, other JSON types, and random unit soup.
var (
	validWindows = []any{"1s", "90s", "1m", "1h", "24h", "1h30m", "1.5h", ".5h", "1.h", "+1h", "86400s", "1440m",
		"86400000ms", "86400000000us", "86400000000000ns", "1s1μs", "1s1µs", "0001s"}
	trickyWindows = []any{"500ms", "0.5s", "1d", "1w", "1d2h", "2 days", "1 h", "1D", "1H", "P1D", "PT1H", "1hour",
		"1hr", "60", "0", "-1h", "1h-1m", "1e3s", "1,5h", "1h ", " 1h", "", "9999999999999999999h", "25h", "1y",
		"1mo", "3mins", int64(60), 1.5, true, nil}
)

// Quantities: integers, JSON forms of them a parser might take, and out of range values.
var (
	validQuantities  = []any{int64(1), int64(5), int64(100), int64(10_000), int64(1_000_000_000), 100.0, 1e3}
	trickyQuantities = []any{int64(10_001), int64(1_000_000_001), int64(0), int64(-1), 1.5, 1e20, "100", "1k", "100m", nil}
)

func randomUnit(rng *rand.Rand) string {
	var b strings.Builder
	for range 1 + rng.IntN(3) {
		fmt.Fprintf(&b, "%d%s", rng.IntN(100), pick(rng, "h", "m", "s", "ms", "us", "ns", "d", "w", "y", ""))
	}
	return b.String()
}

func randomPolicy(rng *rand.Rand, ns, name string) *unstructured.Unstructured {
	limit := map[string]any{}
	if w := field(rng, validWindows, trickyWindows); rng.IntN(10) == 0 {
		limit["window"] = randomUnit(rng)
	} else if w != nil {
		limit["window"] = w
	}
	if q := field(rng, validQuantities, trickyQuantities); q != nil {
		limit["requests"] = q
	}
	alg := field(rng, []string{"FixedWindow", "SlidingWindowLog", "SlidingWindowCounter", "TokenBucket", ""}, []string{"LeakyBucket"})
	if alg == "TokenBucket" && rng.IntN(2) == 0 || rng.IntN(20) == 0 {
		limit["burst"] = field(rng, validQuantities, trickyQuantities)
	}
	rule := map[string]any{
		"name": field(rng, []string{"r", "per-key", "a1"}, []string{"Per_Key", "", strings.Repeat("a", 64)}),
		"key": field(rng,
			[]any{[]any{map[string]any{"header": "X-API-Key"}}, []any{map[string]any{"attribute": "RemoteAddress"}}, []any{map[string]any{"constant": "all"}}},
			[]any{[]any{map[string]any{"header": "X-A", "constant": "x"}}, []any{map[string]any{"header": "bad header"}}, []any{}}),
		"limit": limit,
	}
	if alg != "" {
		rule["algorithm"] = alg
	}
	if m := field(rng, []string{"", "Enforce", "Shadow"}, []string{"Log"}); m != "" {
		rule["mode"] = m
	}
	if rng.IntN(3) == 0 {
		m := map[string]any{
			"methods": field(rng, []any{[]any{"GET"}, []any{"GET", "POST"}}, []any{[]any{"FETCH"}, []any{"GET", "GET"}}),
		}
		if rng.IntN(2) == 0 {
			m["pathPrefix"] = field(rng, []string{"/api/", "/"}, []string{"api"})
		} else {
			m["path"] = field[any](rng,
				[]any{map[string]any{"value": "/api"}, map[string]any{"type": "Exact", "value": "/login/"}, map[string]any{"value": "/a%20b"}},
				[]any{map[string]any{"value": "/a/../b"}, map[string]any{"value": "/a/%2E"}, map[string]any{"type": "Regex", "value": "/a"}, map[string]any{}})
		}
		rule["match"] = m
	}
	sel := map[string]any{"matchLabels": map[string]any{"app": field[any](rng, []any{"checkout", ""}, []any{"bad value!", int64(3)})}}
	if rng.IntN(3) == 0 {
		sel["matchExpressions"] = []any{map[string]any{
			"key":      field(rng, []string{"tier"}, []string{"bad key!"}),
			"operator": field(rng, []string{"In", "NotIn", "Exists", "DoesNotExist"}, []string{"Bogus"}),
			"values":   pick(rng, []any{}, []any{"a"}, []any{"a", "b"}),
		}}
	}
	spec := map[string]any{"targetSelector": sel, "rules": []any{rule}}
	if f := field(rng, []string{"", "Open", "Closed", "LocalFallback"}, []string{"Maybe"}); f != "" {
		spec["failureMode"] = f
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": v1alpha1.GroupVersion.String(),
		"kind":       "RateLimitPolicy",
		"metadata":   map[string]any{"namespace": ns, "name": name},
		"spec":       spec,
	}}
}
