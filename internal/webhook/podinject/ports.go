package podinject

import (
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/redline-dev/redline/internal/sidecar/contract"
)

// A Service that targets the application's port by name needs no change to go through the
// sidecar: the injector hands that name over. In an injected pod the sidecar's listen port
// takes the name of the application's upstream port too (it keeps its own, redline, for
// Services already moved to it), and the application's port loses it, so
// a Service with `targetPort: http` reaches the sidecar in injected pods and the application in
// pods without one. Rollout and rollback are then a restart of the workload; the Service never
// changes, and a pod never receives traffic on a port nobody listens on. The application's
// probes and lifecycle hooks that named the port are given its number, so they keep reaching
// the application, not the sidecar. A numeric targetPort keeps today's path: the Service is
// moved to the sidecar's port (its name redline, or its number) once every pod has its sidecar.

// portHandoverMutator hands the name of the application's upstream port to the sidecar's
// listen port (see above). It runs before the container mutator, on the injection's container,
// so that what the pod records as injected is what it runs.
type portHandoverMutator struct{}

func (portHandoverMutator) name() string { return "port-handover" }

func (portHandoverMutator) mutate(pod *corev1.Pod, inj *injection) error {
	name := handedOverName(pod, inj.upstream)
	if name == "" {
		return nil
	}
	for _, list := range [][]corev1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for i := range list {
			c := &list[i]
			if c.Name == contract.ContainerName {
				continue
			}
			for j := range c.Ports {
				if c.Ports[j].Name == name {
					c.Ports[j].Name = ""
				}
			}
			for _, p := range []*corev1.Probe{c.LivenessProbe, c.ReadinessProbe, c.StartupProbe} {
				if p != nil {
					numberHandler(&p.HTTPGet, &p.TCPSocket, name, inj.upstream)
				}
			}
			if l := c.Lifecycle; l != nil {
				for _, h := range []*corev1.LifecycleHandler{l.PostStart, l.PreStop} {
					if h != nil {
						numberHandler(&h.HTTPGet, &h.TCPSocket, name, inj.upstream)
					}
				}
			}
		}
	}
	for _, p := range inj.container.Ports {
		if p.Name == contract.ListenPortName {
			// Beside the port's own name, which Services moved to the sidecar target: the
			// pod then declares the listen port twice, which the API server admits with a
			// warning ("duplicate port definition").
			inj.container.Ports = append(inj.container.Ports, corev1.ContainerPort{Name: name, ContainerPort: p.ContainerPort, Protocol: p.Protocol})
			break
		}
	}
	return nil
}

// numberHandler makes an HTTP or TCP handler that names the port name reach it by number.
func numberHandler(get **corev1.HTTPGetAction, tcp **corev1.TCPSocketAction, name string, port int32) {
	if *get != nil && (*get).Port.Type == intstr.String && (*get).Port.StrVal == name {
		(*get).Port = intstr.FromInt32(port)
	}
	if *tcp != nil && (*tcp).Port.Type == intstr.String && (*tcp).Port.StrVal == name {
		(*tcp).Port = intstr.FromInt32(port)
	}
}

// handedOverName is the name the sidecar's listen port takes in pod: the name an application
// container gives its TCP port upstream, or, in a pod injected before (whose application port
// has lost its name), the name its sidecar's listen port already has. "" when the port has no
// name (or a name of the sidecar's own ports): the listen port keeps its name, redline.
func handedOverName(pod *corev1.Pod, upstream int32) string {
	reserved := []string{contract.ListenPortName, contract.AdminPortName, contract.CheckPortName, contract.GRPCPortName}
	for _, list := range [][]corev1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for _, c := range list {
			for _, p := range c.Ports {
				switch {
				case c.Name == contract.ContainerName && p.Name != "" && !slices.Contains(reserved, p.Name):
					return p.Name // handed over at an earlier admission
				case c.Name != contract.ContainerName && p.ContainerPort == upstream && p.Name != "" &&
					(p.Protocol == "" || p.Protocol == corev1.ProtocolTCP) && !slices.Contains(reserved, p.Name):
					return p.Name
				}
			}
		}
	}
	return ""
}
