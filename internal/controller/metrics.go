package controller

import (
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

// Collectors are the manager's own collectors, registered on controller-runtime's registry
// (which serves /metrics beside controller-runtime's and Go's): the list the metrics
// reference (internal/docgen) is generated from, so a collector cannot be registered without
// being documented.
var Collectors = []prometheus.Collector{
	policyCondition, policyBypasses, policyPodsWithoutSidecar,
	budgetMaxClients, budgetConnected, budgetWorstCase, budgetWorkload,
	memoryEvictable,
}

func init() { metrics.Registry.MustRegister(Collectors...) }
