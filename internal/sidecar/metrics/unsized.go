package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/redline-dev/redline/internal/sidecar/ruleset"
)

func newUnsizedRefusals() *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Name: "unsized_refusals_total",
		Help: "Requests refused by a token budget because they could not be sized (cost.unsizedBody: Refuse; a gRPC call always, as grpc_not_sized), by policy, rule and reason (unknown_api_path, body_compressed, body_too_large, body_too_slow, body_unreadable, body_not_json, body_not_of_api_shape, number_not_understood, input_not_priced, grpc_not_sized; reserve_without_size on the decision API, descriptor_without_size on Envoy's).",
	}, []string{labelPolicy, labelRule, "reason"})
}

// UnsizedRefused counts one request refused by rule r because it could not be sized.
func (m *Metrics) UnsizedRefused(r *ruleset.Rule, reason string) {
	m.unsized.WithLabelValues(r.Policy.Name, r.Name, reason).Inc()
}
