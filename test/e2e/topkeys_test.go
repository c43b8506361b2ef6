package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	v1alpha1 "github.com/redline-dev/redline/api/v1alpha1"
	"github.com/redline-dev/redline/internal/fleet"
	"github.com/redline-dev/redline/internal/keyscheme"
	"github.com/redline-dev/redline/internal/testutil/stack"
)

// topKeysPolicy limits each client of prefix to 20 a day, with a candidate of 10 a day beside
// it; report says how its top keys leave the sidecars.
func topKeysPolicy(name, prefix string, report v1alpha1.TopKeysReport) *v1alpha1.RateLimitPolicy {
	p := policy(name, prefix, v1alpha1.SlidingWindowCounter, 20, v1alpha1.FailureModeLocalFallback)
	p.Spec.Rules[0].TopKeys = report
	p.Spec.Rules[0].Candidate = &v1alpha1.CandidateLimit{Limit: v1alpha1.Limit{Requests: 10, Window: metav1.Duration{Duration: 24 * time.Hour}}}
	return p
}

// keyHash is how status names a key of the suite's one-rule policies.
func keyHash(policy, key string) string {
	return keyscheme.Hash(keyscheme.Key(namespace, policy, "per-client", key))
}

var _ = Describe("Who is limited", func() {
	It("names the 5 heavy hitters of 1,000 keys across three replicas in the policies' status, by value only where the rule opts in", func(ctx SpecContext) {
		hashed := topKeysPolicy("topkeys-hashed", "/topkeys/hashed/", "")
		values := topKeysPolicy("topkeys-values", "/topkeys/values/", v1alpha1.TopKeysValues)
		for _, p := range []*v1alpha1.RateLimitPolicy{hashed, values} {
			Expect(st.ApplyPolicy(ctx, p)).To(Succeed())
			DeferCleanup(func(ctx SpecContext) { Expect(client.IgnoreNotFound(st.Client.Delete(ctx, p))).To(Succeed()) })
		}
		for _, p := range []*v1alpha1.RateLimitPolicy{hashed, values} {
			Eventually(func(g Gomega) {
				var got v1alpha1.RateLimitPolicy
				g.Expect(st.Client.Get(ctx, client.ObjectKeyFromObject(p), &got)).To(Succeed())
				c := meta.FindStatusCondition(got.Status.Conditions, v1alpha1.ConditionEnforced)
				g.Expect(c).NotTo(BeNil())
				g.Expect(c.Status).To(Equal(metav1.ConditionTrue), "%s: %s", c.Reason, c.Message)
			}).WithContext(ctx).WithTimeout(time.Minute).WithPolling(200 * time.Millisecond).Should(Succeed())
		}

		// 995 light keys, one request each per round (under the limit of 20 and the
		// candidate's 10 for the whole spec), and 5 heavy ones, 60 each per round: 40 refused,
		// 50 that the candidate would have refused. The key values are what must not leak.
		run := fmt.Sprint(time.Now().UnixNano())
		light := func(i int) string { return fmt.Sprintf("light-%03d-%s", i, run) }
		heavy := make([]string, 5)
		for i := range heavy {
			heavy[i] = fmt.Sprintf("heavy-secret-%d-%s", i, run)
		}
		round := func(ctx context.Context, prefix string) stack.Tally {
			const perHeavy = 60
			return stack.Send(ctx, proxies, 995+len(heavy)*perHeavy, 16, func(i int) stack.Request {
				key := ""
				if i < 995 {
					key = light(i)
				} else {
					key = heavy[(i-995)%len(heavy)]
				}
				return stack.Request{Path: prefix + "item", Header: http.Header{keyHeader: {key}}}
			})
		}
		// Traffic goes on until the status names them: a summary counts one heartbeat interval.
		traffic, stop := context.WithCancel(ctx)
		var wg sync.WaitGroup
		var rounds int
		start := time.Now()
		wg.Go(func() {
			defer GinkgoRecover()
			for rounds < 9 && traffic.Err() == nil {
				for _, p := range []*v1alpha1.RateLimitPolicy{hashed, values} {
					t := round(traffic, p.Spec.Rules[0].Match.Path.Value)
					if traffic.Err() == nil {
						Expect(t.Failed).To(BeZero(), t.FirstFailure)
					}
				}
				rounds++
			}
		})
		defer func() { stop(); wg.Wait() }()

		want := map[string][]string{}
		for _, p := range []*v1alpha1.RateLimitPolicy{hashed, values} {
			for _, k := range heavy {
				want[p.Name] = append(want[p.Name], keyHash(p.Name, k))
			}
			slices.Sort(want[p.Name])
		}
		named := map[string]time.Duration{}
		explained := false
		Eventually(func(g Gomega) {
			for _, p := range []*v1alpha1.RateLimitPolicy{hashed, values} {
				var got v1alpha1.RateLimitPolicy
				g.Expect(st.Client.Get(ctx, client.ObjectKeyFromObject(p), &got)).To(Succeed())
				g.Expect(got.Status.Rules).To(HaveLen(1), "%s: status.rules", p.Name)
				r := got.Status.Rules[0]
				var keys, cand []string
				for _, k := range r.TopRefused {
					keys = append(keys, k.Key)
					if p == values {
						g.Expect(heavy).To(ContainElement(k.Value), "%s: the value of %s", p.Name, k.Key)
					} else {
						g.Expect(k.Value).To(BeEmpty(), "%s: a value without the opt-in", p.Name)
					}
					g.Expect(k.Count).To(BeNumerically(">", 0))
				}
				g.Expect(r.Candidate).NotTo(BeNil())
				for _, k := range r.Candidate.TopRefused {
					cand = append(cand, k.Key)
				}
				slices.Sort(keys)
				slices.Sort(cand)
				g.Expect(keys).To(Equal(want[p.Name]), "%s: topRefused %+v", p.Name, r.TopRefused)
				g.Expect(cand).To(Equal(want[p.Name]), "%s: candidate.topRefused %+v", p.Name, r.Candidate.TopRefused)
				g.Expect(r.Replicas).To(BeEquivalentTo(replicas), "%s: summaries of every replica", p.Name)
				g.Expect(r.Candidate.WouldRefuse).To(BeNumerically(">", r.Refused), "%s: a candidate at half the limit would refuse more", p.Name)
				g.Expect(got.Status.Refused).NotTo(BeEmpty())
				c := meta.FindStatusCondition(got.Status.Conditions, v1alpha1.ConditionTopKeys)
				g.Expect(c).NotTo(BeNil())
				g.Expect(c.Reason).To(Equal("Merged"), c.Message)
				if _, ok := named[p.Name]; !ok {
					named[p.Name] = time.Since(start)
				}
				if p == hashed && !explained {
					// Why was heavy[0] refused? The plugin finds its hash among the top
					// refused, from the sidecar's own matching and keys; a light key is not.
					out := runKubectlRedline(g, ctx, "explain", "-n", namespace, "--pod", sidecars[0].Pod.Name,
						"-X", "GET", "-H", keyHeader+": "+heavy[0], p.Spec.Rules[0].Match.Path.Value+"item")
					g.Expect(out).To(MatchRegexp(`(?m)^%s\s+per-client\s+yes\s+Enforce\s+20/24h0m0s SlidingWindowCounter\s+%s\s+yes \(\d+ refused in the last interval\)`, p.Name, keyHash(p.Name, heavy[0])), out)
					g.Expect(out).To(MatchRegexp(`(?m)^%s\s+per-client \(candidate\)\s+yes\s+Shadow\s+10/24h0m0s SlidingWindowCounter\s+[0-9a-f]{32}\s+yes`, p.Name), out)
					g.Expect(out).To(MatchRegexp(`(?m)^%s\s+per-client\s+no\s`, values.Name), "another path: not matched\n%s", out)
					out = runKubectlRedline(g, ctx, "explain", "-n", namespace, "--pod", sidecars[0].Pod.Name, "-H", keyHeader+": "+light(1), p.Spec.Rules[0].Match.Path.Value+"item")
					g.Expect(out).To(MatchRegexp(`(?m)^%s\s+per-client\s+yes\s+Enforce\s+\S+ \S+\s+%s\s+no$`, p.Name, keyHash(p.Name, light(1))), out)
					out = runKubectlRedline(g, ctx, "status", "-n", namespace, p.Name)
					g.Expect(out).To(ContainSubstring("refused most: " + keyHash(p.Name, heavy[0])))
					g.Expect(out).To(MatchRegexp(`(?m)^\s+Enforced\s+True\s+Enforced\s`))
					g.Expect(out).NotTo(ContainSubstring(heavy[0]), "a hashed rule's values never shown")
					explained = true
				}
			}
		}).WithContext(ctx).WithTimeout(2 * time.Minute).WithPolling(250 * time.Millisecond).Should(Succeed())
		Expect(explained).To(BeTrue(), "kubectl redline explain found the heavy key among the top refused")
		stop()
		wg.Wait()
		GinkgoWriter.Printf("status named the 5 heavy hitters of 1,000 keys after %v (hashed) and %v (values), %d rounds of traffic; publish interval %v\n",
			named[hashed.Name].Round(100*time.Millisecond), named[values.Name].Round(100*time.Millisecond), rounds, fleet.DefaultInterval)

		// Without the opt-in, no key value leaves a sidecar: not in status, metrics or logs.
		var got v1alpha1.RateLimitPolicy
		Expect(st.Client.Get(ctx, client.ObjectKeyFromObject(hashed), &got)).To(Succeed())
		status, err := json.Marshal(got.Status)
		Expect(err).NotTo(HaveOccurred())
		for _, sc := range sidecars {
			res, err := http.Get(sc.AdminURL + "/metrics")
			Expect(err).NotTo(HaveOccurred())
			metrics, err := io.ReadAll(res.Body)
			_ = res.Body.Close()
			Expect(err).NotTo(HaveOccurred())
			logs, err := os.ReadFile(sc.Proc.LogPath)
			Expect(err).NotTo(HaveOccurred())
			for _, k := range heavy {
				Expect(string(status)).NotTo(ContainSubstring(k), "the hashed policy's status")
				Expect(string(metrics)).NotTo(ContainSubstring(k), "%s's metrics", sc.Pod.Name)
				Expect(string(logs)).NotTo(ContainSubstring(k), "%s's log", sc.Pod.Name)
				Expect(string(metrics)).NotTo(ContainSubstring(strings.TrimSuffix(k, run)), "%s's metrics", sc.Pod.Name)
			}
		}
		// Candidates count in their own metric, beside the rule's.
		Expect(sumMetric(Default, ctx, "redline_sidecar_candidate_decisions_total", map[string]string{"policy": hashed.Name, "result": "would_refuse"})).To(BeNumerically(">", 0))

		// kubectl get shows the share refused.
		Expect(got.Status.Refused).To(MatchRegexp(`^[0-9.]+%$`))
		var shown v1alpha1.RateLimitPolicy
		Expect(st.Client.Get(ctx, client.ObjectKeyFromObject(values), &shown)).To(Succeed())
		out, err := yaml.Marshal(shown.Status)
		Expect(err).NotTo(HaveOccurred())
		GinkgoWriter.Printf("status of %s:\n%s", values.Name, out)
	}, SpecTimeout(4*time.Minute))
})
