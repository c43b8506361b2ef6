// Package metrics exposes the sidecar's Prometheus metrics from its own registry: decisions,
// Redis latency and round trips, the limiter's pre-check, breaker and fallback, and the
// configuration in force.
package metrics

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"

	"github.com/redline-dev/redline/internal/limiter"
	"github.com/redline-dev/redline/internal/redisconn"
	"github.com/redline-dev/redline/internal/sidecar/ruleset"
)

const ns = "redline_sidecar"

// Results of a decision, the values of the result label.
const (
	ResultAllowed       = "allowed"
	ResultRefused       = "refused"
	ResultShadowRefused = "shadow_refused"
	// ResultWouldAdmit and ResultWouldRefuse are the results of a candidate limit's decisions.
	ResultWouldAdmit  = "would_admit"
	ResultWouldRefuse = "would_refuse"
)

// Label names: a policy, and a Redis shard.
const (
	labelPolicy = "policy"
	labelRule   = "rule"
	labelResult = "result"
	labelShard  = "shard"
)

// Metrics holds the sidecar's collectors.
type Metrics struct {
	// Registry holds every collector; Handler serves it.
	Registry     *prometheus.Registry
	decisions    *prometheus.CounterVec
	candidates   *prometheus.CounterVec
	redisLatency prometheus.Histogram
	reloads      prometheus.Counter
	reloadErrors prometheus.Counter
	configInfo   *prometheus.GaugeVec
	heartbeatErr prometheus.Counter
	redisErrors  *prometheus.CounterVec
	regressions  *prometheus.CounterVec
	restoredUnit *prometheus.CounterVec
	lossSignals  prometheus.Counter
	holds        holdMetrics
	unsized      *prometheus.CounterVec
	// slotDecisions counts in-flight rules' decisions, once WatchSlots registered it.
	slotDecisions *prometheus.CounterVec
	// slotsHeld is the per-rule gauge of slots held, once WatchSlots registered it.
	slotsHeld *prometheus.GaugeVec
	// slotsQueued is the per-rule gauge of requests waiting for a slot, once WatchSlots
	// registered it.
	slotsQueued *prometheus.GaugeVec
	// slotsLetFinish counts, per rule, the slots lost whose request ran on, once WatchSlots
	// registered it.
	slotsLetFinish *prometheus.CounterVec
	policyMu       sync.Mutex
	policies       map[string]bool // the policies whose restoration counters show
}

// New registers the collectors. stats reads the limiter's counters and store the set in force
// at scrape time; either may be nil.
func New(stats func() limiter.Stats, store *ruleset.Store) *Metrics {
	m := &Metrics{
		Registry: prometheus.NewRegistry(),
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Name: "decisions_total",
			Help: "Rule decisions by policy, rule, result (allowed, refused, shadow_refused) and source (redis, precheck, fallback, failopen, failclosed).",
		}, []string{labelPolicy, labelRule, labelResult, "source"}),
		candidates: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Name: "candidate_decisions_total",
			Help: "Decisions of rules' candidate limits (counted beside the rule, never refusing) by policy, rule and result (would_admit, would_refuse).",
		}, []string{labelPolicy, labelRule, labelResult}),
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
		regressions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Name: "counter_regressions_total",
			Help: "Windows this replica found Redis holding less of than it was granted (a failover to a replica that lagged, or a restart without persistence), by policy; each was restored from this replica's share.",
		}, []string{labelPolicy}),
		restoredUnit: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Name: "restored_units_total",
			Help: "Units this replica's shares added back to windows Redis had lost them from, by policy.",
		}, []string{labelPolicy}),
		lossSignals: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Name: "redis_loss_signals_total",
			Help: "Times this replica re-asserted every share because another replica's heartbeat said Redis lost counts, or Redis no longer held this replica's last heartbeat.",
		}),
		redisErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Name: "redis_errors_total",
			Help: "Failed Redis round trips, connection handshakes included, by kind: " +
				"maxclients (Redis refused a new connection), pool_timeout (no free connection in the pool in time), timeout, network, reply (an error reply).",
		}, []string{"kind"}),
	}
	for _, k := range []string{RedisErrMaxClients, RedisErrPoolTimeout, RedisErrTimeout, RedisErrNetwork, RedisErrReply} {
		m.redisErrors.WithLabelValues(k) // every kind shows, at 0, from the start
	}
	m.holds = newHoldMetrics()
	m.Registry.MustRegister(m.holds.collectors()...)
	m.unsized = newUnsizedRefusals()
	m.Registry.MustRegister(m.unsized)
	m.Registry.MustRegister(m.regressions, m.restoredUnit, m.lossSignals)
	m.Registry.MustRegister(m.decisions, m.candidates, m.redisLatency, m.reloads, m.reloadErrors, m.configInfo, m.heartbeatErr, m.redisErrors,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		&limiterCollector{stats: stats, store: store}, &quotaCollector{store: store})
	return m
}

// Handler serves the registry in the Prometheus text format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{Registry: m.Registry})
}

// Observe counts one rule decision, or one decision of a rule's candidate limit.
func (m *Metrics) Observe(r *ruleset.Rule, res limiter.Result) {
	if r.CandidateOf != nil {
		result := ResultWouldAdmit
		if res.OverLimit {
			result = ResultWouldRefuse
		}
		m.candidates.WithLabelValues(r.Policy.Name, r.Name, result).Inc()
		return
	}
	result := ResultAllowed
	switch {
	case res.OverLimit && r.Shadow:
		result = ResultShadowRefused
	case !res.Allowed:
		result = ResultRefused
	}
	m.decisions.WithLabelValues(r.Policy.Name, r.Name, result, res.Source.String()).Inc()
}

// ConfigLoaded records the set now in force. The restoration counters of its policies show
// from then on, at 0, so that the first restoration is an increase a query can see; those of
// policies no longer in force go. Its in-flight rules' gauges show too (slotRulesLoaded).
func (m *Metrics) ConfigLoaded(s *ruleset.Set) {
	m.reloads.Inc()
	m.configInfo.Reset()
	m.configInfo.WithLabelValues(s.Namespace, s.Hash).Set(1)
	m.slotRulesLoaded(s)
	m.policyMu.Lock()
	defer m.policyMu.Unlock()
	now := make(map[string]bool, len(s.Policies))
	for _, p := range s.Policies {
		now[p.Name] = true
		m.regressions.WithLabelValues(p.Name)
		m.restoredUnit.WithLabelValues(p.Name)
	}
	for name := range m.policies {
		if !now[name] {
			m.regressions.DeleteLabelValues(name)
			m.restoredUnit.DeleteLabelValues(name)
		}
	}
	m.policies = now
}

// ReloadFailed counts a refused document.
func (m *Metrics) ReloadFailed() { m.reloadErrors.Inc() }

// Restored records that this replica's shares restored units of a window of policy.
func (m *Metrics) Restored(policy string, units int64) {
	m.regressions.WithLabelValues(policy).Inc()
	m.restoredUnit.WithLabelValues(policy).Add(float64(units))
}

// LossSignalled counts a re-assertion of every share started by a heartbeat.
func (m *Metrics) LossSignalled() { m.lossSignals.Inc() }

// HeartbeatFailed counts a failed heartbeat.
func (m *Metrics) HeartbeatFailed() { m.heartbeatErr.Inc() }

// RedisHook returns a go-redis hook that times every round trip and counts the failed ones.
func (m *Metrics) RedisHook() redis.Hook { return latencyHook{h: m.redisLatency, errs: m.redisErrors} }

type latencyHook struct {
	h    prometheus.Histogram
	errs *prometheus.CounterVec
}

func (latencyHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (l latencyHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		start := time.Now()
		err := next(ctx, cmd)
		l.h.Observe(time.Since(start).Seconds())
		l.count(err)
		return err
	}
}

func (l latencyHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		start := time.Now()
		err := next(ctx, cmds)
		l.h.Observe(time.Since(start).Seconds())
		l.count(err)
		return err
	}
}

func (l latencyHook) count(err error) {
	if k := RedisErrorKind(err); k != "" {
		l.errs.WithLabelValues(k).Inc()
	}
}

// Kinds of failed Redis round trips, the values of redis_errors_total's kind label.
const (
	RedisErrMaxClients  = "maxclients"
	RedisErrPoolTimeout = "pool_timeout"
	RedisErrTimeout     = "timeout"
	RedisErrNetwork     = "network"
	RedisErrReply       = "reply"
)

// RedisErrorKind classifies a round trip's error; "" for none (a nil reply is not an error).
// A connection refused for maxclients fails in its handshake (Redis accepts the socket, answers
// the first command with the error and closes it), which go-redis runs through the same hooks.
func RedisErrorKind(err error) string {
	switch {
	case err == nil || errors.Is(err, redis.Nil):
		return ""
	case errors.Is(err, redis.ErrPoolTimeout):
		return RedisErrPoolTimeout
	case strings.Contains(err.Error(), "max number of clients reached"):
		return RedisErrMaxClients
	}
	if ne, ok := errors.AsType[net.Error](err); ok && ne.Timeout() {
		return RedisErrTimeout
	}
	if _, ok := errors.AsType[redis.Error](err); ok {
		return RedisErrReply
	}
	return RedisErrNetwork
}

// WatchPool exports the Redis client's connections at scrape time: sockets open (what Redis
// counts), dialed and closed for idleness (from conns), go-redis's pool counters, and the pool
// size, the bound the controller's connection budget counts per pod.
func (m *Metrics) WatchPool(client redis.UniversalClient, conns *redisconn.ConnStats, poolSize int) {
	m.Registry.MustRegister(&poolCollector{client: client, conns: conns, size: poolSize})
}

var (
	descConns       = prometheus.NewDesc(ns+"_redis_connections", "Sockets open to Redis now, idle or busy, over all nodes.", nil, nil)
	descConnsMax    = prometheus.NewDesc(ns+"_redis_pool_max_connections", "The pool: most connections per Redis node (--redis-pool-size), a hard bound.", nil, nil)
	descConnsIdle   = prometheus.NewDesc(ns+"_redis_pool_idle_connections", "Idle connections in go-redis's pool (closed sockets included until the pool next looks at them).", nil, nil)
	descConnsDialed = prometheus.NewDesc(ns+"_redis_connections_dialed_total", "Connections opened to Redis, refused ones included.", nil, nil)
	descConnsReaped = prometheus.NewDesc(ns+"_redis_connections_idle_closed_total", "Connections closed after --redis-idle-timeout unused.", nil, nil)
	descNodeChanges = prometheus.NewDesc(ns+"_redis_node_changes_total", "Times the Redis client followed a change of node without a failed call (a Cluster MOVED or a retried node, a new address): in-flight slots are re-asserted after one.", nil, nil)
	descPoolHits    = prometheus.NewDesc(ns+"_redis_pool_hits_total", "Calls that found an idle connection in the pool.", nil, nil)
	descPoolMisses  = prometheus.NewDesc(ns+"_redis_pool_misses_total", "Calls that found no idle connection and dialed or waited.", nil, nil)
	descPoolWaits   = prometheus.NewDesc(ns+"_redis_pool_waits_total", "Calls that waited for a connection: the pool was at its bound.", nil, nil)
	descPoolTimeout = prometheus.NewDesc(ns+"_redis_pool_timeouts_total", "Calls that waited for a connection in vain and were decided by the failure mode.", nil, nil)
)

type poolCollector struct {
	client redis.UniversalClient
	conns  *redisconn.ConnStats
	size   int
}

func (c *poolCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descConns, descConnsMax, descConnsIdle, descConnsDialed, descConnsReaped, descNodeChanges, descPoolHits, descPoolMisses, descPoolWaits, descPoolTimeout} {
		ch <- d
	}
}

func (c *poolCollector) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(descConns, prometheus.GaugeValue, float64(c.conns.Open()))
	ch <- prometheus.MustNewConstMetric(descConnsMax, prometheus.GaugeValue, float64(c.size))
	ch <- prometheus.MustNewConstMetric(descConnsDialed, prometheus.CounterValue, float64(c.conns.Dialed()))
	ch <- prometheus.MustNewConstMetric(descConnsReaped, prometheus.CounterValue, float64(c.conns.Reaped()))
	ch <- prometheus.MustNewConstMetric(descNodeChanges, prometheus.CounterValue, float64(c.conns.NodeChanges()))
	s := c.client.PoolStats()
	ch <- prometheus.MustNewConstMetric(descConnsIdle, prometheus.GaugeValue, float64(s.IdleConns))
	ch <- prometheus.MustNewConstMetric(descPoolHits, prometheus.CounterValue, float64(s.Hits))
	ch <- prometheus.MustNewConstMetric(descPoolMisses, prometheus.CounterValue, float64(s.Misses))
	ch <- prometheus.MustNewConstMetric(descPoolWaits, prometheus.CounterValue, float64(s.WaitCount))
	ch <- prometheus.MustNewConstMetric(descPoolTimeout, prometheus.CounterValue, float64(s.Timeouts))
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
	descLeaseKeys      = prometheus.NewDesc(ns+"_lease_keys", "Keys in the lease table now (at most --lease-keys).", nil, nil)
	descDegraded       = prometheus.NewDesc(ns+"_degraded_decisions_total", "Decisions made by a failure mode because Redis could not answer.", nil, nil)
	descRoundTrips     = prometheus.NewDesc(ns+"_redis_round_trips_total", "Redis round trips made for decisions (pipelines and single commands, NOSCRIPT retries included).", nil, nil)
	descPerDecision    = prometheus.NewDesc(ns+"_redis_round_trips_per_decision", "Redis round trips per Redis decision since start; below 1 when batching merges concurrent decisions.", nil, nil)
	descScriptLoads    = prometheus.NewDesc(ns+"_script_loads_total", "SCRIPT LOADs after NOSCRIPT.", nil, nil)
	descStaleCalls     = prometheus.NewDesc(ns+"_stale_calls_total", "Decisions whose script reached Redis after their deadline and counted nothing (the failure mode decided).", nil, nil)
	descShareKeys      = prometheus.NewDesc(ns+"_share_keys", "Keys whose shares this replica keeps, to restore what Redis loses (at most --share-keys).", nil, nil)
	descUnkeptShares   = prometheus.NewDesc(ns+"_unkept_share_units_total", "Units granted to keys beyond --share-keys: they keep no share, and a Redis losing them cannot be repaired.", nil, nil)
	descReassertions   = prometheus.NewDesc(ns+"_share_reassertions_total", "Re-assertions of every live share (after Redis failed and answered again, a loss seen, or a heartbeat's signal).", nil, nil)
	descHeldCalls      = prometheus.NewDesc(ns+"_restore_held_calls_total", "Decisions the failure mode made because grants of their key waited for the replicas to restore what Redis lost (a heartbeat interval and a second after a restoration).", nil, nil)
	descReassertErrors = prometheus.NewDesc(ns+"_share_reassertion_errors_total", "Re-assertions that could not reach every key; the next one retries.", nil, nil)
	descGivenBack      = prometheus.NewDesc(ns+"_given_back_units_total", "Units a request's other rules counted and gave back because it was refused (a request counts in all the rules it matches or in none).", nil, nil)
	descGiveBackErrors = prometheus.NewDesc(ns+"_give_back_errors_total", "Give-backs of a refused request's units that could not be made (Redis unreachable, its shard's breaker open): those units stay counted until their window ends.", nil, nil)
	descAcked          = prometheus.NewDesc(ns+"_durability_acknowledged_total", "Grants of rules with durability that a replica (Replica) or the append-only file (AppendOnlyFile) acknowledged before they were answered.", nil, nil)
	descUnacked        = prometheus.NewDesc(ns+"_durability_unacknowledged_total", "Grants of rules with durability answered without their acknowledgement, by reason: timeout (none within the rule's timeout), unsupported (WAITAOF before Redis 7.2), error (Redis refused the wait), busy (sent without a wait: a quarter of the Redis pool was waiting already). They stand: the request was admitted.", []string{"reason"}, nil)
	descBreaker        = prometheus.NewDesc(ns+"_breaker_open", "1 while the Redis circuit breaker of some shard is open (see shard_breaker_open).", nil, nil)
	descShardBreaker   = prometheus.NewDesc(ns+"_shard_breaker_open", "1 while the circuit breaker of a Redis shard is open, so that decisions of its keys go to the failure mode, by shard: a Redis Cluster master's address (the cluster's masters, and those a failover replaced until the next prune), all for a standalone Redis or a Sentinel group, other for keys of no known master.", []string{labelShard}, nil)
	descFallback       = prometheus.NewDesc(ns+"_fallback_active", "1 while some shard's breaker is open and some enforced policy falls back to local limits.", nil, nil)
	descReplicas       = prometheus.NewDesc(ns+"_policy_replicas", "Live replicas enforcing a policy, from heartbeats; LocalFallback divides its limit by this.", []string{labelPolicy}, nil)
	descPolicies       = prometheus.NewDesc(ns+"_policies", "Policies of the document in force that select this pod.", nil, nil)
)

func (c *limiterCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descRedisDecisions, descPrecheck, descLeased, descLeaseGrants, descLeaseKeys, descDegraded, descRoundTrips, descPerDecision,
		descScriptLoads, descStaleCalls, descShareKeys, descUnkeptShares, descReassertions, descReassertErrors, descHeldCalls, descGivenBack, descGiveBackErrors, descAcked, descUnacked, descBreaker, descShardBreaker, descFallback, descReplicas, descPolicies} {
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
		ch <- prometheus.MustNewConstMetric(descLeaseKeys, prometheus.GaugeValue, float64(s.LeaseKeys))
		ch <- prometheus.MustNewConstMetric(descDegraded, prometheus.CounterValue, float64(s.DegradedDecisions))
		ch <- prometheus.MustNewConstMetric(descRoundTrips, prometheus.CounterValue, float64(s.Pipelines))
		ch <- prometheus.MustNewConstMetric(descScriptLoads, prometheus.CounterValue, float64(s.ScriptLoads))
		ch <- prometheus.MustNewConstMetric(descStaleCalls, prometheus.CounterValue, float64(s.StaleCalls))
		ch <- prometheus.MustNewConstMetric(descShareKeys, prometheus.GaugeValue, float64(s.ShareKeys))
		ch <- prometheus.MustNewConstMetric(descUnkeptShares, prometheus.CounterValue, float64(s.UnkeptShareUnits))
		ch <- prometheus.MustNewConstMetric(descReassertions, prometheus.CounterValue, float64(s.Reassertions))
		ch <- prometheus.MustNewConstMetric(descReassertErrors, prometheus.CounterValue, float64(s.ReassertErrors))
		ch <- prometheus.MustNewConstMetric(descHeldCalls, prometheus.CounterValue, float64(s.HeldCalls))
		ch <- prometheus.MustNewConstMetric(descGivenBack, prometheus.CounterValue, float64(s.GivenBackUnits))
		ch <- prometheus.MustNewConstMetric(descGiveBackErrors, prometheus.CounterValue, float64(s.GiveBackErrors))
		ch <- prometheus.MustNewConstMetric(descAcked, prometheus.CounterValue, float64(s.AckedGrants))
		for reason, n := range map[string]uint64{limiter.UnackedTimeout: s.Unacked.Timeout, limiter.UnackedUnsupported: s.Unacked.Unsupported, limiter.UnackedError: s.Unacked.Error, limiter.UnackedBusy: s.Unacked.Busy} {
			ch <- prometheus.MustNewConstMetric(descUnacked, prometheus.CounterValue, float64(n), reason)
		}
		per := 0.0
		if s.RedisDecisions > 0 {
			per = float64(s.Pipelines) / float64(s.RedisDecisions)
		}
		ch <- prometheus.MustNewConstMetric(descPerDecision, prometheus.GaugeValue, per)
		ch <- prometheus.MustNewConstMetric(descBreaker, prometheus.GaugeValue, b2f(s.BreakerOpen))
		for _, sh := range s.Shards {
			ch <- prometheus.MustNewConstMetric(descShardBreaker, prometheus.GaugeValue, b2f(sh.Open), sh.Name)
		}
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
