package policies

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/redline-dev/redline/api/v1alpha1"
	"github.com/redline-dev/redline/internal/controller/loop"
	"github.com/redline-dev/redline/internal/sidecar/contract"
)

// A Service whose targetPort is the application's own port sends its traffic around the
// sidecar: the pods are injected, the sidecars heartbeat and apply the configuration, and
// nothing is limited. The heartbeats cannot tell, so the controller looks at the Services of
// the namespace: a port of a Service selecting an injected pod template a policy targets, whose
// targetPort is the template's redline.dev/upstream-port by number, makes the policy
// Enforced=False with reason
// ServiceBypassesSidecar. Ports that target the sidecar (its port name "redline", the listen
// port, or the name of the application's port, which the injector hands over to the sidecar)
// and ports that target anything else (a metrics port the policy never covered) are not
// reported.

// maxBypassesNamed is how many bypassing Service ports a condition names; the count is whole.
const maxBypassesNamed = 3

// maxBypassPairs bounds the (template, Service) pairs one policy's check looks at: a tenant
// owns the number of both in its namespace, and the namespace's reconcile must not grow with
// their product (10,000 Services and 1,000 templates would be ten million). Pairs past it are
// not checked.
const maxBypassPairs = 100_000

// injectedTemplate is what bypass detection needs of an injected workload's pod template.
type injectedTemplate struct {
	workload string // "Deployment checkout"
	labels   map[string]string
	upstream int32
	listen   int32
	ports    map[string]int32 // the template's container ports by name
}

// bypass is what a policy's condition says of the Service ports that go around its sidecars.
type bypass struct {
	count int
	named []string
}

// serviceBypasses lists, for a policy, the Service ports that target the application's port
// of an injected template it selects. Pure: services and templates are the namespace's.
func serviceBypasses(p *v1alpha1.RateLimitPolicy, templates []injectedTemplate, services []corev1.Service) bypass {
	sel, err := metav1.LabelSelectorAsSelector(&p.Spec.TargetSelector)
	if err != nil {
		return bypass{}
	}
	var found []string
	pairs := 0
	for _, t := range templates {
		if !sel.Matches(labels.Set(t.labels)) {
			continue
		}
		for _, svc := range services {
			if pairs++; pairs > maxBypassPairs {
				break
			}
			if len(svc.Spec.Selector) == 0 || !labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(t.labels)) {
				continue
			}
			for _, port := range svc.Spec.Ports {
				if port.Protocol != "" && port.Protocol != corev1.ProtocolTCP {
					continue
				}
				target := port.TargetPort
				if target.Type == intstr.Int && target.IntVal == 0 {
					target = intstr.FromInt32(port.Port) // unset: the Service's port
				}
				n, ok := t.resolve(target)
				if !ok || n != t.upstream {
					continue
				}
				found = append(found, fmt.Sprintf("Service %s port %d targets %s, the application's port %d of %s (its redline.dev/upstream-port); target port %q (%d) instead",
					svc.Name, port.Port, target.String(), t.upstream, t.workload, contract.ListenPortName, t.listen))
			}
		}
	}
	slices.Sort(found)
	found = slices.Compact(found)
	b := bypass{count: len(found), named: found}
	if len(b.named) > maxBypassesNamed {
		b.named = b.named[:maxBypassesNamed]
	}
	return b
}

// resolve is the container port a Service's targetPort reaches in pods of the template. The
// sidecar's own port names resolve to the sidecar; a name no container gives reaches nothing.
func (t injectedTemplate) resolve(target intstr.IntOrString) (int32, bool) {
	if target.Type == intstr.Int {
		return target.IntVal, true
	}
	switch target.StrVal {
	case contract.ListenPortName:
		return t.listen, true
	case contract.AdminPortName, contract.CheckPortName, contract.GRPCPortName:
		return 0, false
	}
	n, ok := t.ports[target.StrVal]
	return n, ok
}

// message is the condition's message for b.
func (b bypass) message() string {
	msg := strings.Join(b.named, "; ")
	if b.count > len(b.named) {
		msg += fmt.Sprintf("; and %d more", b.count-len(b.named))
	}
	return loop.Message(fmt.Sprintf("%d Service port(s) reach this policy's pods around the sidecar, so their traffic is not limited: %s", b.count, msg))
}

// injectedTemplates lists the pod templates of the namespace's injected Deployments,
// StatefulSets and ReplicaSets (those no Deployment owns), from the cache, which keeps of them
// their labels, Redline's annotations and their containers' named ports (see slimTemplate).
func (r *NamespaceReconciler) injectedTemplates(ctx context.Context, ns string) ([]injectedTemplate, error) {
	var out []injectedTemplate
	add := func(kind, name string, tmpl *corev1.PodTemplateSpec) {
		ann := tmpl.Annotations
		if ann[contract.AnnotationInject] != "true" {
			return
		}
		up, err := strconv.ParseInt(strings.TrimSpace(ann[contract.AnnotationUpstreamPort]), 10, 32)
		if err != nil || up < 1 {
			return // not injected: the webhook refuses a pod without a valid upstream port
		}
		listen := int64(contract.DefaultListenPort)
		if v, ok := ann[contract.AnnotationListenPort]; ok {
			if listen, err = strconv.ParseInt(strings.TrimSpace(v), 10, 32); err != nil {
				return
			}
		}
		t := injectedTemplate{workload: kind + " " + name, labels: tmpl.Labels, upstream: int32(up), listen: int32(listen), ports: map[string]int32{}}
		for _, c := range tmpl.Spec.Containers {
			for _, p := range c.Ports {
				switch {
				case p.Name == "":
				case p.ContainerPort == t.upstream:
					// The injector hands the name of the application's port to the
					// sidecar's listen port (podinject's port handover): a Service that
					// targets it by name reaches the sidecar.
					t.ports[p.Name] = t.listen
				default:
					t.ports[p.Name] = p.ContainerPort
				}
			}
		}
		out = append(out, t)
	}
	var deps appsv1.DeploymentList
	if err := r.List(ctx, &deps, client.InNamespace(ns), client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("listing deployments of %s: %w", ns, err)
	}
	for i := range deps.Items {
		add("Deployment", deps.Items[i].Name, &deps.Items[i].Spec.Template)
	}
	var sets appsv1.StatefulSetList
	if err := r.List(ctx, &sets, client.InNamespace(ns), client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("listing statefulsets of %s: %w", ns, err)
	}
	for i := range sets.Items {
		add("StatefulSet", sets.Items[i].Name, &sets.Items[i].Spec.Template)
	}
	var rss appsv1.ReplicaSetList
	if err := r.List(ctx, &rss, client.InNamespace(ns), client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("listing replicasets of %s: %w", ns, err)
	}
	for i := range rss.Items {
		if !loop.OwnedByDeployment(&rss.Items[i]) {
			add("ReplicaSet", rss.Items[i].Name, &rss.Items[i].Spec.Template)
		}
	}
	return out, nil
}

// bypasses computes, for each of outcomes, the Service ports around its sidecars. An error
// listing leaves every policy without a finding: detection is an aid, and the next resync
// tries again.
func (r *NamespaceReconciler) bypasses(ctx context.Context, ns string, outcomes []outcome) ([]bypass, error) {
	out := make([]bypass, len(outcomes))
	templates, err := r.injectedTemplates(ctx, ns)
	if err != nil || len(templates) == 0 {
		return out, err
	}
	var services corev1.ServiceList
	if err := r.List(ctx, &services, client.InNamespace(ns), client.UnsafeDisableDeepCopy); err != nil {
		return out, fmt.Errorf("listing services of %s: %w", ns, err)
	}
	for i := range outcomes {
		out[i] = serviceBypasses(outcomes[i].policy, templates, services.Items)
	}
	return out, nil
}
