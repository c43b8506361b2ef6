{{/* Redline's alerts. Each threshold is a value under monitoring.prometheusRule; each alert has
a runbook line. test/helm renders this with the default values and runs promtool check rules
and promtool test rules on it (testdata/alerts_test.yaml: every alert fires, and stays quiet). */}}
{{- define "redline.prometheusRule" -}}
{{- $r := .Values.monitoring.prometheusRule -}}
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata:
  name: redline
  namespace: {{ .Release.Namespace }}
  labels:
    {{- include "redline.labels" . | nindent 4 }}
    {{- with $r.labels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
spec:
  groups:
  - name: redline-sidecars
    rules:
    - alert: RedlineLocalFallback
      expr: |
        sum by (namespace) (rate(redline_sidecar_decisions_total{source="fallback"}[5m]))
          / sum by (namespace) (rate(redline_sidecar_decisions_total[5m])) > {{ $r.fallbackRatio }}
      for: {{ $r.for }}
      labels: {severity: warning}
      annotations:
        summary: {{ quote `Sidecars in {{ $labels.namespace }} enforce limits locally (Redis unreachable).` }}
        description: {{ quote `{{ $value | humanizePercentage }} of decisions in {{ $labels.namespace }} come from the local fallback: each replica admits limit / live replicas, so the shared limit is approximate.` }}
        runbook: "Check Redis (redline_sidecar_redis_errors_total by kind, redline_sidecar_breaker_open); the sidecars return to Redis by themselves once it answers."
    - alert: RedlineFailingOpen
      expr: |
        sum by (namespace) (rate(redline_sidecar_decisions_total{source="failopen"}[5m]))
          / sum by (namespace) (rate(redline_sidecar_decisions_total[5m])) > {{ $r.failOpenRatio }}
      for: {{ $r.for }}
      labels: {severity: critical}
      annotations:
        summary: {{ quote `Sidecars in {{ $labels.namespace }} admit requests without limiting (failure mode Open).` }}
        description: {{ quote `{{ $value | humanizePercentage }} of decisions in {{ $labels.namespace }} were admitted because Redis could not answer.` }}
        runbook: "Redis is down or too slow for the sidecars' --redis-timeout: restore it, or set failureMode LocalFallback on policies that must keep a bound."
    - alert: RedlineFailingClosed
      expr: |
        sum by (namespace) (rate(redline_sidecar_decisions_total{source="failclosed"}[5m]))
          / sum by (namespace) (rate(redline_sidecar_decisions_total[5m])) > {{ $r.failClosedRatio }}
      for: {{ $r.for }}
      labels: {severity: critical}
      annotations:
        summary: {{ quote `Sidecars in {{ $labels.namespace }} refuse requests because Redis cannot answer (failure mode Closed).` }}
        description: {{ quote `{{ $value | humanizePercentage }} of decisions in {{ $labels.namespace }} were refused without Redis.` }}
        runbook: "Clients get 429 for every request a Closed policy matches: restore Redis first (errors by kind in redline_sidecar_redis_errors_total)."
    - alert: RedlineRedisErrors
      expr: |
        sum by (namespace, kind) (rate(redline_sidecar_redis_errors_total[5m]))
          / on (namespace) group_left
        sum by (namespace) (rate(redline_sidecar_redis_latency_seconds_count[5m]))
          > {{ $r.redisErrorRatio }}
      for: {{ $r.for }}
      labels: {severity: warning}
      annotations:
        summary: {{ quote `Sidecars in {{ $labels.namespace }} see Redis errors of kind {{ $labels.kind }}.` }}
        description: {{ quote `{{ $value | humanizePercentage }} of Redis round trips from {{ $labels.namespace }} failed ({{ $labels.kind }}).` }}
        runbook: "maxclients: the connection budget is over (see RedlineConnectionBudget); pool_timeout: raise redline.dev/redis-pool-size; timeout or network: Redis is slow or unreachable."
    - alert: RedlineRedisSlow
      expr: |
        histogram_quantile(0.99, sum by (namespace, le) (rate(redline_sidecar_redis_latency_seconds_bucket[5m]))) > {{ $r.redisLatencyP99Seconds }}
      for: {{ $r.for }}
      labels: {severity: warning}
      annotations:
        summary: {{ quote `Redis round trips from {{ $labels.namespace }} are slow (p99 {{ $value | humanizeDuration }}).` }}
        description: {{ quote `The p99 of Redis round trips from sidecars in {{ $labels.namespace }} is {{ $value | humanizeDuration }}, above the threshold.` }}
        runbook: "Check Redis's own latency (redis-cli --latency, SLOWLOG) and its CPU; a saturated Redis opens the sidecars' breakers next."
    - alert: RedlineConfigReloadErrors
      expr: |
        increase(redline_sidecar_config_reload_errors_total[10m]) > {{ $r.reloadErrors }}
      labels: {severity: warning}
      annotations:
        summary: {{ quote `Sidecar {{ $labels.namespace }}/{{ $labels.pod }} refused a policy document or labels file.` }}
        description: {{ quote `The sidecar keeps the last good policies; the new ones are not in force.` }}
        runbook: "Read the sidecar's log (config reload refused) and the namespace's RateLimitPolicy conditions; the ConfigMap redline-policies is written by the manager only."
    - alert: RedlineHeartbeatsMissing
      expr: |
        sum by (namespace) (rate(redline_sidecar_heartbeat_errors_total[5m])) > {{ $r.heartbeatErrorsPerSecond }}
      for: {{ $r.for }}
      labels: {severity: warning}
      annotations:
        summary: {{ quote `Sidecars in {{ $labels.namespace }} cannot record their heartbeats in Redis.` }}
        description: {{ quote `Live replicas are undercounted: LocalFallback divides by a stale count and the Enforced condition drops.` }}
        runbook: "Heartbeats share the sidecars' Redis: check Redis reachability and the namespace's Redis identity."
    - alert: RedlineCountsRestored
      expr: |
        sum by (namespace, policy) (increase(redline_sidecar_counter_regressions_total[10m])) > {{ $r.countRegressions }}
      labels: {severity: warning}
      annotations:
        summary: {{ quote `Redis lost counts of policy {{ $labels.namespace }}/{{ $labels.policy }}; its sidecars restored them.` }}
        description: {{ quote `{{ $value | humanize }} windows were found holding less than the sidecars had been granted (a failover to a replica that lagged, or a Redis restarted without persistence).` }}
        runbook: "Check Redis replication (lag, persistence) and whether a failover happened; redline_sidecar_unkept_share_units_total counts units that could not be restored (raise --share-keys), and the policy's RedisLostCounts Events say when."
  - name: redline-manager
    rules:
    - alert: RedlinePolicyNotEnforced
      expr: |
        max by (namespace, policy) (redline_policy_condition{condition="Enforced"}) < 1
      for: {{ $r.notEnforcedFor }}
      labels: {severity: warning}
      annotations:
        summary: {{ quote `RateLimitPolicy {{ $labels.namespace }}/{{ $labels.policy }} is not enforced.` }}
        description: {{ quote `Its Enforced condition has been False for a while: some of its sidecars do not apply the current configuration (or it is not in it).` }}
        runbook: "kubectl describe rlp: Enforced names the pods still on an older configuration (a reload refused: the sidecar's log), Programmed and Accepted say whether the manager could compile and write it."
    - alert: RedlineConnectionBudget
      expr: |
        max by (backend) (redline_redis_connections_worst_case) / on (backend) min by (backend) (redline_redis_maxclients > 0) > {{ $r.connectionBudgetRatio }}
      for: {{ $r.for }}
      labels: {severity: warning}
      annotations:
        summary: {{ quote `Redline's worst-case connections to Redis {{ $labels.backend }} exceed its maxclients.` }}
        description: {{ quote `With every injected workload of the namespaces it serves at maxReplicas, sidecars could open {{ $value | humanizePercentage }} of the maxclients of Redis {{ $labels.backend }} on each of its nodes.` }}
        runbook: "Lower redline.dev/redis-pool-size or HPA maxReplicas of the largest workloads (redline_redis_workload_connections_worst_case), or raise Redis's maxclients."
{{- end }}
