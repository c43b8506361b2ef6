package budget

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redline-dev/redline/internal/connbudget"
)

// workloadRef names a Deployment, StatefulSet or ReplicaSet without a Deployment.
type workloadRef = connbudget.Workload

// workloadLoad is what one injected workload can open to each Redis node at its largest.
type workloadLoad struct {
	Ref workloadRef
	// Replicas is the HPA's maxReplicas, or spec.replicas without an HPA.
	Replicas int64
	// HPA names the HorizontalPodAutoscaler Replicas comes from; empty without one.
	HPA string
	// Pool is each pod's Redis pool per node: the annotation's, else what connbudget.PoolSize
	// gives the workload, which is what the injector gives its new pods.
	Pool int64
	// Explicit is true when Pool comes from the annotation.
	Explicit bool
	// PodLabels are the pod template's labels, matched against policies' targetSelectors.
	PodLabels map[string]string
	// target receives the budget's Events: the HPA when there is one, else the workload.
	target client.Object
}

// Connections is the workload's worst case per Redis node.
func (w workloadLoad) Connections() int64 { return w.Replicas * w.Pool }

// budget is the fleet's worst case against Redis's limit. Every sidecar holds up to its pool
// on every master, so the worst case is the same on each node. Redis's connections are shared
// by namespace first (connbudget), so each namespace is judged against its own share, and a
// namespace is told only of itself: what other tenants run, and the cluster's total, are
// neither its business nor stable (a message carrying them would rewrite its status on every
// change anywhere). The cluster's total is on the manager's metrics, for the admin.
type budget struct {
	Workloads  []workloadLoad // largest first
	Manager    int64
	MaxClients int64
	// snap is what the pools were sized from; it gives each namespace's share.
	snap *connbudget.Snapshot
}

func newBudget(loads []workloadLoad, manager int64, snap *connbudget.Snapshot) budget {
	loads = slices.Clone(loads)
	slices.SortFunc(loads, func(a, b workloadLoad) int {
		if c := cmp.Compare(b.Connections(), a.Connections()); c != 0 {
			return c
		}
		return strings.Compare(a.Ref.String(), b.Ref.String())
	})
	return budget{Workloads: loads, Manager: manager, MaxClients: snap.MaxClients, snap: snap}
}

// WorstCase sums every workload at its maxReplicas with its full pool, plus the manager's.
func (b budget) WorstCase() int64 {
	n := b.Manager
	for _, w := range b.Workloads {
		n += w.Connections()
	}
	return n
}

// Namespaces splits the budget by namespace.
func (b budget) Namespaces() map[string]namespaceBudget {
	out := map[string]namespaceBudget{}
	for _, w := range b.Workloads {
		nb, ok := out[w.Ref.Namespace]
		if !ok {
			nb = namespaceBudget{Namespace: w.Ref.Namespace, Share: b.snap.NamespaceShare(w.Ref)}
		}
		nb.Workloads = append(nb.Workloads, w) // stays largest first
		out[w.Ref.Namespace] = nb
	}
	return out
}

// namespaceBudget is one namespace's worst case against its share of Redis's connections.
type namespaceBudget struct {
	Namespace string
	Workloads []workloadLoad // largest first
	// Share is the namespace's even share of maxclients minus the reserve.
	Share int64
}

// WorstCase sums the namespace's workloads at maxReplicas with their full pools.
func (n namespaceBudget) WorstCase() int64 {
	var sum int64
	for _, w := range n.Workloads {
		sum += w.Connections()
	}
	return sum
}

// Over reports whether the namespace can open more than its share.
func (n namespaceBudget) Over() bool { return n.WorstCase() > n.Share }

// Summary says the numbers as a person reads them: "namespace shop's worst case 1,200
// connections per Redis node at maxReplicas (deployment checkout 50 x 16, ...), over its share
// of Redis's connections, 950". It names the namespace's five largest workloads; the rest are
// counted.
func (n namespaceBudget) Summary() string {
	const shown = 5
	var parts []string
	for i, w := range n.Workloads {
		if i == shown {
			parts = append(parts, fmt.Sprintf("%d more", len(n.Workloads)-shown))
			break
		}
		parts = append(parts, fmt.Sprintf("%s %s %d x %d", strings.ToLower(w.Ref.Kind), w.Ref.Name, w.Replicas, w.Pool))
	}
	rel := "within"
	if n.Over() {
		rel = "over"
	}
	return fmt.Sprintf("namespace %s's worst case %s connections per Redis node at maxReplicas (%s), %s its share of Redis's connections, %s",
		n.Namespace, thousands(n.WorstCase()), strings.Join(parts, ", "), rel, thousands(n.Share))
}

// thousands writes n with comma separators (12400 -> "12,400").
func thousands(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var out []byte
	for i := range len(s) {
		if i > 0 && (len(s)-i)%3 == 0 {
			out = append(out, ',')
		}
		out = append(out, s[i])
	}
	if neg {
		return "-" + string(out)
	}
	return string(out)
}
