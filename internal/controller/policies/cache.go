package policies

import (
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redline-dev/redline/internal/controller/loop"
	"github.com/redline-dev/redline/internal/policydoc"
)

// SlimByObject is the manager cache's options by object. The manager caches what tenants write (their ConfigMap, Deployments, StatefulSets,
// ReplicaSets and HPAs), so each cached object keeps only what the manager reads, and its size
// no longer grows with what a tenant puts in it: pod template specs, status, managed fields,
// annotations such as kubectl's last-applied copy of the whole object, ConfigMap content. The
// transforms run before an object enters the cache; docs/design/tenant-isolation.md gives the bytes per object.
func SlimByObject() map[client.Object]cache.ByObject {
	return map[client.Object]cache.ByObject{
		// Only the ConfigMap the controller writes, by name: any other ConfigMap a tenant
		// labels app.kubernetes.io/managed-by=redline stays out.
		&corev1.ConfigMap{}: {
			Field:     fields.OneTermEqualSelector("metadata.name", policydoc.ConfigMapName),
			Transform: slimConfigMap,
		},
		&appsv1.Deployment{}:                     {Transform: slimWorkload},
		&appsv1.StatefulSet{}:                    {Transform: slimWorkload},
		&appsv1.ReplicaSet{}:                     {Transform: slimWorkload},
		&autoscalingv2.HorizontalPodAutoscaler{}: {Transform: slimHPA},
		&corev1.Service{}:                        {Transform: slimService},
		&corev1.Pod{}:                            {Transform: slimPod},
		// Namespaces by their labels, which RedisBackends select by.
		&corev1.Namespace{}: {Transform: slimNamespace},
	}
}

// maxTemplatePorts and maxServicePorts bound what the cache keeps of a pod template's named
// container ports and of a Service's ports (bypass detection): a tenant can list thousands.
// Ports past the bound are not checked for going around the sidecar.
const (
	maxTemplatePorts = 64
	maxServicePorts  = 64
)

// slimNamespace keeps a Namespace's name and labels.
func slimNamespace(obj any) (any, error) {
	if ns, ok := obj.(*corev1.Namespace); ok {
		slimMeta(&ns.ObjectMeta, ns.Labels, nil)
		ns.Spec, ns.Status = corev1.NamespaceSpec{}, corev1.NamespaceStatus{}
	}
	return obj, nil
}

// slimService keeps a Service's selector and its ports' protocol, number and target.
func slimService(obj any) (any, error) {
	if svc, ok := obj.(*corev1.Service); ok {
		slimMeta(&svc.ObjectMeta, nil, nil)
		ports := make([]corev1.ServicePort, 0, min(len(svc.Spec.Ports), maxServicePorts))
		for _, p := range svc.Spec.Ports[:min(len(svc.Spec.Ports), maxServicePorts)] {
			ports = append(ports, corev1.ServicePort{Protocol: p.Protocol, Port: p.Port, TargetPort: p.TargetPort})
		}
		svc.Spec = corev1.ServiceSpec{Selector: svc.Spec.Selector, Ports: ports}
		svc.Status = corev1.ServiceStatus{}
	}
	return obj, nil
}

// slimMeta keeps the metadata the manager reads: identity, version, generation, owners,
// deletion, and of labels and annotations only those given.
func slimMeta(m *metav1.ObjectMeta, labels, annotations map[string]string) {
	*m = metav1.ObjectMeta{
		Name: m.Name, Namespace: m.Namespace, UID: m.UID, ResourceVersion: m.ResourceVersion,
		Generation: m.Generation, CreationTimestamp: m.CreationTimestamp,
		DeletionTimestamp: m.DeletionTimestamp, OwnerReferences: m.OwnerReferences,
		Labels: labels, Annotations: annotations,
	}
}

// slimConfigMap keeps the ConfigMap's identity, the label and hash annotation the controller
// writes, immutable, and in place of its content the content's digest (contentDigestAnnotation),
// which is all the controller compares with what it would write.
func slimConfigMap(obj any) (any, error) {
	cm, ok := obj.(*corev1.ConfigMap)
	if !ok {
		return obj, nil
	}
	var labels map[string]string
	if v, ok := cm.Labels[loop.ManagedByLabel]; ok {
		labels = map[string]string{loop.ManagedByLabel: v}
	}
	annotations := map[string]string{contentDigestAnnotation: contentDigest(cm.Data, cm.BinaryData)}
	if v, ok := cm.Annotations[HashAnnotation]; ok {
		annotations[HashAnnotation] = v
	}
	slimMeta(&cm.ObjectMeta, labels, annotations)
	cm.Data, cm.BinaryData = nil, nil
	return cm, nil
}

// redlineAnnotations keeps the pod template annotations of Redline's own prefix.
func redlineAnnotations(ann map[string]string) map[string]string {
	var out map[string]string
	for k, v := range ann {
		if strings.HasPrefix(k, "redline.dev/") {
			if out == nil {
				out = map[string]string{}
			}
			out[k] = v
		}
	}
	return out
}

// slimTemplate keeps the pod template's labels (matched against policies' targetSelectors),
// Redline's annotations (injection, pool size, ports) and, in one container, up to
// maxTemplatePorts of its containers' named ports (a Service's named targetPort, see bypass.go).
func slimTemplate(t *corev1.PodTemplateSpec) {
	var ports []corev1.ContainerPort
	for _, c := range t.Spec.Containers {
		for _, p := range c.Ports {
			if p.Name != "" && len(ports) < maxTemplatePorts {
				ports = append(ports, corev1.ContainerPort{Name: p.Name, ContainerPort: p.ContainerPort})
			}
		}
	}
	*t = corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{
		Labels: t.Labels, Annotations: redlineAnnotations(t.Annotations),
	}}
	if len(ports) > 0 {
		t.Spec.Containers = []corev1.Container{{Name: "ports", Ports: ports}}
	}
}

// slimWorkload keeps of a Deployment, StatefulSet or ReplicaSet what the connection budget and
// the injector read: metadata, spec.replicas and the slimmed pod template.
func slimWorkload(obj any) (any, error) {
	switch w := obj.(type) {
	case *appsv1.Deployment:
		slimMeta(&w.ObjectMeta, nil, nil)
		slimTemplate(&w.Spec.Template)
		w.Spec = appsv1.DeploymentSpec{Replicas: w.Spec.Replicas, Template: w.Spec.Template}
		w.Status = appsv1.DeploymentStatus{}
	case *appsv1.StatefulSet:
		slimMeta(&w.ObjectMeta, nil, nil)
		slimTemplate(&w.Spec.Template)
		w.Spec = appsv1.StatefulSetSpec{Replicas: w.Spec.Replicas, Template: w.Spec.Template}
		w.Status = appsv1.StatefulSetStatus{}
	case *appsv1.ReplicaSet:
		slimMeta(&w.ObjectMeta, nil, nil)
		slimTemplate(&w.Spec.Template)
		w.Spec = appsv1.ReplicaSetSpec{Replicas: w.Spec.Replicas, Template: w.Spec.Template}
		w.Status = appsv1.ReplicaSetStatus{}
	}
	return obj, nil
}

// slimHPA keeps the scale target and the replica bounds.
func slimHPA(obj any) (any, error) {
	if h, ok := obj.(*autoscalingv2.HorizontalPodAutoscaler); ok {
		slimMeta(&h.ObjectMeta, nil, nil)
		h.Spec = autoscalingv2.HorizontalPodAutoscalerSpec{
			ScaleTargetRef: h.Spec.ScaleTargetRef, MinReplicas: h.Spec.MinReplicas, MaxReplicas: h.Spec.MaxReplicas,
		}
		h.Status = autoscalingv2.HorizontalPodAutoscalerStatus{}
	}
	return obj, nil
}
