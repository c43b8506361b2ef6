package podinject_test

import (
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/redline-dev/redline/internal/sidecar/contract"
)

var _ = Describe("Port handover", func() {
	const ns = "handover"
	BeforeEach(func() { createNamespace(ns) })

	It("gives the application port's name to the sidecar, so a Service by that name reaches the sidecar in injected pods only", func() {
		pod := annotatedPod(ns, "named")
		app := &pod.Spec.Containers[0]
		app.Ports = []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}, {Name: "metrics", ContainerPort: 9090}}
		app.ReadinessProbe = &corev1.Probe{ProbeHandler: corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromString("http")}}}
		app.LivenessProbe = &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/live", Port: intstr.FromString("metrics")}}}
		app.StartupProbe = &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/start", Port: intstr.FromString("http")}}}
		app.Lifecycle = &corev1.Lifecycle{PreStop: &corev1.LifecycleHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/drain", Port: intstr.FromString("http")}}}

		stored, warns := createAndGet(pod)
		Expect(warns).To(ConsistOf(MatchRegexp(`^spec\.initContainers\[0\]\.ports\[\d\]: duplicate port definition with spec\.initContainers\[0\]\.ports\[0\]$`)),
			"the listen port under its own name and the application's")

		sc := stored.Spec.InitContainers[0]
		Expect(sc.Name).To(Equal(contract.ContainerName))
		Expect(sc.Ports).To(ContainElements(
			And(HaveField("Name", contract.ListenPortName), HaveField("ContainerPort", int32(contract.DefaultListenPort))),
			And(HaveField("Name", "http"), HaveField("ContainerPort", int32(contract.DefaultListenPort)), HaveField("Protocol", corev1.ProtocolTCP))))
		a := stored.Spec.Containers[0]
		Expect(a.Ports).To(ConsistOf(
			And(HaveField("Name", ""), HaveField("ContainerPort", int32(8080))),
			And(HaveField("Name", "metrics"), HaveField("ContainerPort", int32(9090)))), "only the upstream port's name moves")
		Expect(a.ReadinessProbe.TCPSocket.Port).To(Equal(intstr.FromInt32(8080)), "probes keep reaching the application")
		Expect(a.StartupProbe.HTTPGet.Port).To(Equal(intstr.FromInt32(8080)))
		Expect(a.Lifecycle.PreStop.HTTPGet.Port).To(Equal(intstr.FromInt32(8080)))
		Expect(a.LivenessProbe.HTTPGet.Port).To(Equal(intstr.FromString("metrics")), "another port's name stays")

		// What the endpoints controller does with targetPort "http": the first container port
		// of that name, in the containers, then in the native sidecars.
		Expect(namedPort(stored, "http")).To(Equal(int32(contract.DefaultListenPort)), "injected: the sidecar")
		Expect(namedPort(plainNamed(ns), "http")).To(Equal(int32(8080)), "without a sidecar: the application")
	})

	It("leaves the names alone where the upstream port has none, or is not TCP", func() {
		stored, warns := createAndGet(annotatedPod(ns, "unnamed"))
		Expect(warns).To(BeEmpty())
		Expect(stored.Spec.InitContainers[0].Ports).NotTo(ContainElement(HaveField("Name", "http")))

		udp := annotatedPod(ns, "udp")
		udp.Spec.Containers[0].Ports = []corev1.ContainerPort{{Name: "dns", ContainerPort: 8080, Protocol: corev1.ProtocolUDP}}
		stored, warns = createAndGet(udp)
		Expect(warns).To(BeEmpty())
		Expect(stored.Spec.Containers[0].Ports[0].Name).To(Equal("dns"))
	})
})

// plainNamed is an uninjected pod whose application port is named http.
func plainNamed(ns string) *corev1.Pod {
	p := plainPod(ns, "plain-named")
	p.Spec.Containers[0].Ports[0].Name = "http"
	return p
}

// namedPort resolves a Service's targetPort name in pod as the endpoints controller does.
func namedPort(pod *corev1.Pod, name string) int32 {
	for _, c := range pod.Spec.Containers {
		for _, p := range c.Ports {
			if p.Name == name {
				return p.ContainerPort
			}
		}
	}
	for _, c := range pod.Spec.InitContainers {
		if c.RestartPolicy == nil || *c.RestartPolicy != corev1.ContainerRestartPolicyAlways {
			continue
		}
		for _, p := range c.Ports {
			if p.Name == name {
				return p.ContainerPort
			}
		}
	}
	return 0
}
