package policies

import (
	"fmt"
	"runtime"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// realisticPod is a pod as a Deployment's ReplicaSet makes it and a kubelet reports it: an
// application container with env, probes, resources and mounts, the injected sidecar, managed
// fields and a full status.
func realisticPod(i int) *corev1.Pod {
	env := make([]corev1.EnvVar, 12)
	for j := range env {
		env[j] = corev1.EnvVar{Name: fmt.Sprintf("SETTING_%d", j), Value: "some-configuration-value"}
	}
	ctr := func(name string) corev1.Container {
		return corev1.Container{
			Name: name, Image: "registry.example/team/" + name + ":v1.2.3", Args: []string{"--port=8080", "--log-level=info"},
			Env:   env,
			Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}},
			Resources: corev1.ResourceRequirements{
				Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("128Mi")},
				Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("256Mi")},
			},
			ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/ready"}}},
			VolumeMounts:   []corev1.VolumeMount{{Name: "config", MountPath: "/etc/app"}, {Name: "token", MountPath: "/var/run/secrets"}},
		}
	}
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: fmt.Sprintf("checkout-7d9f8b6c5d-%05d", i), Namespace: "shop", UID: "0b5e2f1c-1111-2222-3333-444455556666",
			ResourceVersion: "123456789", Labels: map[string]string{"app": "checkout", "pod-template-hash": "7d9f8b6c5d"},
			Annotations:     map[string]string{"redline.dev/inject": "true", "redline.dev/upstream-port": "8080", "kubectl.kubernetes.io/restartedAt": "2026-12-01T10:00:00Z"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "checkout-7d9f8b6c5d"}},
			ManagedFields:   []metav1.ManagedFieldsEntry{{Manager: "kube-controller-manager", FieldsV1: metav1.NewFieldsV1(string(make([]byte, 2048)))}, {Manager: "kubelet", FieldsV1: metav1.NewFieldsV1(string(make([]byte, 1536)))}},
		},
		Spec: corev1.PodSpec{
			InitContainers: []corev1.Container{ctr("redline-sidecar")},
			Containers:     []corev1.Container{ctr("app")},
			Volumes:        []corev1.Volume{{Name: "config"}, {Name: "token"}},
			NodeName:       "node-1",
		},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.0.0.1", HostIP: "192.168.0.1"},
	}
	for _, t := range []corev1.PodConditionType{corev1.PodReady, corev1.ContainersReady, corev1.PodInitialized, corev1.PodScheduled} {
		p.Status.Conditions = append(p.Status.Conditions, corev1.PodCondition{Type: t, Status: corev1.ConditionTrue, LastTransitionTime: metav1.Now()})
	}
	for _, n := range []string{"redline-sidecar", "app"} {
		p.Status.ContainerStatuses = append(p.Status.ContainerStatuses, corev1.ContainerStatus{Name: n, Ready: true, Image: "registry.example/team/" + n + ":v1.2.3", ImageID: "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", ContainerID: "containerd://0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"})
	}
	return p
}

// BenchmarkPodCacheMemory reports what the manager's cache retains of 10,000 pods, slimmed
// (slimPod) and, beside it, whole: go test -run '^$' -bench PodCacheMemory ./internal/controller/policies/
func BenchmarkPodCacheMemory(b *testing.B) {
	const pods = 10_000
	for _, slim := range []bool{true, false} {
		b.Run(fmt.Sprintf("slim=%v", slim), func(b *testing.B) {
			var retained uint64
			for range b.N {
				var before, after runtime.MemStats
				runtime.GC()
				runtime.ReadMemStats(&before)
				store := make(map[string]*corev1.Pod, pods)
				for i := range pods {
					p := realisticPod(i)
					if slim {
						out, _ := slimPod(p)
						p = out.(*corev1.Pod)
					}
					store[p.Name] = p
				}
				runtime.GC()
				runtime.ReadMemStats(&after)
				retained = after.HeapAlloc - before.HeapAlloc
				runtime.KeepAlive(store)
			}
			b.ReportMetric(float64(retained)/(1<<20), "MiB/10k-pods")
			b.ReportMetric(float64(retained)/pods, "B/pod")
		})
	}
}
