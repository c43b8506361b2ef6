package podinject_test

import (
	"context"
	"encoding/json"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/redline-dev/redline/internal/sidecar/contract"
	"github.com/redline-dev/redline/internal/webhook/podinject"
)

// createAndGet creates pod through the API server (recording its warnings) and returns what
// was stored.
func createAndGet(pod *corev1.Pod) (*corev1.Pod, []string) {
	GinkgoHelper()
	ctx := context.Background()
	warnings.Take()
	Expect(warnK8s.Create(ctx, pod)).To(Succeed())
	got := warnings.Take()
	stored := &corev1.Pod{}
	Expect(k8s.Get(ctx, client.ObjectKeyFromObject(pod), stored)).To(Succeed())
	return stored, got
}

func sidecarCount(pod *corev1.Pod) int {
	n := 0
	for _, c := range append(append([]corev1.Container{}, pod.Spec.InitContainers...), pod.Spec.Containers...) {
		if c.Name == contract.ContainerName {
			n++
		}
	}
	return n
}

var _ = Describe("Pod injection through the API server", func() {
	const ns = "shop"
	BeforeEach(func() { createNamespace(ns) })

	It("injects a native sidecar into an annotated pod", func() {
		stored, warns := createAndGet(annotatedPod(ns, "checkout-1", contract.AnnotationFailureMode, contract.FailureModeClosed,
			contract.AnnotationSidecarMaxProcs, "2", contract.AnnotationRedisPoolSize, "8"))
		Expect(warns).To(BeEmpty())

		Expect(stored.Spec.InitContainers).NotTo(BeEmpty())
		sc := stored.Spec.InitContainers[0]
		Expect(sc.Name).To(Equal(contract.ContainerName))
		Expect(sc.RestartPolicy).To(Equal(ptr.To(corev1.ContainerRestartPolicyAlways)))
		Expect(sc.Image).To(Equal("example.test/redline-sidecar:v0.1.0"))
		Expect(sc.Args).To(ConsistOf(
			"--listen=:8000", "--upstream=127.0.0.1:8080", "--admin-listen=:9091",
			"--check-listen=127.0.0.1:9093", "--grpc-listen=127.0.0.1:9092",
			"--config-dir=/etc/redline/policies", "--pod-labels=/etc/redline/podinfo/labels",
			"--failure-mode=Closed", "--max-procs=2", "--redis-pool-size=8",
			"--redis-credentials-dir=/etc/redline/redis"), "the decision faces stay on loopback")
		Expect(sc.Ports).To(ContainElement(And(
			HaveField("Name", contract.ListenPortName), HaveField("ContainerPort", int32(8000)))))
		Expect(sc.Ports).NotTo(ContainElement(HaveField("Name", contract.GRPCPortName)), "a loopback port is not a pod port")
		Expect(sc.Ports).NotTo(ContainElement(HaveField("Name", contract.CheckPortName)))
		Expect(sc.ReadinessProbe.HTTPGet.Path).To(Equal("/readyz"))
		Expect(sc.LivenessProbe.HTTPGet.Path).To(Equal("/healthz"))
		Expect(sc.SecurityContext.ReadOnlyRootFilesystem).To(Equal(new(true)))
		Expect(sc.SecurityContext.RunAsUser).To(Equal(ptr.To[int64](65532)))
		Expect(stored.Spec.Containers).To(HaveLen(1), "the application container stays alone")
		Expect(stored.Spec.Volumes).To(ContainElements(
			HaveField("Name", contract.PoliciesVolume), HaveField("Name", contract.PodInfoVolume), HaveField("Name", "data")))
		// The namespace's Redis credentials: a mounted Secret (it follows rotations), optional
		// (pods start before the controller writes it), and no password in the environment.
		Expect(stored.Spec.Volumes).To(ContainElement(SatisfyAll(
			HaveField("Name", contract.RedisCredentialsVolume),
			HaveField("Secret.SecretName", "redline-redis"), HaveField("Secret.Optional", new(true)))))
		Expect(sc.VolumeMounts).To(ContainElement(SatisfyAll(
			HaveField("Name", contract.RedisCredentialsVolume), HaveField("MountPath", contract.RedisCredentialsDir), HaveField("ReadOnly", true))))
		Expect(sc.Env).NotTo(ContainElement(HaveField("Name", contract.EnvRedisPassword)))
		Expect(sc.Env).To(ContainElement(SatisfyAll(HaveField("Name", contract.EnvPodNamespace),
			HaveField("ValueFrom.FieldRef.FieldPath", "metadata.namespace"))), "the sidecar's namespace comes from its pod")

		var status podinject.InjectedStatus
		Expect(json.Unmarshal([]byte(stored.Annotations[contract.AnnotationInjected]), &status)).To(Succeed())
		Expect(status.Native).To(BeTrue())
		Expect(status.Version).To(Equal(podinject.InjectedVersion))
		Expect(status.Hash).NotTo(BeEmpty())
	})

	It("serves the decision faces on the pod network only when the pod opts in", func() {
		stored, warns := createAndGet(annotatedPod(ns, "checkout-exposed", contract.AnnotationExposeDecisionAPI, "true"))
		Expect(warns).To(BeEmpty())
		sc := stored.Spec.InitContainers[0]
		Expect(sc.Args).To(ContainElements("--check-listen=:9093", "--grpc-listen=:9092"))
		Expect(sc.Ports).To(ContainElements(
			And(HaveField("Name", contract.CheckPortName), HaveField("ContainerPort", int32(contract.CheckPort))),
			And(HaveField("Name", contract.GRPCPortName), HaveField("ContainerPort", int32(contract.GRPCPort)))))
	})

	It("injects pods created from a generateName, as a Deployment's are", func() {
		pod := annotatedPod(ns, "")
		pod.GenerateName = "checkout-"
		stored, warns := createAndGet(pod)
		Expect(warns).To(BeEmpty())
		Expect(sidecarCount(stored)).To(Equal(1))
	})

	It("leaves a pod without the opt-in annotation untouched", func() {
		pod := plainPod(ns, "plain-1")
		pod.Annotations = map[string]string{contract.AnnotationUpstreamPort: "8080"}
		stored, warns := createAndGet(pod)
		Expect(warns).To(BeEmpty())
		Expect(sidecarCount(stored)).To(BeZero())
		Expect(stored.Spec.Volumes).To(HaveLen(1))
		Expect(stored.Annotations).NotTo(HaveKey(contract.AnnotationInjected))

		off, warns := createAndGet(annotatedPod(ns, "opted-out", contract.AnnotationInject, "false"))
		Expect(warns).To(BeEmpty())
		Expect(sidecarCount(off)).To(BeZero())
	})

	It("does not inject twice a pod that is already injected", func() {
		first, _ := createAndGet(annotatedPod(ns, "twice-1"))
		again := first.DeepCopy()
		again.ObjectMeta = *again.ObjectMeta.DeepCopy()
		again.Name, again.ResourceVersion, again.UID, again.CreationTimestamp = "twice-2", "", "", first.CreationTimestamp
		again.ManagedFields = nil
		stored, warns := createAndGet(again)
		Expect(warns).To(BeEmpty())
		Expect(sidecarCount(stored)).To(Equal(1))
		Expect(stored.Spec.Volumes).To(HaveLen(len(first.Spec.Volumes)))
		Expect(stored.Annotations[contract.AnnotationInjected]).To(Equal(first.Annotations[contract.AnnotationInjected]))
	})

	DescribeTable("admits a pod with bad annotations unchanged, with a warning saying why",
		func(wantWarning string, kv ...string) {
			stored, warns := createAndGet(annotatedPod(ns, "", kv...))
			Expect(sidecarCount(stored)).To(BeZero())
			Expect(stored.Spec.Volumes).To(HaveLen(1))
			Expect(stored.Annotations).NotTo(HaveKey(contract.AnnotationInjected))
			Expect(warns).To(ConsistOf(And(HavePrefix(podinject.WarningPrefix), ContainSubstring(wantWarning))))
		},
		Entry("missing upstream port", "redline.dev/upstream-port is missing",
			contract.AnnotationUpstreamPort, ""),
		Entry("non-numeric upstream port", `redline.dev/upstream-port="http"`,
			contract.AnnotationUpstreamPort, "http"),
		Entry("upstream port out of range", `redline.dev/upstream-port="70000"`,
			contract.AnnotationUpstreamPort, "70000"),
		Entry("zero upstream port", `redline.dev/upstream-port="0"`,
			contract.AnnotationUpstreamPort, "0"),
		Entry("listen port equal to upstream", "cannot listen on the same port",
			contract.AnnotationListenPort, "8080"),
		Entry("invalid listen port", `redline.dev/listen-port="-1"`,
			contract.AnnotationListenPort, "-1"),
		Entry("upstream on the admin port", "taken by the sidecar",
			contract.AnnotationUpstreamPort, "9091"),
		Entry("listen on the Envoy rate limit service port", "taken by the sidecar",
			contract.AnnotationListenPort, "9092"),
		Entry("bad failure mode", `redline.dev/failure-mode="open"`,
			contract.AnnotationFailureMode, "open"),
		Entry("unknown upstream protocol", `redline.dev/upstream-protocol="grpc": want one of HTTP1, H2C, HTTPS`,
			contract.AnnotationUpstreamProtocol, "grpc"),
		Entry("bad cpu", `redline.dev/sidecar-cpu="lots"`,
			contract.AnnotationSidecarCPU, "lots"),
		Entry("negative memory", `redline.dev/sidecar-memory="-64Mi"`,
			contract.AnnotationSidecarMemory, "-64Mi"),
		Entry("zero max procs", `redline.dev/sidecar-max-procs="0"`,
			contract.AnnotationSidecarMaxProcs, "0"),
		Entry("fractional max procs", `redline.dev/sidecar-max-procs="1.5"`,
			contract.AnnotationSidecarMaxProcs, "1.5"),
		Entry("redis pool below the floor", `redline.dev/redis-pool-size="1"`,
			contract.AnnotationRedisPoolSize, "1"),
		Entry("redis pool not a number", `redline.dev/redis-pool-size="many"`,
			contract.AnnotationRedisPoolSize, "many"),
		Entry("listen on the decision API port", "taken by the sidecar",
			contract.AnnotationListenPort, "9093"),
		Entry("decision API exposure not a boolean", `redline.dev/expose-decision-api="yes"`,
			contract.AnnotationExposeDecisionAPI, "yes"),
	)

	It("warns when the listen port is taken by an application container", func() {
		pod := annotatedPod(ns, "taken-1")
		pod.Spec.Containers[0].Ports = append(pod.Spec.Containers[0].Ports, corev1.ContainerPort{ContainerPort: 8000})
		stored, warns := createAndGet(pod)
		Expect(sidecarCount(stored)).To(BeZero())
		Expect(warns).To(ConsistOf(ContainSubstring(`already declared by container "app"`)))
	})

	DescribeTable("leaves excluded namespaces alone",
		func(namespace string) {
			createNamespace(namespace)
			stored, warns := createAndGet(annotatedPod(namespace, "excluded-1"))
			Expect(warns).To(BeEmpty())
			Expect(sidecarCount(stored)).To(BeZero())
			Expect(stored.Annotations).NotTo(HaveKey(contract.AnnotationInjected))
		},
		Entry("kube-system", "kube-system"),
		Entry("the operator's namespace", "redline-system"),
	)
})
