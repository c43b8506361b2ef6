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

// poolSizer sizes a new pod's Redis pool from the connection budget the controller's budget
// reconciler publishes in the same manager.
type poolSizer struct {
	// cache is the manager's cached client; direct reads the API server, for a ReplicaSet
	// created a moment ago that the cache has not seen yet.
	cache, direct client.Reader
	timeout       time.Duration
	log           logr.Logger
}

// size sets p.redisPoolSize from the budget when the pod has no pool annotation, and returns a
// warning when the annotation's pool overspends the workload's share. Any lookup failure
// leaves the default pool (and is logged): sizing is an improvement, never a gate.
func (s *poolSizer) size(ctx context.Context, pod *corev1.Pod, p *params, budget *connbudget.Publisher) []string {
	if s == nil || budget == nil {
		return nil
	}
	snap := budget.Load()
	if !snap.Known() {
		return nil // Redis's maxclients not read yet: the sidecar's default
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
			s.log.Info("redis pool not sized from the connection budget; default pool", "namespace", pod.Namespace,
				"generateName", pod.GenerateName, "error", err.Error())
		}
		return nil
	}
	maxReplicas := replicas
	var hpas autoscalingv2.HorizontalPodAutoscalerList
	if err := s.cache.List(ctx, &hpas, client.InNamespace(w.Namespace)); err != nil {
		s.log.Info("redis pool not sized from the connection budget; default pool", "workload", w.String(),
			"error", fmt.Errorf("listing horizontalpodautoscalers: %w", err).Error())
		return nil
	}
	if h := connbudget.Scalers(hpas.Items)[w]; h != nil {
		maxReplicas = int64(h.Spec.MaxReplicas)
	}
	sized := snap.PoolSize(w, maxReplicas)
	if p.redisPoolSize == 0 {
		p.redisPoolSize = int(sized)
		return nil
	}
	// The annotation wins; a person is told when it spends more than the workload's share.
	// The warning goes to whoever sent the review, which need not be the API server: it says
	// nothing of the Redis beyond the share (not its maxclients, nor how many namespaces and
	// workloads share it).
	share := snap.Share(w)
	if spend := int64(p.redisPoolSize) * maxReplicas; spend > share {
		return []string{fmt.Sprintf("%s%s=%d x maxReplicas %d = %d connections per Redis node, more than %s's even share of Redis's connection budget, %d; "+
			"without the annotation its pods would get %d",
			BudgetWarningPrefix, contract.AnnotationRedisPoolSize, p.redisPoolSize, maxReplicas, spend, w, share, sized)}
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
	case "StatefulSet":
		var set appsv1.StatefulSet
		if err := s.get(ctx, "statefulset", ns, ref.Name, &set); err != nil {
			return connbudget.Workload{}, 0, err
		}
		return connbudget.Workload{Kind: "StatefulSet", Namespace: ns, Name: set.Name}, connbudget.MaxReplicas(set.Spec.Replicas, nil), nil
	case "ReplicaSet":
		var rs appsv1.ReplicaSet
		if err := s.get(ctx, "replicaset", ns, ref.Name, &rs); err != nil {
			return connbudget.Workload{}, 0, err
		}
		owner := metav1.GetControllerOf(&rs)
		if owner == nil || owner.Kind != "Deployment" || !strings.HasPrefix(owner.APIVersion, appsv1.GroupName+"/") {
			return connbudget.Workload{Kind: "ReplicaSet", Namespace: ns, Name: rs.Name}, connbudget.MaxReplicas(rs.Spec.Replicas, nil), nil
		}
		var d appsv1.Deployment
		if err := s.get(ctx, "deployment", ns, owner.Name, &d); err != nil {
			return connbudget.Workload{}, 0, err
		}
		return connbudget.Workload{Kind: "Deployment", Namespace: ns, Name: d.Name}, connbudget.MaxReplicas(d.Spec.Replicas, nil), nil
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
