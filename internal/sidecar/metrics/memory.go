package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/redline-dev/redline/internal/sidecar/membudget"
)

// WatchMemory exports the memory budget at scrape time: its size, the bytes in use, and the
// requests refused because it was full.
func (m *Metrics) WatchMemory(stats func() membudget.Stats) {
	m.Registry.MustRegister(&memoryCollector{stats: stats})
}

var (
	memorySizeDesc = prometheus.NewDesc(ns+"_memory_budget_bytes",
		"The memory budget of what clients make the sidecar hold (bodies read to size them, open holds and the entries that wait for their settle), in bytes; 0 when unbounded.", nil, nil)
	memoryInUseDesc = prometheus.NewDesc(ns+"_memory_budget_in_use_bytes",
		"Bytes of the memory budget held by requests now.", nil, nil)
	memoryRefusedDesc = prometheus.NewDesc(ns+"_memory_budget_refusals_total",
		"Requests refused because the memory budget had no room for them: 503 with Retry-After on the proxy and /v1/check, OVER_LIMIT with Retry-After on Envoy's rate limit service.", nil, nil)
)

type memoryCollector struct{ stats func() membudget.Stats }

func (c *memoryCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- memorySizeDesc
	ch <- memoryInUseDesc
	ch <- memoryRefusedDesc
}

func (c *memoryCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.stats()
	ch <- prometheus.MustNewConstMetric(memorySizeDesc, prometheus.GaugeValue, float64(s.Size))
	ch <- prometheus.MustNewConstMetric(memoryInUseDesc, prometheus.GaugeValue, float64(s.InUse))
	ch <- prometheus.MustNewConstMetric(memoryRefusedDesc, prometheus.CounterValue, float64(s.Refused))
}
