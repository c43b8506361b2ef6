// Package dashboards defines Redline's Grafana dashboards as code, with grafana-foundation-sdk's
// builders. `make dashboards` writes their JSON into charts/redline/dashboards, which the chart
// ships as ConfigMaps for the Grafana sidecar; TestDashboardsGenerated fails when the checked-in
// JSON is not what this code writes.
package dashboards

import (
	"bytes"
	"encoding/json"
	"fmt"

	"github.com/grafana/grafana-foundation-sdk/go/cog"
	"github.com/grafana/grafana-foundation-sdk/go/cog/variants"
	"github.com/grafana/grafana-foundation-sdk/go/common"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
	"github.com/grafana/grafana-foundation-sdk/go/prometheus"
	"github.com/grafana/grafana-foundation-sdk/go/stat"
	"github.com/grafana/grafana-foundation-sdk/go/timeseries"
)

// Query is one PromQL query of a panel.
type Query struct {
	// Expr is the query; $namespace, $policy and $__rate_interval are Grafana's variables.
	Expr string
	// Legend names each series.
	Legend string
}

// Panel is one panel: a time series, or a single number (Stat).
type Panel struct {
	Title, Description, Unit string
	Stat                     bool
	Queries                  []Query
}

// Dashboard is one dashboard and the variables it filters by.
type Dashboard struct {
	// File is the JSON file's name without .json (and the ConfigMap's suffix).
	File, UID, Title, Description string
	// PerPolicy adds the $policy variable.
	PerPolicy bool
	Panels    []Panel
}

const ns = `namespace=~"$namespace"`

// Grafana's units.
const (
	unitRate  = "reqps"
	unitCount = "short"
)

// All returns the dashboards: the operator's overview and the per-policy view.
func All() []Dashboard {
	return []Dashboard{overview(), perPolicy()}
}

func overview() Dashboard {
	return Dashboard{
		File: "redline-overview", UID: "redline-overview", Title: "Redline / Overview",
		Description: "Decisions, Redis health, the connection budget and configuration of every Redline sidecar.",
		Panels: []Panel{
			{Title: "Decisions per second by result and source", Unit: unitRate,
				Description: "source: redis (a script), lease (admitted from a lease), precheck (refused from the local cache), fallback (local limits while Redis is down), failopen, failclosed.",
				Queries:     []Query{{Expr: `sum by (result, source) (rate(redline_sidecar_decisions_total{` + ns + `}[$__rate_interval]))`, Legend: "{{result}} / {{source}}"}}},
			{Title: "Refusal ratio", Unit: "percentunit",
				Queries: []Query{{Expr: `sum(rate(redline_sidecar_decisions_total{` + ns + `,result="refused"}[$__rate_interval])) / sum(rate(redline_sidecar_decisions_total{` + ns + `}[$__rate_interval]))`, Legend: "refused"}}},
			{Title: "Redis latency", Unit: "s",
				Queries: []Query{
					{Expr: `histogram_quantile(0.5, sum by (le) (rate(redline_sidecar_redis_latency_seconds_bucket{` + ns + `}[$__rate_interval])))`, Legend: "p50"},
					{Expr: `histogram_quantile(0.99, sum by (le) (rate(redline_sidecar_redis_latency_seconds_bucket{` + ns + `}[$__rate_interval])))`, Legend: "p99"},
				}},
			{Title: "Redis errors by kind", Unit: "ops",
				Queries: []Query{{Expr: `sum by (kind) (rate(redline_sidecar_redis_errors_total{` + ns + `}[$__rate_interval]))`, Legend: "{{kind}}"}}},
			{Title: "Breaker open and local fallback", Unit: unitCount,
				Description: "Sidecars with the Redis circuit breaker of some shard open, and those enforcing local limits meanwhile.",
				Queries: []Query{
					{Expr: `sum(redline_sidecar_breaker_open{` + ns + `})`, Legend: "breaker open"},
					{Expr: `sum(redline_sidecar_fallback_active{` + ns + `})`, Legend: "on local fallback"},
				}},
			{Title: "Open breakers by Redis shard", Unit: unitCount,
				Description: "Sidecars whose breaker for a shard is open: that shard's keys go to the failure mode, the other shards' to Redis. " +
					"A shard is a Redis Cluster master by address (all: a standalone Redis or a Sentinel group; other: keys of no known master).",
				Queries: []Query{{Expr: `sum by (shard) (redline_sidecar_shard_breaker_open{` + ns + `})`, Legend: "{{shard}}"}}},
			{Title: "Redis calls per decision", Unit: unitCount,
				Description: "Round trips per decision: below 1 when leases and batching keep Redis off the hot path.",
				Queries:     []Query{{Expr: `sum(rate(redline_sidecar_redis_round_trips_total{` + ns + `}[$__rate_interval])) / sum(rate(redline_sidecar_decisions_total{` + ns + `}[$__rate_interval]))`, Legend: "round trips / decision"}}},
			{Title: "Redis connections against maxclients", Unit: unitCount,
				Description: "What sidecars hold now, the fleet's worst case (every workload at maxReplicas, every pool full) and Redis's maxclients (the manager's budget).",
				Queries: []Query{
					{Expr: `sum(redline_sidecar_redis_connections{` + ns + `})`, Legend: "sidecar connections"},
					{Expr: `max by (backend) (redline_redis_connected_clients)`, Legend: "{{backend}} connected_clients"},
					{Expr: `max by (backend) (redline_redis_connections_worst_case)`, Legend: "{{backend}} worst case"},
					{Expr: `min by (backend) (redline_redis_maxclients > 0)`, Legend: "{{backend}} maxclients"},
				}},
			{Title: "Config reloads and reload errors", Unit: unitCount,
				Queries: []Query{
					{Expr: `sum(increase(redline_sidecar_config_reloads_total{` + ns + `}[$__rate_interval]))`, Legend: "reloads"},
					{Expr: `sum(increase(redline_sidecar_config_reload_errors_total{` + ns + `}[$__rate_interval]))`, Legend: "refused"},
				}},
			{Title: "Heartbeat errors, restored windows and unkept share units", Unit: unitCount,
				Description: "Heartbeats Redis did not record (live replicas undercounted); windows found holding less than the sidecars were granted, restored from their shares (Redis lost writes); units granted beyond --share-keys, which a Redis losing them cannot get back.",
				Queries: []Query{
					{Expr: `sum(increase(redline_sidecar_heartbeat_errors_total{` + ns + `}[$__rate_interval]))`, Legend: "heartbeat errors"},
					{Expr: `sum by (namespace, policy) (increase(redline_sidecar_counter_regressions_total{` + ns + `}[$__rate_interval]))`, Legend: "{{namespace}}/{{policy}} windows restored"},
					{Expr: `sum(increase(redline_sidecar_unkept_share_units_total{` + ns + `}[$__rate_interval]))`, Legend: "unkept share units"},
				}},
			{Title: "Policies not enforced", Unit: unitCount, Stat: true,
				Description: "Policies whose Enforced condition is False: pods still on an older configuration, or the policy not Programmed (kubectl describe rlp).",
				Queries:     []Query{{Expr: `count((max by (namespace, policy) (redline_policy_condition{` + ns + `,condition="Enforced"}) < 1)) or vector(0)`, Legend: "not enforced"}}},
			{Title: "Live sidecars", Unit: unitCount, Stat: true,
				Queries: []Query{{Expr: `count(redline_sidecar_policies{` + ns + `})`, Legend: "sidecars"}}},
			{Title: "Replicas enforcing each policy", Unit: unitCount,
				Description: "Live replicas per policy from heartbeats (the Enforced condition counts the same): LocalFallback divides its limit by this.",
				Queries:     []Query{{Expr: `max by (namespace, policy) (redline_sidecar_policy_replicas{` + ns + `})`, Legend: "{{namespace}}/{{policy}}"}}},
		},
	}
}

func perPolicy() Dashboard {
	sel := ns + `,policy=~"$policy"`
	return Dashboard{
		File: "redline-policy", UID: "redline-policy", Title: "Redline / Policy",
		Description: "One RateLimitPolicy: its rules' decisions, refusals and where decisions came from.",
		PerPolicy:   true,
		Panels: []Panel{
			{Title: "Decisions per second by rule and result", Unit: unitRate,
				Queries: []Query{{Expr: `sum by (rule, result) (rate(redline_sidecar_decisions_total{` + sel + `}[$__rate_interval]))`, Legend: "{{rule}} {{result}}"}}},
			{Title: "Refusal ratio by rule", Unit: "percentunit",
				Queries: []Query{{Expr: `sum by (rule) (rate(redline_sidecar_decisions_total{` + sel + `,result="refused"}[$__rate_interval])) / sum by (rule) (rate(redline_sidecar_decisions_total{` + sel + `}[$__rate_interval]))`, Legend: "{{rule}}"}}},
			{Title: "Decisions by source", Unit: unitRate,
				Queries: []Query{{Expr: `sum by (source) (rate(redline_sidecar_decisions_total{` + sel + `}[$__rate_interval]))`, Legend: "{{source}}"}}},
			{Title: "Shadow refusals", Unit: unitRate,
				Description: "Requests a Shadow rule would have refused (admitted, counted).",
				Queries:     []Query{{Expr: `sum by (rule) (rate(redline_sidecar_decisions_total{` + sel + `,result="shadow_refused"}[$__rate_interval]))`, Legend: "{{rule}}"}}},
			{Title: "Requests in progress by in-flight rule", Unit: unitCount,
				Description: "Slots held over every replica (all keys of the rule together; a key's own limit bounds its share), and requests waiting for a slot of a full key. The policy's status names the keys holding the most.",
				Queries: []Query{
					{Expr: `sum by (rule) (redline_sidecar_in_flight{` + sel + `})`, Legend: "{{rule}} in progress"},
					{Expr: `sum by (rule) (redline_sidecar_in_flight_queued{` + sel + `})`, Legend: "{{rule}} queued"},
				}},
			{Title: "Quota used by the heaviest key", Unit: "percentunit",
				Description: "For rules with a calendar period or a window over 24h: the most any key has used of the current period's limit, as Redis answered the sidecars. The policy's status names the heaviest users and when the period resets.",
				Queries:     []Query{{Expr: `max by (rule) (redline_sidecar_quota_used_ratio{` + sel + `})`, Legend: "{{rule}}"}}},
			{Title: "Live replicas enforcing the policy", Unit: unitCount, Stat: true,
				Queries: []Query{{Expr: `max(redline_sidecar_policy_replicas{` + sel + `})`, Legend: "replicas"}}},
			{Title: "Conditions (1 True, 0 False)", Unit: unitCount,
				Description: "Accepted, Programmed and Enforced as the manager last computed them; no line while Enforced is Unknown (no sidecar yet).",
				Queries:     []Query{{Expr: `max by (condition) (redline_policy_condition{` + sel + `})`, Legend: "{{condition}}"}}},
		},
	}
}

var datasource = common.DataSourceRef{Type: new("prometheus"), Uid: new("${datasource}")}

// JSON is the dashboard's JSON model, indented, with a final newline.
func (d Dashboard) JSON() ([]byte, error) {
	// The Grafana sidecar provisions classic JSON dashboards; dashboardv2 is the v2 resource
	// schema, which file provisioning does not read.
	b := dashboard.NewDashboardBuilder(d.Title). //nolint:staticcheck // see above

							Uid(d.UID).
							Description(d.Description).
							Tags([]string{"redline"}).
							Refresh("30s").
							Time("now-1h", "now").
							Timezone(common.TimeZoneBrowser).
							WithVariable(dashboard.NewDatasourceVariableBuilder("datasource").Label("Data source").Type("prometheus")).
							WithVariable(dashboard.NewQueryVariableBuilder("namespace").Label("Namespace").
								Datasource(datasource).
								Query(dashboard.StringOrMap{String: new("label_values(redline_sidecar_decisions_total, namespace)")}).
								Refresh(dashboard.VariableRefreshOnTimeRangeChanged).
								Multi(true).IncludeAll(true).AllValue(".*"))
	if d.PerPolicy {
		b = b.WithVariable(dashboard.NewQueryVariableBuilder("policy").Label("Policy").
			Datasource(datasource).
			Query(dashboard.StringOrMap{String: new(`label_values(redline_sidecar_decisions_total{namespace=~"$namespace"}, policy)`)}).
			Refresh(dashboard.VariableRefreshOnTimeRangeChanged).
			Multi(true).IncludeAll(true).AllValue(".*"))
	}
	for _, p := range d.Panels {
		b = b.WithPanel(panel(p))
	}
	model, err := b.Build()
	if err != nil {
		return nil, fmt.Errorf("building dashboard %s: %w", d.UID, err)
	}
	out, err := json.MarshalIndent(model, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("encoding dashboard %s: %w", d.UID, err)
	}
	return append(bytes.TrimSpace(out), '\n'), nil
}

func panel(p Panel) cog.Builder[dashboard.Panel] {
	targets := make([]cog.Builder[variants.Dataquery], 0, len(p.Queries))
	for i, q := range p.Queries {
		targets = append(targets, prometheus.NewDataqueryBuilder().
			Datasource(datasource).
			RefId(string(rune('A'+i))).
			Expr(q.Expr).
			LegendFormat(q.Legend))
	}
	if p.Stat {
		sb := stat.NewPanelBuilder().Title(p.Title).Description(p.Description).Unit(p.Unit).Datasource(datasource).Height(6).Span(6)
		for _, t := range targets {
			sb = sb.WithTarget(t)
		}
		return sb
	}
	tb := timeseries.NewPanelBuilder().Title(p.Title).Description(p.Description).Unit(p.Unit).Datasource(datasource).Height(8).Span(12).Min(0).
		Legend(common.NewVizLegendOptionsBuilder().ShowLegend(true).DisplayMode(common.LegendDisplayModeList).Placement(common.LegendPlacementBottom)).
		Tooltip(common.NewVizTooltipOptionsBuilder().Mode(common.TooltipDisplayModeMulti).Sort(common.SortOrderDescending))
	for _, t := range targets {
		tb = tb.WithTarget(t)
	}
	return tb
}
