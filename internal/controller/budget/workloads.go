package budget

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redline-dev/redline/internal/connbudget"
	"github.com/redline-dev/redline/internal/controller/loop"
	"github.com/redline-dev/redline/internal/sidecar/contract"
)

func workloadSet(loads []workloadLoad) map[connbudget.Workload]struct{} {
	out := make(map[connbudget.Workload]struct{}, len(loads))
	for _, w := range loads {
		out[w.Ref] = struct{}{}
	}
	return out
}

// sizePools gives the workloads without the annotation the pool the injector gives their pods.
func sizePools(loads []workloadLoad, s *connbudget.Snapshot) {
	for i := range loads {
		if !loads[i].Explicit {
			loads[i].Pool = s.PoolSize(loads[i].Ref, loads[i].Replicas)
		}
	}
}

// workloads lists the injected Deployments, StatefulSets and ReplicaSets without a Deployment
// that can run pods, with their largest replica count and, where the annotation sets it, their
// pool. A workload that runs no pod (replicas 0) takes no share: creating empty ones changes no
// pool. The lists are the cache's own objects, slimmed by CacheOptions and not copied
// (UnsafeDisableDeepCopy): nothing here writes to them.
func (r *Reconciler) workloads(ctx context.Context) ([]workloadLoad, error) {
	var hpas autoscalingv2.HorizontalPodAutoscalerList
	if err := r.List(ctx, &hpas, client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("listing horizontalpodautoscalers: %w", err)
	}
	scalers := connbudget.Scalers(hpas.Items)

	var out []workloadLoad
	add := func(kind string, obj client.Object, replicas *int32, tmpl *corev1.PodTemplateSpec) {
		if tmpl.Annotations[contract.AnnotationInject] != "true" || obj.GetDeletionTimestamp() != nil {
			return
		}
		w := workloadLoad{
			Ref:       workloadRef{Kind: kind, Namespace: obj.GetNamespace(), Name: obj.GetName()},
			PodLabels: tmpl.Labels,
			target:    obj,
		}
		h := scalers[w.Ref]
		if !connbudget.RunsPods(replicas, h) {
			return
		}
		w.Pool, w.Explicit = poolSize(tmpl.Annotations, r.poolCeiling())
		w.Replicas = connbudget.MaxReplicas(replicas, h)
		if h != nil {
			w.HPA, w.target = h.Name, h
		}
		out = append(out, w)
	}
	var deps appsv1.DeploymentList
	if err := r.List(ctx, &deps, client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("listing deployments: %w", err)
	}
	for i := range deps.Items {
		d := &deps.Items[i]
		add("Deployment", d, d.Spec.Replicas, &d.Spec.Template)
	}
	var sets appsv1.StatefulSetList
	if err := r.List(ctx, &sets, client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("listing statefulsets: %w", err)
	}
	for i := range sets.Items {
		s := &sets.Items[i]
		add("StatefulSet", s, s.Spec.Replicas, &s.Spec.Template)
	}
	var rss appsv1.ReplicaSetList
	if err := r.List(ctx, &rss, client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("listing replicasets: %w", err)
	}
	for i := range rss.Items {
		rs := &rss.Items[i]
		// A Deployment's ReplicaSets are counted as the Deployment.
		if !loop.OwnedByDeployment(rs) {
			add("ReplicaSet", rs, rs.Spec.Replicas, &rs.Spec.Template)
		}
	}
	return out, nil
}

// poolSize is the annotation's pool, when it is set and valid. An invalid one counts as
// ceiling, the largest pool the injector gives without the annotation: the injector refuses to
// inject with it, so it opens nothing, and the ceiling keeps the sum on the safe side.
func poolSize(ann map[string]string, ceiling int64) (pool int64, explicit bool) {
	if raw, ok := ann[contract.AnnotationRedisPoolSize]; ok {
		n, err := strconv.ParseInt(strings.TrimSpace(raw), 10, 64)
		if err == nil && n >= contract.MinRedisPoolSize && n <= contract.MaxRedisPoolSize {
			return n, true
		}
		return ceiling, true
	}
	return 0, false
}

// poolCeiling is PoolCeiling, or contract.DefaultRedisPoolSize.
func (r *Reconciler) poolCeiling() int64 {
	return (&connbudget.Snapshot{PoolCeiling: r.PoolCeiling}).Ceiling()
}
