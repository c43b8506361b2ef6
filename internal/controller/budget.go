package controller

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redline-dev/redline/internal/connbudget"
)

// ManagerRedisPoolSize is the manager's own Redis pool (cmd/manager), counted in the budget.
const ManagerRedisPoolSize = 4

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

// budget is the cluster's worst case against Redis's limit. Every sidecar holds up to its pool
// on every master, so the worst case is the same on each node and is compared with the
// smallest maxclients among them.
type budget struct {
	Workloads  []workloadLoad // largest first
	Manager    int64
	MaxClients int64
}

func newBudget(loads []workloadLoad, manager, maxClients int64) budget {
	loads = slices.Clone(loads)
	slices.SortFunc(loads, func(a, b workloadLoad) int {
		if c := int(b.Connections() - a.Connections()); c != 0 {
			return c
		}
		return strings.Compare(a.Ref.String(), b.Ref.String())
	})
	return budget{Workloads: loads, Manager: manager, MaxClients: maxClients}
}

// WorstCase sums every workload at its maxReplicas with its full pool, plus the manager's.
func (b budget) WorstCase() int64 {
	n := b.Manager
	for _, w := range b.Workloads {
		n += w.Connections()
	}
	return n
}

// Over reports whether the worst case exceeds maxclients.
func (b budget) Over() bool { return b.WorstCase() > b.MaxClients }

// Summary says the numbers as a person reads them: "worst case 12,400 connections at
// maxReplicas (shop/checkout 50 x 16, ...), Redis maxclients 10,000". It names the five largest
// workloads; the rest are counted.
func (b budget) Summary() string {
	const shown = 5
	var parts []string
	for i, w := range b.Workloads {
		if i == shown {
			parts = append(parts, fmt.Sprintf("%d more", len(b.Workloads)-shown))
			break
		}
		parts = append(parts, fmt.Sprintf("%s %s/%s %d x %d", strings.ToLower(w.Ref.Kind), w.Ref.Namespace, w.Ref.Name, w.Replicas, w.Pool))
	}
	parts = append(parts, "manager "+strconv.FormatInt(b.Manager, 10))
	return fmt.Sprintf("worst case %s connections per Redis node at maxReplicas (%s), Redis maxclients %s",
		thousands(b.WorstCase()), strings.Join(parts, ", "), thousands(b.MaxClients))
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
