// Package metrics exposes the sidecar's Prometheus metrics from its own registry: decisions,
// Redis latency and round trips, the limiter's pre-check, breaker and fallback, and the
// configuration in force.
package metrics

import (
	"context"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"

	"github.com/redline-dev/redline/internal/limiter"
	"github.com/redline-dev/redline/internal/sidecar/ruleset"
)

const ns = "redline_sidecar"

// Results of a decision, the values of the result label.
const (
	ResultAllowed       = "allowed"
	ResultRefused       = "refused"
	ResultShadowRefused = "shadow_refused"
)

// Metrics holds the sidecar's collectors.
type Metrics struct {
	// Registry holds every collector; Handler serves it.
	Registry     *prometheus.Registry
	decisions    *prometheus.CounterVec
	redisLatency prometheus.Histogram
	reloads      prometheus.Counter
	reloadErrors prometheus.Counter
	configInfo   *prometheus.GaugeVec
	heartbeatErr prometheus.Counter
}

// New registers the collectors. stats reads the limiter's counters and store the set in force
// at scrape time; either may be nil.
func New(stats func() limiter.Stats, store *ruleset.Store) *Metrics {
	m := &Metrics{
		Registry: prometheus.NewRegistry(),
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Name: "decisions_total",
			Help: "Rule decisions by policy, rule, result (allowed, refused, shadow_refused) and source (redis, precheck, fallback, failopen, failclosed).",
		}, []string{"policy", "rule", "result", "source"}),
		redisLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: ns, Name: "redis_latency_seconds",
			Help:    "Latency of Redis round trips (one command or one pipeline), errors included.",
			Buckets: prometheus.ExponentialBuckets(0.00005, 2, 12),
		}),
		reloads: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Name: "config_reloads_total", Help: "Policy sets loaded, the first one included.",
		}),
		reloadErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Name: "config_reload_errors_total",
			Help: "Policy documents or labels files refused (each distinct content counted once); the last good set stays in force.",
		}),
		configInfo: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: ns, Name: "config_info", Help: "1 for the hash of the policies document in force.",
		}, []string{"namespace", "hash"}),
		heartbeatErr: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Name: "heartbeat_errors_total", Help: "Heartbeats that Redis did not record.",
		}),
	}
	m.Registry.MustRegister(m.decisions, m.redisLatency, m.reloads, m.reloadErrors, m.configInfo, m.heartbeatErr,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		&limiterCollector{stats: stats, store: store})
	return m
}

// Handler serves the registry in the Prometheus text format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{Registry: m.Registry})
}

// Observe counts one rule decision.
func (m *Metrics) Observe(r *ruleset.Rule, res limiter.Result) {
	result := ResultAllowed
	switch {
	case res.OverLimit && r.Shadow:
		result = ResultShadowRefused
	case !res.Allowed:
		result = ResultRefused
	}
	m.decisions.WithLabelValues(r.Policy.Name, r.Name, result, res.Source.String()).Inc()
}

// ConfigLoaded records the set now in force.
func (m *Metrics) ConfigLoaded(s *ruleset.Set) {
	m.reloads.Inc()
	m.configInfo.Reset()
	m.configInfo.WithLabelValues(s.Namespace, s.Hash).Set(1)
}

// ReloadFailed counts a refused document.
func (m *Metrics) ReloadFailed() { m.reloadErrors.Inc() }

// HeartbeatFailed counts a failed heartbeat.
func (m *Metrics) HeartbeatFailed() { m.heartbeatErr.Inc() }

// RedisHook returns a go-redis hook that times every round trip.
func (m *Metrics) RedisHook() redis.Hook { return latencyHook{h: m.redisLatency} }

type latencyHook struct{ h prometheus.Histogram }

func (latencyHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (l latencyHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		start := time.Now()
		err := next(ctx, cmd)
		l.h.Observe(time.Since(start).Seconds())
		return err
	}
}

func (l latencyHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		start := time.Now()
		err := next(ctx, cmds)
		l.h.Observe(time.Since(start).Seconds())
		return err
	}
}

// limiterCollector reads the limiter's counters at scrape time, so the hot path pays nothing
// for them.
type limiterCollector struct {
	stats func() limiter.Stats
	store *ruleset.Store
}

var (
	descRedisDecisions = prometheus.NewDesc(ns+"_redis_decisions_total", "Decisions answered by a script in Redis.", nil, nil)
	descPrecheck       = prometheus.NewDesc(ns+"_precheck_hits_total", "Refusals repeated from the local pre-check cache without a Redis call.", nil, nil)
	descLeased         = prometheus.NewDesc(ns+"_lease_decisions_total", "Admissions from a lease this sidecar holds: counted in Redis when granted, decided without a call.", nil, nil)
	descLeaseGrants    = prometheus.NewDesc(ns+"_lease_grants_total", "Redis decisions that granted a lease of more than their own cost.", nil, nil)
	descDegraded       = prometheus.NewDesc(ns+"_degraded_decisions_total", "Decisions made by a failure mode because Redis could not answer.", nil, nil)
	descRoundTrips     = prometheus.NewDesc(ns+"_redis_round_trips_total", "Redis round trips made for decisions (pipelines and single commands, NOSCRIPT retries included).", nil, nil)
	descPerDecision    = prometheus.NewDesc(ns+"_redis_round_trips_per_decision", "Redis round trips per Redis decision since start; below 1 when batching merges concurrent decisions.", nil, nil)
	descScriptLoads    = prometheus.NewDesc(ns+"_script_loads_total", "SCRIPT LOADs after NOSCRIPT.", nil, nil)
	descBreaker        = prometheus.NewDesc(ns+"_breaker_open", "1 while the Redis circuit breaker is open.", nil, nil)
	descFallback       = prometheus.NewDesc(ns+"_fallback_active", "1 while the breaker is open and some enforced policy falls back to local limits.", nil, nil)
	descReplicas       = prometheus.NewDesc(ns+"_policy_replicas", "Live replicas enforcing a policy, from heartbeats; LocalFallback divides its limit by this.", []string{"policy"}, nil)
	descPolicies       = prometheus.NewDesc(ns+"_policies", "Policies of the document in force that select this pod.", nil, nil)
)

func (c *limiterCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descRedisDecisions, descPrecheck, descLeased, descLeaseGrants, descDegraded, descRoundTrips, descPerDecision,
		descScriptLoads, descBreaker, descFallback, descReplicas, descPolicies} {
		ch <- d
	}
}

func (c *limiterCollector) Collect(ch chan<- prometheus.Metric) {
	var set *ruleset.Set
	if c.store != nil {
		set = c.store.Current()
	}
	if c.stats != nil {
		s := c.stats()
		ch <- prometheus.MustNewConstMetric(descRedisDecisions, prometheus.CounterValue, float64(s.RedisDecisions))
		ch <- prometheus.MustNewConstMetric(descPrecheck, prometheus.CounterValue, float64(s.PrecheckRefusals))
		ch <- prometheus.MustNewConstMetric(descLeased, prometheus.CounterValue, float64(s.LeaseDecisions))
		ch <- prometheus.MustNewConstMetric(descLeaseGrants, prometheus.CounterValue, float64(s.LeaseGrants))
		ch <- prometheus.MustNewConstMetric(descDegraded, prometheus.CounterValue, float64(s.DegradedDecisions))
		ch <- prometheus.MustNewConstMetric(descRoundTrips, prometheus.CounterValue, float64(s.Pipelines))
		ch <- prometheus.MustNewConstMetric(descScriptLoads, prometheus.CounterValue, float64(s.ScriptLoads))
		per := 0.0
		if s.RedisDecisions > 0 {
			per = float64(s.Pipelines) / float64(s.RedisDecisions)
		}
		ch <- prometheus.MustNewConstMetric(descPerDecision, prometheus.GaugeValue, per)
		ch <- prometheus.MustNewConstMetric(descBreaker, prometheus.GaugeValue, b2f(s.BreakerOpen))
		fallback := false
		if set != nil && s.BreakerOpen {
			for _, p := range set.Policies {
				fallback = fallback || p.FailureMode == limiter.FailureModeLocalFallback || p.FailureMode == ""
			}
		}
		ch <- prometheus.MustNewConstMetric(descFallback, prometheus.GaugeValue, b2f(fallback))
	}
	if set != nil {
		ch <- prometheus.MustNewConstMetric(descPolicies, prometheus.GaugeValue, float64(len(set.Policies)))
		for _, p := range set.Policies {
			ch <- prometheus.MustNewConstMetric(descReplicas, prometheus.GaugeValue, float64(p.Replicas.Load()), p.Name)
		}
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
