package metrics

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/redline-dev/redline/internal/limiter"
	"github.com/redline-dev/redline/internal/sidecar/decide"
	"github.com/redline-dev/redline/internal/sidecar/ruleset"
)

// Results of a hold's settle, the values of the result label of hold_settles_total.
const (
	// SettleSettled: the request's usage settled its hold (the unused part went back, an
	// excess became debt).
	SettleSettled = "settled"
	// SettleExpired: the hold's deadline had passed before the settle (its units stayed
	// spent); the settle charged as a timely one would.
	SettleExpired = "expired"
	// SettleFailed: the settle did not reach Redis; the hold stays counted until its window
	// ends, and what the request used beyond it is not counted.
	SettleFailed = "failed"
)

// Faces that keep holds for a later settle, and why a hold found no room: the values of the
// labels of hold_registry_refusals_total.
const (
	FaceCheck = "check"
	FaceRLS   = "rls"
	// RoomKeyShare: the request's key had its share of open holds.
	RoomKeyShare = "key_share"
	// RoomFull: the registry was full of open holds.
	RoomFull = "full"
	// RoomMemory: the sidecar's memory budget had no room for the hold (it counts in
	// memory_budget_refusals_total too).
	RoomMemory = "memory"
)

// holdMetrics are the token budgets' counters, by policy and rule.
type holdMetrics struct {
	settles  *prometheus.CounterVec
	returned *prometheus.CounterVec
	debt     *prometheus.CounterVec
	noRoom   *prometheus.CounterVec
}

func newHoldMetrics() holdMetrics {
	return holdMetrics{
		settles: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Name: "hold_settles_total",
			Help: "Settles of token budget holds by policy, rule and result (settled; expired: the settle came after the hold's deadline, when its units stayed spent, and charged as a timely one; failed: Redis was not reached and the hold stays counted until its window ends).",
		}, []string{labelPolicy, labelRule, labelResult}),
		returned: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Name: "hold_returned_units_total",
			Help: "Units of token budget holds given back at their settle (held, not used), by policy and rule.",
		}, []string{labelPolicy, labelRule}),
		debt: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Name: "debt_units_total",
			Help: "Units responses used beyond their hold (an upstream that ignored the output cap, an input the estimate did not see, or a cost header over it), in full, charged past the limit as debt, by policy and rule: the key is refused until it is repaid.",
		}, []string{labelPolicy, labelRule}),
		noRoom: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Name: "hold_registry_refusals_total",
			Help: "Requests of token budgets refused because their holds found no room to wait for their settle, by face (check: /v1/check's reserve, rls: Envoy's apply_on_stream_done) and reason (key_share: the key had its share of open holds; full: the sidecar had its most open holds; memory: the sidecar's memory budget had no room for it). The hold went back; the request was not admitted.",
		}, []string{"face", "reason"}),
	}
}

func (h holdMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{h.settles, h.returned, h.debt, h.noRoom}
}

// RegistryRefused returns what counts the refusals of face's hold registry
// (decide.Registry.Refused).
func (m *Metrics) RegistryRefused(face string) func(error) {
	share, full, memory := m.holds.noRoom.WithLabelValues(face, RoomKeyShare), m.holds.noRoom.WithLabelValues(face, RoomFull),
		m.holds.noRoom.WithLabelValues(face, RoomMemory)
	return func(err error) {
		switch {
		case errors.Is(err, decide.ErrKeyShareFull):
			share.Inc()
		case errors.Is(err, decide.ErrNoMemory):
			memory.Inc()
		default:
			full.Inc()
		}
	}
}

// Settled counts one settle of a hold of rule r (decide.Engine.ObserveSettle).
func (m *Metrics) Settled(r *ruleset.Rule, s limiter.Settled, err error) {
	result := SettleSettled
	switch {
	case err != nil:
		result = SettleFailed
	case s.Expired:
		result = SettleExpired
	}
	m.holds.settles.WithLabelValues(r.Policy.Name, r.Name, result).Inc()
	if s.Returned > 0 {
		m.holds.returned.WithLabelValues(r.Policy.Name, r.Name).Add(float64(s.Returned))
	}
	if s.Debt > 0 {
		m.holds.debt.WithLabelValues(r.Policy.Name, r.Name).Add(float64(s.Debt))
	}
}
