package controller_test

import (
	"context"
	"fmt"
	"time"

	"github.com/go-logr/logr"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/redis/go-redis/v9"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/redline-dev/redline/api/v1alpha1"
	"github.com/redline-dev/redline/internal/controller/topkeysstatus"
	"github.com/redline-dev/redline/internal/fleet"
	"github.com/redline-dev/redline/internal/topkeys"
)

func hexKey(i int) string { return fmt.Sprintf("%032x", i) }

// beatSummary publishes, as replica pod of policy, a summary of its rule per-api-key:
// decisions, and the keys refused with their counts (and, with candidate, twice as many
// would-refused of the same keys).
func beatSummary(ctx context.Context, ns, policy, pod string, decisions uint64, refused map[int]uint64, candidate bool) {
	const rule = "per-api-key"
	sk := topkeys.New(32)
	for k, n := range refused {
		sk.Add(hexKey(k), n, fmt.Sprint("value-", k))
	}
	snap := sk.Take()
	rs := fleet.RuleSummary{Rule: rule, Decisions: decisions, Refused: fleet.ListFromSnapshot(snap)}
	if candidate {
		l := fleet.ListFromSnapshot(snap)
		l.Total *= 2
		rs.Candidate = &l
	}
	blob := fleet.EncodeSummary(fleet.PolicySummary{IntervalMS: 5000, Rules: []fleet.RuleSummary{rs}})
	_, err := fleet.BeatWithSummaries(ctx, rdb, ns, pod, "hash", suiteTTL, []string{policy}, false, [][]byte{blob})
	Expect(err).NotTo(HaveOccurred())
}

func topKeysPolicy(ns, name string) *v1alpha1.RateLimitPolicy {
	p := policy(ns, name, 100)
	p.Spec.Rules[0].Candidate = &v1alpha1.CandidateLimit{Limit: v1alpha1.Limit{Requests: 50, Window: metav1.Duration{Duration: time.Minute}}}
	p.Spec.Rules = append(p.Spec.Rules, v1alpha1.Rule{
		Name: "global", Key: []v1alpha1.KeyPart{{Constant: "all"}}, Algorithm: v1alpha1.FixedWindow,
		Limit: v1alpha1.Limit{Requests: 1000, Window: metav1.Duration{Duration: time.Minute}},
	})
	return p
}

func getPolicy(ctx context.Context, ns, name string) *v1alpha1.RateLimitPolicy {
	var p v1alpha1.RateLimitPolicy
	Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &p)).To(Succeed())
	return &p
}

var _ = Describe("Top keys in status", func() {
	var ctx context.Context
	var w *topkeysstatus.Writer
	BeforeEach(func() {
		ctx = context.Background()
		w = &topkeysstatus.Writer{Client: k8s, Policies: k8s, Backends: suiteBackends, Log: logr.Discard(), RedisTimeout: 5 * time.Second}
	})

	It("merges every replica's summary per rule, counts a candidate's totals once, and keeps the conditions", func() {
		ns := newNamespace(ctx)
		Expect(k8s.Create(ctx, topKeysPolicy(ns, "shop"))).To(Succeed())
		expectProgrammed(ctx, ns, "shop")
		// Three replicas: key 1 refused by all, key 2 by one, key 3 heavy on one.
		beatSummary(ctx, ns, "shop", "pod-a", 100, map[int]uint64{1: 10, 2: 3}, true)
		beatSummary(ctx, ns, "shop", "pod-b", 100, map[int]uint64{1: 10, 3: 25}, true)
		beatSummary(ctx, ns, "shop", "pod-c", 100, map[int]uint64{1: 10}, true)
		Expect(w.Pass(ctx)[ns]).To(Equal(1))

		p := getPolicy(ctx, ns, "shop")
		Expect(p.Status.Rules).To(HaveLen(2))
		r := p.Status.Rules[0]
		Expect(r.Name).To(Equal("per-api-key"))
		Expect(r.Replicas).To(BeEquivalentTo(3))
		Expect(r.Decisions).To(BeEquivalentTo(300))
		Expect(r.Refused).To(BeEquivalentTo(58))
		Expect(r.Interval.Duration).To(Equal(5 * time.Second))
		Expect(r.TopRefused).To(Equal([]v1alpha1.TopKey{{Key: hexKey(1), Count: 30}, {Key: hexKey(3), Count: 25}, {Key: hexKey(2), Count: 3}}),
			"merged across replicas, heaviest first, no value without the opt-in")
		Expect(r.Candidate).NotTo(BeNil())
		Expect(r.Candidate.Limit).To(Equal("50/1m0s SlidingWindowCounter"))
		Expect(r.Candidate.WouldRefuse).To(BeEquivalentTo(116))
		Expect(r.Candidate.WouldRefuseRatio).To(Equal("38.7%"))
		Expect(r.Candidate.WouldRefuseTotal).To(BeEquivalentTo(116))
		Expect(r.Candidate.DecisionsTotal).To(BeEquivalentTo(300))
		Expect(p.Status.Rules[1]).To(And(
			HaveField("Name", "global"), HaveField("Decisions", BeZero()), HaveField("Candidate", BeNil())))
		Expect(p.Status.Refused).To(Equal("19.3%"))
		Expect(meta.IsStatusConditionTrue(p.Status.Conditions, v1alpha1.ConditionProgrammed)).To(BeTrue(), "the namespace reconciler's conditions stay")
		Expect(meta.FindStatusCondition(p.Status.Conditions, v1alpha1.ConditionTopKeys)).To(HaveField("Reason", "Merged"))

		// The same summaries read again: nothing to write, nothing counted twice.
		Expect(w.Pass(ctx)[ns]).To(BeZero())
		Expect(getPolicy(ctx, ns, "shop").Status.Rules[0].Candidate.WouldRefuseTotal).To(BeEquivalentTo(116))
		// One replica's next interval: the totals grow by it alone.
		beatSummary(ctx, ns, "shop", "pod-a", 100, map[int]uint64{1: 5}, true)
		Expect(w.Pass(ctx)[ns]).To(Equal(1))
		c := getPolicy(ctx, ns, "shop").Status.Rules[0].Candidate
		Expect(c.WouldRefuse).To(BeEquivalentTo(100))
		Expect(c.WouldRefuseTotal).To(BeEquivalentTo(126))
		Expect(c.DecisionsTotal).To(BeEquivalentTo(400))
		since := c.Since

		// Values leave only with the opt-in; a changed candidate starts counting again.
		Eventually(func() error {
			p := getPolicy(ctx, ns, "shop")
			p.Spec.Rules[0].TopKeys = v1alpha1.TopKeysValues
			p.Spec.Rules[0].Candidate.Limit.Requests = 40
			return k8s.Update(ctx, p)
		}, timeout, interval).Should(Succeed())
		time.Sleep(1100 * time.Millisecond) // since has a resolution of seconds
		Expect(w.Pass(ctx)[ns]).To(Equal(1))
		r = getPolicy(ctx, ns, "shop").Status.Rules[0]
		Expect(r.TopRefused[0]).To(Equal(v1alpha1.TopKey{Key: hexKey(1), Value: "value-1", Count: 25}))
		Expect(r.Candidate.Limit).To(Equal("40/1m0s SlidingWindowCounter"))
		Expect(r.Candidate.Since.After(since.Time)).To(BeTrue(), "since %v, before %v", r.Candidate.Since, since)
		Expect(r.Candidate.WouldRefuseTotal).To(BeZero(), "counted again from the change: no summary newer than the last merge")
	})

	It("writes at most 16 policies of a namespace per pass, the least recently written first", func() {
		ns := newNamespace(ctx)
		const n = 20
		for i := range n {
			Expect(k8s.Create(ctx, topKeysPolicy(ns, fmt.Sprint("p", i)))).To(Succeed())
		}
		for i := range n {
			expectProgrammed(ctx, ns, fmt.Sprint("p", i))
			beatSummary(ctx, ns, fmt.Sprint("p", i), "pod-a", 10, map[int]uint64{i: 1}, false)
		}
		Expect(w.Pass(ctx)[ns]).To(Equal(topkeysstatus.DefaultNamespaceWrites))
		Expect(w.Pass(ctx)[ns]).To(Equal(n - topkeysstatus.DefaultNamespaceWrites))
		Expect(w.Pass(ctx)[ns]).To(BeZero())
		for i := range n {
			Expect(getPolicy(ctx, ns, fmt.Sprint("p", i)).Status.Rules[0].TopRefused).To(Equal([]v1alpha1.TopKey{{Key: hexKey(i), Count: 1}}))
		}
	})

	It("says TopKeys False for a group holding what no sidecar wrote, and the namespace reconciler keeps it", func() {
		ns := newNamespace(ctx)
		Expect(k8s.Create(ctx, topKeysPolicy(ns, "forged"))).To(Succeed())
		expectProgrammed(ctx, ns, "forged")
		beatSummary(ctx, ns, "forged", "pod-a", 10, map[int]uint64{1: 4}, false)
		// A tenant's own writes in its group: a live member whose summary is not one.
		group := fleet.GroupKey(ns, "forged")
		Expect(rdb.ZAdd(ctx, group, redis.Z{Score: float64(time.Now().UnixMilli()), Member: "evil"}).Err()).To(Succeed())
		Expect(rdb.Set(ctx, fleet.SummaryKey(ns, "forged", "evil"), `123 {"v":1,"i":1,"r":[{"r":"per-api-key","a":1e30}]}`, time.Minute).Err()).To(Succeed())
		Expect(w.Pass(ctx)[ns]).To(Equal(1))
		p := getPolicy(ctx, ns, "forged")
		Expect(p.Status.Rules[0].TopRefused).To(Equal([]v1alpha1.TopKey{{Key: hexKey(1), Count: 4}}), "the sidecar's summary is merged")
		cond := meta.FindStatusCondition(p.Status.Conditions, v1alpha1.ConditionTopKeys)
		Expect(cond).NotTo(BeNil())
		Expect(cond.Status).To(Equal(metav1.ConditionFalse))
		Expect(cond.Reason).To(Equal(v1alpha1.ReasonInvalidSummaries))
		Expect(cond.Message).To(ContainSubstring("1 top-keys summaries"))
		// The namespace reconciler resyncs every 300 ms here and owns the other conditions.
		Consistently(func() *metav1.Condition {
			return meta.FindStatusCondition(getPolicy(ctx, ns, "forged").Status.Conditions, v1alpha1.ConditionTopKeys)
		}, 2*time.Second, 200*time.Millisecond).Should(HaveField("Reason", v1alpha1.ReasonInvalidSummaries))
	})
})
