package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/redline-dev/redline/internal/limiter"
	"github.com/redline-dev/redline/internal/sidecar/decide"
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
	m.slotsHeld = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: ns, Name: "in_flight",
		Help: "Requests of an in-flight rule in progress through this sidecar now (the slots it holds), by policy and rule: summed over the replicas, what the key's limit bounds.",
	}, []string{labelPolicy, labelRule})
	m.slotsQueued = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: ns, Name: "in_flight_queued",
		Help: "Requests of an in-flight rule waiting in this sidecar for a slot of their full key now, by policy and rule (rules with a queue).",
	}, []string{labelPolicy, labelRule})
	m.slotsLetFinish = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Name: "in_flight_slots_lost_let_finish_total",
		Help: "In-flight slots lost before their request ended, of rules with onSlotLost: Finish, by policy and rule: their requests ran on to their end, no longer counted, so their key may have had more requests in progress than its limit meanwhile.",
	}, []string{labelPolicy, labelRule})
	m.Registry.MustRegister(m.slotDecisions, m.slotsHeld, m.slotsQueued, m.slotsLetFinish,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: ns, Name: "in_flight_slots",
			Help: "In-flight slots this sidecar holds now: requests of in-flight rules in progress through it.",
		}, func() float64 { return float64(stats().Held) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Namespace: ns, Name: "in_flight_slots_lost_total",
			Help: "In-flight slots lost before their request ended (found expired in Redis at a renewal, or not renewed before their expiry): their requests were ended, unless their rule lets them finish (in_flight_slots_lost_let_finish_total).",
		}, func() float64 { return float64(stats().Lost) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Namespace: ns, Name: "in_flight_slots_reasserted_total",
			Help: "In-flight slots a renewal added back because Redis no longer counted them (a failover to a replica that had not received them, a restart) and their key had room: their requests ran on.",
		}, func() float64 { return float64(stats().Reasserted) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Namespace: ns, Name: "in_flight_renewal_errors_total",
			Help: "Renewal calls of in-flight slots that failed (one call renews a key's slots); a slot not renewed before its expiry is lost.",
		}, func() float64 { return float64(stats().RenewErrors) }),
	)
}

// SlotsHeld moves rule r's gauge of requests in progress by delta (decide.Engine.OnSlots).
func (m *Metrics) SlotsHeld(r *ruleset.Rule, delta int) {
	if m.slotsHeld != nil {
		m.slotsHeld.WithLabelValues(r.Policy.Name, r.Name).Add(float64(delta))
	}
}

// SlotsQueued moves rule r's gauge of requests waiting for a slot by delta
// (decide.Engine.OnQueued).
func (m *Metrics) SlotsQueued(r *ruleset.Rule, delta int) {
	if m.slotsQueued != nil {
		m.slotsQueued.WithLabelValues(r.Policy.Name, r.Name).Add(float64(delta))
	}
}

// slotRulesLoaded shows the gauge of requests in progress of every in-flight rule of s, of
// requests waiting for every rule with a queue, and the count of slots let finish of every
// rule with onSlotLost: Finish, at 0 until first used, so that a sidecar
// through which none runs yet says 0 rather than nothing. Those of rules no longer in force
// stay: requests taken under them may still run or wait, and their ends move the gauges back
// to 0.
func (m *Metrics) slotRulesLoaded(s *ruleset.Set) {
	if m.slotsHeld == nil {
		return
	}
	for _, r := range s.InFlight {
		m.slotsHeld.WithLabelValues(r.Policy.Name, r.Name)
		if r.Queue != nil && m.slotsQueued != nil {
			m.slotsQueued.WithLabelValues(r.Policy.Name, r.Name)
		}
		if r.LetFinish && m.slotsLetFinish != nil {
			m.slotsLetFinish.WithLabelValues(r.Policy.Name, r.Name)
		}
	}
}

// SlotLetFinish counts a slot of rule r lost before its request ended, the request let run
// on (decide.Engine.OnLetFinish).
func (m *Metrics) SlotLetFinish(r *ruleset.Rule) {
	if m.slotsLetFinish != nil {
		m.slotsLetFinish.WithLabelValues(r.Policy.Name, r.Name).Inc()
	}
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

// WatchSlotRegistry registers, for one face (FaceCheck, FaceRLS), the slots it keeps for its
// clients to release (a gauge, read at scrape time), and returns the registry's Expired hook:
// slots the sidecar released because their client neither renewed nor released them in time.
func (m *Metrics) WatchSlotRegistry(face string, g *decide.SlotRegistry) func(slots int) {
	expired := prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: ns, Name: "in_flight_leases_expired_total", ConstLabels: prometheus.Labels{labelFace: face},
		Help: "In-flight slots a face kept for its clients (a /v1/check acquire, an Envoy descriptor) that the sidecar released because the client neither renewed nor released them within their lease.",
	})
	m.Registry.MustRegister(expired, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: ns, Name: "in_flight_kept_slots", ConstLabels: prometheus.Labels{labelFace: face},
		Help: "In-flight slots a face keeps now for its clients to release.",
	}, func() float64 {
		_, n := g.Len()
		return float64(n)
	}))
	return func(n int) { expired.Add(float64(n)) }
}

// labelFace names the face of a registry's metrics.
const labelFace = "face"
