package controller_test

import (
	"context"
	"net/http"
	"time"

	"github.com/go-logr/logr"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/utils/ptr"

	v1alpha1 "github.com/redline-dev/redline/api/v1alpha1"
	"github.com/redline-dev/redline/internal/calendar"
	"github.com/redline-dev/redline/internal/controller/topkeysstatus"
	"github.com/redline-dev/redline/internal/fleet"
	"github.com/redline-dev/redline/internal/keyscheme"
	"github.com/redline-dev/redline/internal/limiter"
	"github.com/redline-dev/redline/internal/sidecar/decide"
	"github.com/redline-dev/redline/internal/sidecar/ruleset"
)

// usageSidecar is one replica's engine on the suite's Redis, deciding the policies the manager
// compiled into the namespace's ConfigMap, as a sidecar of an app=checkout pod does.
type usageSidecar struct {
	pod    string
	set    *ruleset.Set
	engine *decide.Engine
}

func newUsageSidecar(ctx context.Context, ns, pod string) *usageSidecar {
	GinkgoHelper()
	doc, _ := document(Default, ctx, ns)
	set, err := ruleset.NewBuilder("").Build(doc, map[string]string{"app": "checkout"})
	Expect(err).NotTo(HaveOccurred())
	lim, err := limiter.New(rdb, limiter.Options{LeaseHorizon: -1})
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(lim.Close)
	return &usageSidecar{pod: pod, set: set, engine: &decide.Engine{Limiter: lim}}
}

func (s *usageSidecar) request(key string) *decide.Request {
	return &decide.Request{Method: "GET", Path: "/", Header: http.Header{"X-Key": {key}}, RemoteAddr: "10.0.0.1:1"}
}

// beat publishes the replica's heartbeat with its summaries, as the sidecar's heartbeat does.
func (s *usageSidecar) beat(ctx context.Context) {
	GinkgoHelper()
	_, err := fleet.BeatWithSummaries(ctx, rdb, s.set.Namespace, s.pod, s.set.Hash, suiteTTL, s.set.PolicyNames(), false, s.set.Summaries(time.Second))
	Expect(err).NotTo(HaveOccurred())
}

var _ = Describe("In-flight use and quota use in status", func() {
	It("shows the slots the sidecars hold and who holds them, and how much of the month the top keys used", func(ctx SpecContext) {
		cal, err := calendar.New(calendar.Spec{Unit: calendar.Month, Zone: "Europe/Berlin"})
		Expect(err).NotTo(HaveOccurred())
		if _, end := cal.PeriodMS(time.Now().UnixMilli()); time.Until(time.UnixMilli(end)) < 10*time.Minute {
			Skip("the Berlin month ends within 10 minutes: the counts would straddle two periods")
		}
		ns := newNamespace(ctx)
		p := policy(ns, "api", 10)
		key := []v1alpha1.KeyPart{{Header: "X-Key"}}
		p.Spec.Rules = []v1alpha1.Rule{
			{Name: "slots", Key: key, Limit: v1alpha1.Limit{InFlight: ptr.To[int64](4)}, TopKeys: v1alpha1.TopKeysValues},
			{Name: "monthly", Key: key, Algorithm: v1alpha1.FixedWindow, TopKeys: v1alpha1.TopKeysValues,
				Limit: v1alpha1.Limit{Requests: 20, Calendar: &v1alpha1.CalendarWindow{Unit: v1alpha1.CalendarMonth, TimeZone: "Europe/Berlin"}}},
		}
		Expect(k8s.Create(ctx, p)).To(Succeed())
		expectProgrammed(ctx, ns, "api")
		a, b := newUsageSidecar(ctx, ns, "pod-a"), newUsageSidecar(ctx, ns, "pod-b")

		// Slots: alice holds 2 through a and 1 through b, bob 1 through b.
		var held []*decide.Slots
		for _, take := range []struct {
			s   *usageSidecar
			key string
		}{{a, "alice"}, {a, "alice"}, {b, "alice"}, {b, "bob"}} {
			plan, err := take.s.engine.Plan(take.s.set, take.s.request(take.key), 1)
			Expect(err).NotTo(HaveOccurred())
			sl := take.s.engine.AcquireSlots(ctx, &plan)
			Expect(sl.Refused).To(BeNil())
			held = append(held, sl)
		}
		// The month: alice 12 requests through a and 5 through b, bob 3 through b.
		decideN := func(s *usageSidecar, key string, n int) {
			for range n {
				plan, err := s.engine.Plan(s.set, s.request(key), 1)
				Expect(err).NotTo(HaveOccurred())
				Expect(s.engine.Decide(ctx, &plan).Allowed).To(BeTrue())
			}
		}
		decideN(a, "alice", 12)
		decideN(b, "alice", 5)
		decideN(b, "bob", 3)
		a.beat(ctx)
		b.beat(ctx)

		w := &topkeysstatus.Writer{Client: k8s, Policies: k8s, Backends: suiteBackends, Log: logr.Discard(), RedisTimeout: 5 * time.Second}
		Expect(w.Pass(ctx)[ns]).To(Equal(1))
		st := getPolicy(ctx, ns, "api").Status
		alice, bob := keyscheme.Hash(keyscheme.Key(ns, "api", "slots", "alice")), keyscheme.Hash(keyscheme.Key(ns, "api", "slots", "bob"))
		Expect(st.Rules).To(HaveLen(2))
		f := st.Rules[0].InFlight
		Expect(f).NotTo(BeNil())
		Expect(f.Limit).To(BeEquivalentTo(4))
		Expect(f.Held).To(BeEquivalentTo(4), "summed over the two replicas")
		Expect(f.Peak).To(BeEquivalentTo(4))
		Expect(f.TopHolders).To(Equal([]v1alpha1.TopKey{{Key: alice, Value: "alice", Count: 3}, {Key: bob, Value: "bob", Count: 1}}))
		Expect(f.Use).To(Equal("3 of 4 slots (75.0%)"))
		Expect(st.InFlight).To(Equal("75.0%"))
		Expect(st.Rules[0].Decisions).To(BeEquivalentTo(4))

		q := st.Rules[1].Quota
		Expect(q).NotTo(BeNil())
		Expect(q.Period).To(Equal("Month in Europe/Berlin"))
		_, end := cal.PeriodMS(time.Now().UnixMilli())
		Expect(q.ResetsAt).NotTo(BeNil())
		Expect(q.ResetsAt.Time.Equal(time.UnixMilli(end))).To(BeTrue(), "resets at %v, want %v", q.ResetsAt, time.UnixMilli(end).UTC())
		Expect(q.TopUsers).To(Equal([]v1alpha1.QuotaUser{
			{Key: keyscheme.Hash(keyscheme.Key(ns, "api", "monthly", "alice")), Value: "alice", Used: 17, Share: "85.0%"},
			{Key: keyscheme.Hash(keyscheme.Key(ns, "api", "monthly", "bob")), Value: "bob", Used: 3, Share: "15.0%"},
		}), "the shared count as Redis answered the last decision: the replicas' most, not their sum")
		Expect(q.Used).To(Equal("used 17 of 20 this month (85.0%)"))
		Expect(st.Quota).To(Equal("85.0%"))

		// The slots go back: the next reports say none held, and the month's use stays.
		for _, h := range held {
			h.Release(ctx)
		}
		a.beat(ctx)
		b.beat(ctx)
		Expect(w.Pass(ctx)[ns]).To(Equal(1))
		st = getPolicy(ctx, ns, "api").Status
		Expect(st.Rules[0].InFlight).To(HaveField("Held", BeZero()))
		Expect(st.Rules[0].InFlight.TopHolders).To(BeEmpty())
		Expect(st.InFlight).To(BeEmpty())
		Expect(st.Rules[1].Quota.Used).To(Equal("used 17 of 20 this month (85.0%)"))
	})
})
