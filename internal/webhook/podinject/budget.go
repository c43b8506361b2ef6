package podinject

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/go-logr/logr"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redline-dev/redline/internal/connbudget"
	"github.com/redline-dev/redline/internal/sidecar/contract"
)

// BudgetWarningPrefix starts the admission warning about a pool that overspends its share.
const BudgetWarningPrefix = "redline: "

// defaultLookupTimeout bounds the workload lookups of one admission. The webhook's own
// timeout is 5s and a pod must never wait on them: on expiry the pod gets the default pool.
const defaultLookupTimeout = time.Second

// errNoWorkload: the pod belongs to no workload the budget counts (a bare pod, a Job's, a
// DaemonSet's); it gets the default pool.
var errNoWorkload = errors.New("the pod belongs to no Deployment, StatefulSet or ReplicaSet")

// poolSizer tells the person creating a pod whose redline.dev/redis-pool-size annotation
// overspends its workload's share of the connection budget the controller's budget
// reconciler publishes in the same manager. Pools without the annotation are sized by the
// manager in the namespace's ConfigMap (workloadData), not here.
//
// The warning is built from the workload's replicas and share, which a forged review of
// another namespace's pod must not learn: it is given only when the webhook answers the API
// server alone (verifiedClients, --webhook-client-ca-file), and the caller is then the pod's
// creator. Elsewhere the budget's OverBudget condition and Events say the same.
type poolSizer struct {
	// cache is the manager's cached client; direct reads the API server, for a ReplicaSet
	// created a moment ago that the cache has not seen yet.
	cache, direct client.Reader
	timeout       time.Duration
	log           logr.Logger
	// verifiedClients: the webhook answers only clients with a certificate of its client CA.
	verifiedClients bool
}

// warn returns a warning when the annotation's pool overspends the workload's share. Any
// lookup failure gives no warning (and is logged): it informs, never gates.
func (s *poolSizer) warn(ctx context.Context, pod *corev1.Pod, pool int, budgetOf func(context.Context, string) *connbudget.Publisher) []string {
	if s == nil || !s.verifiedClients {
		return nil
	}
	budget := budgetOf(ctx, pod.Namespace)
	if budget == nil {
		return nil
	}
	snap := budget.Load()
	if !snap.Known() {
		return nil // Redis's maxclients not read yet
	}
	timeout := s.timeout
	if timeout <= 0 {
		timeout = defaultLookupTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	w, replicas, err := s.workloadOf(ctx, pod)
	if err != nil {
		if !errors.Is(err, errNoWorkload) {
			s.log.Info("redis pool not checked against the connection budget", "namespace", pod.Namespace,
				"generateName", pod.GenerateName, "error", err.Error())
		}
		return nil
	}
	maxReplicas := replicas
	var hpas autoscalingv2.HorizontalPodAutoscalerList
	if err := s.cache.List(ctx, &hpas, client.InNamespace(w.Namespace)); err != nil {
		s.log.Info("redis pool not checked against the connection budget", "workload", w.String(),
			"error", fmt.Errorf("listing horizontalpodautoscalers: %w", err).Error())
		return nil
	}
	if h := connbudget.Scalers(hpas.Items)[w]; h != nil {
		maxReplicas = int64(h.Spec.MaxReplicas)
	}
	share := snap.Share(w)
	if spend := int64(pool) * maxReplicas; spend > share {
		return []string{fmt.Sprintf("%s%s=%d x maxReplicas %d = %d connections per Redis node, more than %s's even share of Redis's connection budget, %d; "+
			"without the annotation its pods would get %d",
			BudgetWarningPrefix, contract.AnnotationRedisPoolSize, pool, maxReplicas, spend, w, share, snap.PoolSize(w, maxReplicas))}
	}
	return nil
}

// workloadOf finds the workload a new pod belongs to and its spec.replicas: pod -> ReplicaSet
// -> Deployment, pod -> StatefulSet, or pod -> ReplicaSet when no Deployment owns it. At
// admission the pod may have no name yet; its controller reference is what counts.
func (s *poolSizer) workloadOf(ctx context.Context, pod *corev1.Pod) (connbudget.Workload, int64, error) {
	ref := metav1.GetControllerOf(pod)
	if ref == nil || !strings.HasPrefix(ref.APIVersion, appsv1.GroupName+"/") {
		return connbudget.Workload{}, 0, errNoWorkload
	}
	ns := pod.Namespace
	switch ref.Kind {
	case kindStatefulSet:
		var set appsv1.StatefulSet
		if err := s.get(ctx, "statefulset", ns, ref.Name, &set); err != nil {
			return connbudget.Workload{}, 0, err
		}
		return connbudget.Workload{Kind: kindStatefulSet, Namespace: ns, Name: set.Name}, connbudget.MaxReplicas(set.Spec.Replicas, nil), nil
	case kindReplicaSet:
		var rs appsv1.ReplicaSet
		if err := s.get(ctx, "replicaset", ns, ref.Name, &rs); err != nil {
			return connbudget.Workload{}, 0, err
		}
		owner := metav1.GetControllerOf(&rs)
		if owner == nil || owner.Kind != kindDeployment || !strings.HasPrefix(owner.APIVersion, appsv1.GroupName+"/") {
			return connbudget.Workload{Kind: kindReplicaSet, Namespace: ns, Name: rs.Name}, connbudget.MaxReplicas(rs.Spec.Replicas, nil), nil
		}
		var d appsv1.Deployment
		if err := s.get(ctx, "deployment", ns, owner.Name, &d); err != nil {
			return connbudget.Workload{}, 0, err
		}
		return connbudget.Workload{Kind: kindDeployment, Namespace: ns, Name: d.Name}, connbudget.MaxReplicas(d.Spec.Replicas, nil), nil
	}
	return connbudget.Workload{}, 0, errNoWorkload
}

// get reads from the cache, and from the API server when the cache has not seen the object
// yet: a Deployment's new ReplicaSet creates its pods within milliseconds of being created.
func (s *poolSizer) get(ctx context.Context, kind, ns, name string, obj client.Object) error {
	key := client.ObjectKey{Namespace: ns, Name: name}
	err := s.cache.Get(ctx, key, obj)
	if apierrors.IsNotFound(err) && s.direct != nil {
		err = s.direct.Get(ctx, key, obj)
	}
	if err != nil {
		return fmt.Errorf("reading %s %s: %w", kind, key, err)
	}
	return nil
}
