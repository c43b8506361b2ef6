package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/redline-dev/redline/internal/sidecar/ruleset"
)

var descQuotaUsed = prometheus.NewDesc(ns+"_quota_used_ratio",
	"For a rule with a long window (a calendar Day, Week or Month, or a window over 24h), the most any key has used of the current period's limit, as Redis answered this sidecar's decisions (0 to 1, more after a lowered limit), by policy and rule: the heaviest user's share of its quota. Take the max over the replicas.",
	[]string{labelPolicy, labelRule}, nil)

// quotaCollector reads the long windows' heaviest users at scrape time (topkeys.Usage), one
// series per such rule of the set in force: never one per key.
type quotaCollector struct{ store *ruleset.Store }

func (c *quotaCollector) Describe(ch chan<- *prometheus.Desc) { ch <- descQuotaUsed }

func (c *quotaCollector) Collect(ch chan<- prometheus.Metric) {
	if c.store == nil {
		return
	}
	set := c.store.Current()
	if set == nil {
		return
	}
	now := time.Now()
	for _, r := range set.Rules {
		if !r.LongWindow || r.Top == nil || r.Limit.Requests <= 0 {
			continue
		}
		var since int64
		if r.Limit.Calendar == nil {
			since = now.Add(-r.Limit.Window).UnixMilli()
		}
		used := r.Top.Quota.Most(since, now.UnixMilli())
		ch <- prometheus.MustNewConstMetric(descQuotaUsed, prometheus.GaugeValue, float64(used)/float64(r.Limit.Requests), r.Policy.Name, r.Name)
	}
}
