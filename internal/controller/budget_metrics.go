package controller

import (
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

// The connection budget on the manager's /metrics, for a dashboard to chart the three lines
// together: what Redis allows, what the fleet can open at its largest, what is open now.
var (
	budgetMaxClients = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "redline_redis_maxclients",
		Help: "Redis's maxclients on each master (CONFIG GET, or --redis-maxclients).",
	}, []string{"node"})
	budgetConnected = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "redline_redis_connected_clients",
		Help: "Redis's connected_clients on each master (INFO clients).",
	}, []string{"node"})
	budgetWorstCase = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "redline_redis_connections_worst_case",
		Help: "Connections per Redis node with every injected workload at its maxReplicas and every pod's pool full, plus the manager's.",
	})
	budgetWorkload = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "redline_redis_workload_connections_worst_case",
		Help: "One injected workload's share of the worst case: maxReplicas x pool size.",
	}, []string{labelNamespace, "kind", "name"})
)

func init() {
	metrics.Registry.MustRegister(budgetMaxClients, budgetConnected, budgetWorstCase, budgetWorkload)
}

func recordBudgetMetrics(b budget, nodes []NodeClients) {
	budgetMaxClients.Reset()
	budgetConnected.Reset()
	for _, n := range nodes {
		budgetMaxClients.WithLabelValues(n.Addr).Set(float64(n.MaxClients))
		budgetConnected.WithLabelValues(n.Addr).Set(float64(n.Connected))
	}
	budgetWorstCase.Set(float64(b.WorstCase()))
	budgetWorkload.Reset()
	for _, w := range b.Workloads {
		budgetWorkload.WithLabelValues(w.Ref.Namespace, w.Ref.Kind, w.Ref.Name).Set(float64(w.Connections()))
	}
}
