package docgen

import (
	"bytes"
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/redis/go-redis/v9"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/redline-dev/redline/internal/controller"
	"github.com/redline-dev/redline/internal/limiter"
	"github.com/redline-dev/redline/internal/policydoc"
	"github.com/redline-dev/redline/internal/redisconn"
	"github.com/redline-dev/redline/internal/sidecar/decide"
	"github.com/redline-dev/redline/internal/sidecar/membudget"
	sidecarmetrics "github.com/redline-dev/redline/internal/sidecar/metrics"
	"github.com/redline-dev/redline/internal/sidecar/ruleset"
)

// Metric is one metric family a process serves.
type Metric struct {
	Name, Type, Help string
	Labels           []string
}

// OwnPrefix starts the names of Redline's own metrics; the others are its libraries'.
const OwnPrefix = "redline_"

// RuntimePrefixes start the names of the Go runtime's and the process's metrics, which both
// processes serve (client_golang's collectors) and the reference names only by prefix.
var RuntimePrefixes = []string{"go_", "process_"}

// ManagerMetrics are the families of the manager's registry (controller-runtime's, which
// serves its /metrics): its own collectors with a series each, so that the registry gives
// their type and labels, and every family the registry describes.
func ManagerMetrics() ([]Metric, error) {
	reg := prometheus.NewRegistry()
	for _, c := range controller.Collectors {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
		if err := addSeries(c); err != nil {
			return nil, err
		}
	}
	all, ok := ctrlmetrics.Registry.(prometheus.Collector)
	if !ok {
		return nil, fmt.Errorf("controller-runtime's registry (%T) describes nothing", ctrlmetrics.Registry)
	}
	return families(all, reg)
}

// SidecarRegistry is a sidecar's registry after what a running sidecar does: a policy set
// loaded, a decision counted, the Redis pool watched, the limiter reporting a shard, /metrics
// served.
func SidecarRegistry() (*prometheus.Registry, error) {
	p := policydoc.Policy{
		Name: "p", Generation: 1, Selector: policydoc.Selector{MatchLabels: map[string]string{"app": "web"}}, FailureMode: "Open",
		Rules: []policydoc.Rule{{Name: "r", Key: []policydoc.KeyPart{{Header: "x-key"}}, Algorithm: "FixedWindow", Requests: 10, WindowMS: 1000, Mode: "Enforce",
			Candidate: &policydoc.Candidate{Algorithm: "FixedWindow", Requests: 5, WindowMS: 1000}},
			// A calendar month: its quota gauge shows from the load on.
			{Name: "month", Key: []policydoc.KeyPart{{Header: "x-key"}}, Algorithm: "FixedWindow", Requests: 10, WindowMS: 2685600000, Mode: "Enforce",
				Calendar: &policydoc.Calendar{Unit: "Month"}}},
	}
	_, data, err := policydoc.Build("ns", []policydoc.Policy{p}, map[string]string{})
	if err != nil {
		return nil, err
	}
	doc, err := policydoc.Parse(data)
	if err != nil {
		return nil, err
	}
	set, err := ruleset.NewBuilder("").Build(doc, map[string]string{"app": "web"})
	if err != nil {
		return nil, err
	}
	store := &ruleset.Store{}
	store.Swap(set)
	m := sidecarmetrics.New(func() limiter.Stats {
		return limiter.Stats{Shards: []limiter.ShardState{{Name: "all"}}}
	}, store)
	m.ConfigLoaded(set)
	m.Observe(set.Rules[0], limiter.Result{Allowed: true})
	m.Observe(set.Rules[0].Candidate, limiter.Result{Allowed: true})
	m.Settled(set.Rules[0], limiter.Settled{Returned: 1, Debt: 1}, nil)
	m.RegistryRefused(sidecarmetrics.FaceCheck)
	m.UnsizedRefused(set.Rules[0], "body_too_large")
	// Never dialed: the pool's counters are read, not used.
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	m.WatchPool(client, &redisconn.ConnStats{}, 16)
	m.WatchMemory(membudget.New(1).Stats)
	m.WatchDecisionLog(func() int64 { return 0 })
	m.WatchSlots(func() limiter.SlotStats { return limiter.SlotStats{} })
	m.ObserveSlot(set.Rules[0], limiter.SlotResult{Allowed: true})
	m.SlotsHeld(set.Rules[0], 0)
	m.SlotsQueued(set.Rules[0], 0)
	m.SlotLetFinish(set.Rules[0])
	m.WatchSlotRegistry(sidecarmetrics.FaceCheck, &decide.SlotRegistry{})
	// Serving /metrics registers the handler's own error counter.
	_ = m.Handler()
	return m.Registry, nil
}

// SidecarMetrics are the families of the sidecar's registry.
func SidecarMetrics() ([]Metric, error) {
	reg, err := SidecarRegistry()
	if err != nil {
		return nil, err
	}
	return families(reg, reg)
}

// addSeries gives a vector one series (labels empty), so that a registry gathers it: a vector
// has no series until it is used, and only a gathered family says its type.
func addSeries(c prometheus.Collector) error {
	// The label count is found by trying: a vector says it only in its Desc's text.
	for n := 0; n <= 16; n++ {
		lvs := make([]string, n)
		var err error
		switch v := c.(type) {
		case *prometheus.GaugeVec:
			_, err = v.GetMetricWithLabelValues(lvs...)
		case *prometheus.CounterVec:
			_, err = v.GetMetricWithLabelValues(lvs...)
		case *prometheus.HistogramVec:
			_, err = v.GetMetricWithLabelValues(lvs...)
		case *prometheus.SummaryVec:
			_, err = v.GetMetricWithLabelValues(lvs...)
		default:
			return nil // a plain metric or a collector of its own: gathered as it is
		}
		if err == nil {
			return nil
		}
	}
	return fmt.Errorf("no label count fits %T", c)
}

// families lists every family described by described, with the type and labels gathered from
// gathered where it has the family (its help and labels from the description otherwise).
func families(described prometheus.Collector, gathered prometheus.Gatherer) ([]Metric, error) {
	mfs, err := gathered.Gather()
	if err != nil {
		return nil, err
	}
	byName := map[string]*dto.MetricFamily{}
	for _, mf := range mfs {
		byName[mf.GetName()] = mf
	}
	ch := make(chan *prometheus.Desc)
	go func() {
		described.Describe(ch)
		close(ch)
	}()
	seen := map[string]bool{}
	var out []Metric
	for d := range ch {
		m, err := parseDesc(d)
		if err != nil {
			return nil, err
		}
		if seen[m.Name] {
			continue
		}
		seen[m.Name] = true
		if mf, ok := byName[m.Name]; ok {
			m.Type = strings.ToLower(mf.GetType().String())
			m.Help = mf.GetHelp()
		}
		out = append(out, m)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

var descText = regexp.MustCompile(`^Desc\{fqName: ("(?:[^"\\]|\\.)*"), help: ("(?:[^"\\]|\\.)*"), .*variableLabels: \{([^}]*)\}\}$`)

// parseDesc reads a Desc's name, help and variable labels from its text: client_golang has no
// accessors for them.
func parseDesc(d *prometheus.Desc) (Metric, error) {
	m := descText.FindStringSubmatch(d.String())
	if m == nil {
		return Metric{}, fmt.Errorf("unexpected Desc text %s", d.String())
	}
	name, err := strconv.Unquote(m[1])
	if err != nil {
		return Metric{}, err
	}
	help, err := strconv.Unquote(m[2])
	if err != nil {
		return Metric{}, err
	}
	var labels []string
	for l := range strings.SplitSeq(m[3], ",") {
		if l = strings.TrimSuffix(strings.TrimPrefix(l, "c("), ")"); l != "" {
			labels = append(labels, l)
		}
	}
	return Metric{Name: name, Help: help, Labels: labels}, nil
}

func genMetrics(_ string, b *bytes.Buffer) error {
	mgr, err := ManagerMetrics()
	if err != nil {
		return fmt.Errorf("the manager's metrics: %w", err)
	}
	sc, err := SidecarMetrics()
	if err != nil {
		return fmt.Errorf("the sidecar's metrics: %w", err)
	}
	b.WriteString("\n# Metrics\n\n")
	b.WriteString("What the manager (`--metrics-bind-address`, default :8080) and each sidecar (its admin port,\n")
	b.WriteString("9091, `/metrics`) serve. Both also serve the Go runtime's and the process's metrics (")
	for i, p := range RuntimePrefixes {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(code(p + "*"))
	}
	b.WriteString(").\n")
	write := func(title string, ms []Metric, own bool) {
		var rows []Metric
		for _, m := range ms {
			if strings.HasPrefix(m.Name, OwnPrefix) == own && !hasPrefix(m.Name, RuntimePrefixes) {
				rows = append(rows, m)
			}
		}
		if len(rows) == 0 {
			return
		}
		fmt.Fprintf(b, "\n## %s\n\n", title)
		if own {
			table(b, "Metric", "Type", "Labels", "Description")
		} else {
			b.WriteString("Defined by the libraries (controller-runtime, client-go, client_golang); a vector shows once it\nhas a series.\n\n")
			table(b, "Metric", "Labels", "Description")
		}
		for _, m := range rows {
			var ls []string
			for _, l := range m.Labels {
				ls = append(ls, code(l))
			}
			if own {
				row(b, code(m.Name), m.Type, strings.Join(ls, ", "), cell(m.Help))
			} else {
				row(b, code(m.Name), strings.Join(ls, ", "), cell(m.Help))
			}
		}
	}
	write("Manager", mgr, true)
	write("Manager: libraries", mgr, false)
	write("Sidecar", sc, true)
	write("Sidecar: libraries", sc, false)
	return nil
}
