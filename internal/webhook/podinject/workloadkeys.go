package podinject

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strconv"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redline-dev/redline/internal/connbudget"
	"github.com/redline-dev/redline/internal/sidecar/contract"
)

// Per-workload keys of RedisConfigMapName: what the manager computed for each injected
// workload of the namespace, which a sidecar reads through a variable set from its own
// workload's key (optional: unset until the manager wrote it). The patch names the key, derived
// from the pod's own controller reference and labels alone, so a review of any pod learns
// nothing from the patch that it did not send; the values stay in the namespace.
const (
	// PoolSizeKeyPrefix: the pool the connection budget gives the workload
	// (contract.EnvBudgetRedisPoolSize). Absent for a workload whose template sets
	// contract.AnnotationRedisPoolSize, and while Redis's maxclients is unknown.
	PoolSizeKeyPrefix = "pool-size"
	// ReplicasKeyPrefix: the workload's largest replica count, its HPA's maxReplicas or else
	// its spec.replicas (contract.EnvFallbackReplicas).
	ReplicasKeyPrefix = "replicas"
	// MaxWorkloadKeys bounds the workloads of one namespace given keys, in the order of
	// kind and name: past it a workload gets none, and its sidecars run on the manager's
	// default pool and divide by the heartbeats' replicas alone (1 before any is heard).
	// Two keys of at most 253 bytes each keep the ConfigMap far below its 1 MiB limit.
	MaxWorkloadKeys = 512
)

// Kinds of the workloads given keys (connbudget.Workload.Kind).
const (
	kindDeployment  = "Deployment"
	kindStatefulSet = "StatefulSet"
	kindReplicaSet  = "ReplicaSet"
)

// workloadKey is the key of ConfigMap prefix for workload kind/name: "<prefix>.<kind>.<name>"
// in lower case, or with a hash of the name where that would not be a valid key (a forged
// owner reference can name anything).
func workloadKey(prefix, kind, name string) string {
	k := prefix + "." + strings.ToLower(kind) + "." + name
	if len(validation.IsConfigMapKey(k)) == 0 {
		return k
	}
	sum := sha256.Sum256([]byte(name))
	return prefix + "." + strings.ToLower(kind) + ".sha256-" + hex.EncodeToString(sum[:16])
}

// podWorkload names the workload of a pod from the pod alone, without a lookup whose result
// the patch could reveal: its StatefulSet, its Deployment (a ReplicaSet named after the
// Deployment and the pod-template-hash label the Deployment gives its pods), or else its
// ReplicaSet. ok is false for a pod of no such workload (a bare pod, a Job's, a DaemonSet's).
func podWorkload(pod *corev1.Pod) (kind, name string, ok bool) {
	ref := metav1.GetControllerOf(pod)
	if ref == nil || !strings.HasPrefix(ref.APIVersion, appsv1.GroupName+"/") || ref.Name == "" {
		return "", "", false
	}
	switch ref.Kind {
	case kindStatefulSet:
		return kindStatefulSet, ref.Name, true
	case kindReplicaSet:
		if h := pod.Labels[appsv1.DefaultDeploymentUniqueLabelKey]; h != "" && strings.HasSuffix(ref.Name, "-"+h) && len(ref.Name) > len(h)+1 {
			return kindDeployment, strings.TrimSuffix(ref.Name, "-"+h), true
		}
		return kindReplicaSet, ref.Name, true
	}
	return "", "", false
}

// workloadEnv are the sidecar's variables from its workload's keys: the replicas always, the
// pool unless the pod sets its own.
func workloadEnv(pod *corev1.Pod, explicitPool bool) []corev1.EnvVar {
	kind, name, ok := podWorkload(pod)
	if !ok {
		return nil
	}
	var env []corev1.EnvVar
	if !explicitPool {
		env = append(env, optionalConfigMapEnv(contract.EnvBudgetRedisPoolSize, workloadKey(PoolSizeKeyPrefix, kind, name)))
	}
	return append(env, optionalConfigMapEnv(contract.EnvFallbackReplicas, workloadKey(ReplicasKeyPrefix, kind, name)))
}

// optionalConfigMapEnv is configMapEnv for a key that may be absent, or a ConfigMap not
// written yet: the variable is then unset and the sidecar uses its flag's value.
func optionalConfigMapEnv(name, key string) corev1.EnvVar {
	e := configMapEnv(name, key)
	e.ValueFrom.ConfigMapKeyRef.Optional = new(true)
	return e
}

// injectedWorkload is a workload of the namespace whose pods are injected and can run.
type injectedWorkload struct {
	kind, name  string
	maxReplicas int64
	// explicit: its template sets contract.AnnotationRedisPoolSize, which its pods take.
	explicit bool
}

// workloadData are the per-workload keys of namespace ns: each injected Deployment,
// StatefulSet and ReplicaSet without a Deployment that can run pods (the workloads the
// connection budget counts), at most MaxWorkloadKeys of them. snap sizes the pools; unknown,
// no pool is written. optedIn: the namespace opts its pods in.
func workloadData(ctx context.Context, c client.Reader, ns string, optedIn bool, snap *connbudget.Snapshot) (map[string]string, error) {
	loads, err := injectedWorkloads(ctx, c, ns, optedIn)
	if err != nil {
		return nil, err
	}
	out := make(map[string]string, 2*len(loads))
	for _, w := range loads {
		out[workloadKey(ReplicasKeyPrefix, w.kind, w.name)] = strconv.FormatInt(w.maxReplicas, 10)
		if !w.explicit && snap.Known() {
			ref := connbudget.Workload{Kind: w.kind, Namespace: ns, Name: w.name}
			out[workloadKey(PoolSizeKeyPrefix, w.kind, w.name)] = strconv.FormatInt(snap.PoolSize(ref, w.maxReplicas), 10)
		}
	}
	return out, nil
}

// injectedWorkloads lists them, sorted by kind and name, bounded by MaxWorkloadKeys. The lists
// are the cache's own objects, not copied (UnsafeDisableDeepCopy): nothing here writes to them,
// and every change of the budget reads every namespace's.
func injectedWorkloads(ctx context.Context, c client.Reader, ns string, optedIn bool) ([]injectedWorkload, error) {
	var hpas autoscalingv2.HorizontalPodAutoscalerList
	if err := c.List(ctx, &hpas, client.InNamespace(ns), client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("listing horizontalpodautoscalers of %s: %w", ns, err)
	}
	scalers := connbudget.Scalers(hpas.Items)
	var out []injectedWorkload
	add := func(kind string, obj client.Object, replicas *int32, tmpl *corev1.PodTemplateSpec) {
		pod := &corev1.Pod{ObjectMeta: tmpl.ObjectMeta}
		if obj.GetDeletionTimestamp() != nil || !wantsInjection(pod, optedIn) {
			return
		}
		h := scalers[connbudget.Workload{Kind: kind, Namespace: ns, Name: obj.GetName()}]
		if !connbudget.RunsPods(replicas, h) {
			return
		}
		_, explicit := tmpl.Annotations[contract.AnnotationRedisPoolSize]
		out = append(out, injectedWorkload{kind: kind, name: obj.GetName(), maxReplicas: connbudget.MaxReplicas(replicas, h), explicit: explicit})
	}
	var deps appsv1.DeploymentList
	if err := c.List(ctx, &deps, client.InNamespace(ns), client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("listing deployments of %s: %w", ns, err)
	}
	for i := range deps.Items {
		add(kindDeployment, &deps.Items[i], deps.Items[i].Spec.Replicas, &deps.Items[i].Spec.Template)
	}
	var sets appsv1.StatefulSetList
	if err := c.List(ctx, &sets, client.InNamespace(ns), client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("listing statefulsets of %s: %w", ns, err)
	}
	for i := range sets.Items {
		add(kindStatefulSet, &sets.Items[i], sets.Items[i].Spec.Replicas, &sets.Items[i].Spec.Template)
	}
	var rss appsv1.ReplicaSetList
	if err := c.List(ctx, &rss, client.InNamespace(ns), client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("listing replicasets of %s: %w", ns, err)
	}
	for i := range rss.Items {
		rs := &rss.Items[i]
		if ref := metav1.GetControllerOf(rs); ref == nil || ref.Kind != kindDeployment {
			add(kindReplicaSet, rs, rs.Spec.Replicas, &rs.Spec.Template) // a Deployment's count as it
		}
	}
	slices.SortFunc(out, func(a, b injectedWorkload) int {
		return strings.Compare(a.kind+"/"+a.name, b.kind+"/"+b.name)
	})
	return out[:min(len(out), MaxWorkloadKeys)], nil
}
