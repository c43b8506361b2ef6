package policies

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1alpha1 "github.com/redline-dev/redline/api/v1alpha1"
	"github.com/redline-dev/redline/internal/controller/loop"
	"github.com/redline-dev/redline/internal/sidecar/contract"
)

// Heartbeats count the sidecars that run; they cannot count the pods that run without one. A
// pod admitted while the injector was unavailable (its failurePolicy is Ignore), or of a
// workload that was never opted in, serves its traffic unlimited, or refuses it where the
// Service targets the sidecar's port. So the controller also looks at the pods a policy
// selects: a Ready pod without the sidecar container makes the policy Enforced=False with
// reason PodsWithoutSidecar, an Event and the policy's series on /metrics. The manager's cache
// keeps of each pod only what this needs (slimPod).

// maxUnguardedNamed is how many pods without a sidecar a condition names; the count is whole.
const maxUnguardedNamed = 3

// maxPodPairs bounds the (policy, pod) pairs one namespace's check looks at: a tenant owns the
// number of both. Pairs past it are not checked.
const maxPodPairs = 100_000

// unguarded is what a policy's condition says of the Ready pods it selects that have no
// sidecar.
type unguarded struct {
	count int
	named []string
}

// message is the condition's message for u.
func (u unguarded) message() string {
	msg := strings.Join(u.named, ", ")
	if u.count > len(u.named) {
		msg += fmt.Sprintf(" and %d more", u.count-len(u.named))
	}
	return loop.Message(fmt.Sprintf("%d Ready pod(s) this policy selects run without the Redline sidecar, so their traffic is not limited: %s. "+
		"They were admitted while the injector was unavailable, or their workload is not opted in (pod template annotation %s: \"true\"); "+
		"restart them once it is (kubectl rollout restart)", u.count, msg, contract.AnnotationInject))
}

// hasSidecar reports whether the pod runs Redline's container, as a native sidecar (an init
// container) or as an ordinary one.
func hasSidecar(p *corev1.Pod) bool {
	is := func(c corev1.Container) bool { return c.Name == contract.ContainerName }
	return slices.ContainsFunc(p.Spec.InitContainers, is) || slices.ContainsFunc(p.Spec.Containers, is)
}

// podReady reports whether the pod is Ready, so that a Service sends it traffic, and not
// being deleted.
func podReady(p *corev1.Pod) bool {
	if p.DeletionTimestamp != nil || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// podsWithoutSidecar lists, for each of policies, the Ready pods it selects that have no
// sidecar. Pure: pods are the namespace's.
func podsWithoutSidecar(policies []*v1alpha1.RateLimitPolicy, pods []corev1.Pod) []unguarded {
	out := make([]unguarded, len(policies))
	var bare []*corev1.Pod
	for i := range pods {
		if podReady(&pods[i]) && !hasSidecar(&pods[i]) {
			bare = append(bare, &pods[i])
		}
	}
	if len(bare) == 0 {
		return out
	}
	slices.SortFunc(bare, func(a, b *corev1.Pod) int { return strings.Compare(a.Name, b.Name) })
	pairs := 0
	for i, p := range policies {
		sel, err := metav1.LabelSelectorAsSelector(&p.Spec.TargetSelector)
		if err != nil {
			continue
		}
		for _, pod := range bare {
			if pairs++; pairs > maxPodPairs {
				return out
			}
			if !sel.Matches(labels.Set(pod.Labels)) {
				continue
			}
			out[i].count++
			if len(out[i].named) < maxUnguardedNamed {
				out[i].named = append(out[i].named, pod.Name)
			}
		}
	}
	return out
}

// unguardedPods reads the namespace's pods from the cache and checks them against the policies
// of outcomes. An error listing leaves every policy without a finding: the next resync tries
// again.
func (r *NamespaceReconciler) unguardedPods(ctx context.Context, ns string, outcomes []outcome) ([]unguarded, error) {
	policies := make([]*v1alpha1.RateLimitPolicy, len(outcomes))
	for i := range outcomes {
		policies[i] = outcomes[i].policy
	}
	var pods corev1.PodList
	if err := r.List(ctx, &pods, client.InNamespace(ns), client.UnsafeDisableDeepCopy); err != nil {
		return make([]unguarded, len(outcomes)), fmt.Errorf("listing pods of %s: %w", ns, err)
	}
	return podsWithoutSidecar(policies, pods.Items), nil
}

// podMatters reports whether an event on p can change a policy's condition: only pods without
// the sidecar can, so the many events of injected pods (their status changes with every probe
// and restart) do not each cost a reconcile of their namespace; heartbeats follow those.
func podMatters(p *corev1.Pod) bool { return !hasSidecar(p) }

// podRequest maps an event on a pod without a sidecar to its namespace's request, where the
// namespace has policies (the cache answers); other namespaces' pods are none of Redline's.
func (r *NamespaceReconciler) podRequest(ctx context.Context, o client.Object) []reconcile.Request {
	p, ok := o.(*corev1.Pod)
	if !ok || !podMatters(p) {
		return nil
	}
	list := loop.NewPolicyList()
	if err := r.policyReader().List(ctx, list, client.InNamespace(p.Namespace), client.Limit(1)); err != nil || len(list.Items) == 0 {
		return nil
	}
	return namespaceRequest(ctx, o)
}

// slimPod keeps of a pod what podsWithoutSidecar reads: its identity and labels, whether it
// runs the sidecar (one container of that name, nothing of its spec), its phase and its Ready
// condition.
func slimPod(obj any) (any, error) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil
	}
	sidecar := hasSidecar(p)
	slimMeta(&p.ObjectMeta, boundedLabels(p.Labels), nil)
	p.Spec = corev1.PodSpec{}
	if sidecar {
		p.Spec.Containers = []corev1.Container{{Name: contract.ContainerName}}
	}
	st := corev1.PodStatus{Phase: p.Status.Phase}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			st.Conditions = []corev1.PodCondition{{Type: c.Type, Status: c.Status}}
		}
	}
	p.Status = st
	return p, nil
}

// podChanged lets through the pod events that can change what podsWithoutSidecar finds: a pod
// created or deleted, or one whose readiness, labels or sidecar changed.
var podChanged = predicate.Funcs{
	UpdateFunc: func(e event.UpdateEvent) bool {
		o, ok1 := e.ObjectOld.(*corev1.Pod)
		n, ok2 := e.ObjectNew.(*corev1.Pod)
		if !ok1 || !ok2 {
			return true
		}
		return podReady(o) != podReady(n) || hasSidecar(o) != hasSidecar(n) || !maps.Equal(o.Labels, n.Labels)
	},
}

// maxPodLabelBytes bounds what the cache keeps of one pod's labels: a tenant writes them, as
// many as an object holds (about 1.5 MB), on as many pods as its quota allows.
const maxPodLabelBytes = 4 << 10

// boundedLabels is lbls when they fit in maxPodLabelBytes, else those that fit, by key order:
// a selector on a label left out no longer matches the pod, which only hides the tenant's own
// pod from its own policy's check.
func boundedLabels(lbls map[string]string) map[string]string {
	size := 0
	for k, v := range lbls {
		size += len(k) + len(v)
	}
	if size <= maxPodLabelBytes {
		return lbls
	}
	keys := slices.Sorted(maps.Keys(lbls))
	out := map[string]string{}
	size = 0
	for _, k := range keys {
		if size += len(k) + len(lbls[k]); size > maxPodLabelBytes {
			break
		}
		out[k] = lbls[k]
	}
	return out
}
