package budget

import (
	"github.com/prometheus/client_golang/prometheus"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
)

// The connection budget on the manager's /metrics, for a dashboard to chart the three lines
// together: what Redis allows, what the fleet can open at its largest, what is open now.
var (
	budgetMaxClients = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "redline_redis_maxclients",
		Help: "Redis's maxclients on each master (CONFIG GET, or --redis-maxclients).",
	}, []string{labelBackend, "node"})
	budgetConnected = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "redline_redis_connected_clients",
		Help: "Redis's connected_clients on each master (INFO clients).",
	}, []string{labelBackend, "node"})
	budgetWorstCase = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "redline_redis_connections_worst_case",
		Help: "Connections per Redis node with every injected workload at its maxReplicas and every pod's pool full, plus the manager's, per backend (RedisBackend, or default: the manager's Redis).",
	}, []string{labelBackend})
	budgetWorkload = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "redline_redis_workload_connections_worst_case",
		Help: "One injected workload's share of the worst case: maxReplicas x pool size.",
	}, []string{labelBackend, labelNamespace, "kind", "name"})
)

// labelBackend names the Redis a series is of: a RedisBackend's name, or backend.DefaultLabel;
// labelNamespace the namespace of a workload.
const (
	labelBackend   = "backend"
	labelNamespace = "namespace"
)

// resetBudgetMetrics forgets the last pass's series: backends, nodes and workloads that are
// gone leave none behind.
func resetBudgetMetrics() {
	budgetMaxClients.Reset()
	budgetConnected.Reset()
	budgetWorstCase.Reset()
	budgetWorkload.Reset()
}

func recordBudgetMetrics(backend string, b budget, nodes []NodeClients) {
	for _, n := range nodes {
		budgetMaxClients.WithLabelValues(backend, n.Addr).Set(float64(n.MaxClients))
		budgetConnected.WithLabelValues(backend, n.Addr).Set(float64(n.Connected))
	}
	budgetWorstCase.WithLabelValues(backend).Set(float64(b.WorstCase()))
	for _, w := range b.Workloads {
		budgetWorkload.WithLabelValues(backend, w.Ref.Namespace, w.Ref.Kind, w.Ref.Name).Set(float64(w.Connections()))
	}
}

// Collectors are this loop's collectors, registered on controller-runtime's registry (which
// serves /metrics); the manager's list (controller.Collectors) is the metrics reference's.
var Collectors = []prometheus.Collector{budgetMaxClients, budgetConnected, budgetWorstCase, budgetWorkload}

func init() { ctrlmetrics.Registry.MustRegister(Collectors...) }
