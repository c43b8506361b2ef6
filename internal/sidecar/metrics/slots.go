package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/redline-dev/redline/internal/limiter"
	"github.com/redline-dev/redline/internal/sidecar/ruleset"
)

// WatchSlots registers the in-flight rules' metrics: their decisions (ObserveSlot), and from
// stats at scrape time the slots this sidecar holds, those lost before their request ended and
// the renewals that failed.
func (m *Metrics) WatchSlots(stats func() limiter.SlotStats) {
	m.slotDecisions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Name: "in_flight_decisions_total",
		Help: "Decisions of in-flight rules by policy, rule and result (allowed: the request took a slot, or its failure mode let it through; refused: the key had as many requests in progress as the rule allows; shadow_refused: the same under mode: Shadow, let through).",
	}, []string{labelPolicy, labelRule, labelResult})
	m.Registry.MustRegister(m.slotDecisions,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: ns, Name: "in_flight_slots",
			Help: "In-flight slots this sidecar holds now: requests of in-flight rules in progress through it.",
		}, func() float64 { return float64(stats().Held) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Namespace: ns, Name: "in_flight_slots_lost_total",
			Help: "In-flight slots lost before their request ended (found expired in Redis at a renewal, or not renewed before their expiry): their requests were ended.",
		}, func() float64 { return float64(stats().Lost) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Namespace: ns, Name: "in_flight_renewal_errors_total",
			Help: "Renewal calls of in-flight slots that failed (one call renews a key's slots); a slot not renewed before its expiry is lost.",
		}, func() float64 { return float64(stats().RenewErrors) }),
	)
}

// ObserveSlot counts one in-flight rule's decision.
func (m *Metrics) ObserveSlot(r *ruleset.Rule, res limiter.SlotResult) {
	if m.slotDecisions == nil {
		return
	}
	result := ResultAllowed
	switch {
	case res.Full && r.Shadow:
		result = ResultShadowRefused
	case !res.Allowed:
		result = ResultRefused
	}
	m.slotDecisions.WithLabelValues(r.Policy.Name, r.Name, result).Inc()
}
