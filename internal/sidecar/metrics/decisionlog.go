package metrics

import "github.com/prometheus/client_golang/prometheus"

// WatchDecisionLog exports the decision lines the log's rate bound kept out of the log
// (decide.DecisionLog.Dropped); 0 while the log is off.
func (m *Metrics) WatchDecisionLog(dropped func() int64) {
	m.Registry.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: ns + "_decision_log_dropped_total",
		Help: "Decision log lines not written because the log's rate bound (--decision-log-rate) was reached.",
	}, func() float64 { return float64(dropped()) }))
}
