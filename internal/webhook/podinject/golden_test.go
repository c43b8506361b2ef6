package podinject_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/redline-dev/redline/internal/sidecar/app"
	"github.com/redline-dev/redline/internal/sidecar/contract"
	"github.com/redline-dev/redline/internal/webhook/podinject"
)

// expectGolden compares got with testdata/name, or rewrites the file under -update.
func expectGolden(name string, got any) {
	GinkgoHelper()
	data, err := yaml.Marshal(got)
	Expect(err).NotTo(HaveOccurred())
	path := filepath.Join("testdata", name)
	if *update {
		Expect(os.WriteFile(path, data, 0o644)).To(Succeed())
	}
	want, err := os.ReadFile(path)
	Expect(err).NotTo(HaveOccurred(), "golden file missing: run go test with -update to create it")
	Expect(string(data)).To(Equal(string(want)), "output differs from %s (go test -update rewrites it)", path)
}

// storedView keeps what the API server stored of a pod that is stable from run to run.
func storedView(pod *corev1.Pod) map[string]any {
	return map[string]any{"annotations": pod.Annotations, "spec": pod.Spec}
}

var _ = Describe("Injected spec", func() {
	const ns = "golden"
	BeforeEach(func() { createNamespace(ns) })

	DescribeTable("matches the golden files, is accepted by the API server and is injected only once",
		func(mode string, native bool, cfg podinject.Config, extra ...string) {
			ctx := context.Background()
			pod := annotatedPod(ns, "checkout-"+mode, extra...)
			// A named application port, with a probe naming it: the sidecar's port takes the name.
			pod.Spec.Containers[0].Ports[0].Name = "http"
			pod.Spec.Containers[0].ReadinessProbe = &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/ready", Port: intstr.FromString("http")}}}
			if mode == "workload" {
				// A Deployment's pod, as its ReplicaSet creates it.
				pod.Labels = map[string]string{appsv1.DefaultDeploymentUniqueLabelKey: "5d8f"}
				pod.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "checkout-5d8f", UID: "u", Controller: new(true)}}
			}
			in := podinject.NewInjector(cfg, native)

			out, warns, err := in.Inject(ctx, pod)
			Expect(warns).To(BeEmpty())
			Expect(err).NotTo(HaveOccurred())
			Expect(pod.Annotations).NotTo(HaveKey(contract.AnnotationInjected), "the input pod must not be modified")
			expectGolden(mode+".golden.yaml", out)

			By("injecting the injected pod again: nothing changes")
			again, _, err := in.Inject(ctx, out)
			Expect(err).To(MatchError(podinject.ErrSkipped))
			Expect(again).To(BeIdenticalTo(out))

			By("running the mutators on an injected pod that lost its status annotation: nothing is duplicated")
			stripped := out.DeepCopy()
			delete(stripped.Annotations, contract.AnnotationInjected)
			redone, _, err := in.Inject(ctx, stripped)
			Expect(err).NotTo(HaveOccurred())
			Expect(redone).To(Equal(out))

			By("creating the injected pod: the API server accepts it and the webhook leaves it alone")
			created := out.DeepCopy()
			Expect(k8s.Create(ctx, created)).To(Succeed())
			stored := &corev1.Pod{}
			Expect(k8s.Get(ctx, client.ObjectKeyFromObject(created), stored)).To(Succeed())
			expectGolden(mode+".stored.golden.yaml", storedView(stored))
		},
		Entry("native sidecar", "native", true, testConfig(podinject.NativeSidecarsAuto)),
		Entry("regular container", "regular", false, testConfig(podinject.NativeSidecarsAuto)),
		Entry("every annotation set", "overrides", true, testConfig(podinject.NativeSidecarsAuto),
			contract.AnnotationListenPort, "8001",
			contract.AnnotationUpstreamProtocol, contract.UpstreamProtocolH2C,
			contract.AnnotationFailureMode, contract.FailureModeLocalFallback,
			contract.AnnotationSidecarCPU, "200m",
			contract.AnnotationSidecarMemory, "96Mi",
			contract.AnnotationExposeDecisionAPI, "true",
			contract.AnnotationTrustedHops, "2"),
		Entry("every manager default set", "defaults", true, defaultsConfig()),
		Entry("Redis over TLS with a client certificate", "tls", true, tlsConfig()),
		Entry("a RedisBackend's namespace, over TLS: its settings from the namespace's ConfigMap", "backend", true, backendConfig()),
		Entry("a Deployment's pod: its pool and replicas from its workload's keys of the namespace's ConfigMap", "workload", true, defaultsConfig()),
		Entry("annotations over the manager's defaults", "defaults-overridden", true, defaultsConfig(),
			contract.AnnotationFailureMode, contract.FailureModeOpen,
			contract.AnnotationSidecarCPU, "200m",
			contract.AnnotationSidecarMemory, "48Mi",
			contract.AnnotationSidecarMaxProcs, "4",
			contract.AnnotationRedisPoolSize, "6",
			contract.AnnotationTrustedHops, "0"),
	)
})

// defaultsConfig is testConfig with every cluster-wide sidecar default set, as the manager's
// --sidecar-* flags set them.
func defaultsConfig() podinject.Config {
	cfg := testConfig(podinject.NativeSidecarsAuto)
	cfg.SidecarFailureMode = contract.FailureModeClosed
	cfg.DefaultCPURequest = resource.MustParse("100m")
	cfg.DefaultMemoryRequest = resource.MustParse("96Mi")
	cfg.DefaultMemoryLimit = resource.MustParse("128Mi")
	cfg.SidecarMaxProcs = 2
	cfg.SidecarRedisPoolSize = 24
	cfg.SidecarLeaseKeys = 4096
	cfg.SidecarLeaseHorizon = new(time.Duration(0))
	cfg.SidecarRedisTimeout = 100 * time.Millisecond
	cfg.SidecarTrustedHops = 1
	return cfg
}

// tlsConfig is testConfig for a rediss:// Redis that requires client certificates, verified
// under one name at TLS 1.3, as the manager's --sidecar-redis-tls-* flags set it.
func tlsConfig() podinject.Config {
	cfg := testConfig(podinject.NativeSidecarsAuto)
	cfg.RedisURL = "rediss://redis.redline-system.svc:6380"
	cfg.SidecarRedisTLS = podinject.SidecarTLS{Secret: "redline-redis-tls", ClientCertificate: true, ServerName: "redis.redline-system.svc", MinVersion: "1.3"}
	return cfg
}

// backendConfig is tlsConfig for pods of a namespace a RedisBackend over TLS serves.
func backendConfig() podinject.Config {
	cfg := tlsConfig()
	cfg.Backends = backendOf{URL: "rediss://orders.redis:6380", Backend: true, TLSServerName: "orders.internal"}
	return cfg
}

// sidecarOf is the injected sidecar container of pod.
func sidecarOf(pod *corev1.Pod) corev1.Container {
	GinkgoHelper()
	for _, c := range append(append([]corev1.Container{}, pod.Spec.InitContainers...), pod.Spec.Containers...) {
		if c.Name == contract.ContainerName {
			return c
		}
	}
	Fail("no sidecar injected")
	return corev1.Container{}
}

func injectedStatus(pod *corev1.Pod) podinject.InjectedStatus {
	GinkgoHelper()
	var st podinject.InjectedStatus
	Expect(json.Unmarshal([]byte(pod.Annotations[contract.AnnotationInjected]), &st)).To(Succeed())
	return st
}

var _ = Describe("The manager's cluster-wide sidecar defaults", func() {
	const ns = "defaults"
	BeforeEach(func() { createNamespace(ns) })

	It("reach every pod that does not set them, and are recorded in the status annotation", func(ctx SpecContext) {
		out, _, err := podinject.NewInjector(defaultsConfig(), true).Inject(ctx, annotatedPod(ns, "plain"))
		Expect(err).NotTo(HaveOccurred())
		c := sidecarOf(out)
		Expect(c.Args).To(ContainElements("--failure-mode=Closed", "--max-procs=2", "--redis-pool-size=24",
			"--lease-keys=4096", "--lease-horizon=0s", "--redis-timeout=100ms", "--trusted-hops=1"))
		Expect(c.Resources.Requests.Cpu().String()).To(Equal("100m"))
		Expect(c.Resources.Requests.Memory().String()).To(Equal("96Mi"))
		Expect(c.Resources.Limits.Memory().String()).To(Equal("128Mi"))
		Expect(injectedStatus(out).Defaults).To(Equal(map[string]string{
			"sidecar-failure-mode": "Closed", "sidecar-cpu-request": "100m", "sidecar-memory-request": "96Mi",
			"sidecar-memory-limit": "128Mi", "sidecar-max-procs": "2", "sidecar-redis-pool-size": "24",
			"sidecar-lease-keys": "4096", "sidecar-lease-horizon": "0s", "sidecar-redis-timeout": "100ms",
			"sidecar-trusted-hops": "1",
		}))
		Expect(k8s.Create(ctx, out)).To(Succeed(), "the API server accepts the pod")

		By("the sidecar accepts the injected flags and runs with them")
		env := map[string]string{contract.EnvRedisURL: testConfig("").RedisURL, contract.EnvPodNamespace: ns}
		sc, err := app.ParseConfig(c.Args, func(k string) string { return env[k] }, GinkgoWriter)
		Expect(err).NotTo(HaveOccurred())
		Expect(sc.FailureMode).To(Equal(contract.FailureModeClosed))
		Expect(sc.MaxProcs).To(Equal(2))
		Expect(sc.RedisPoolSize).To(Equal(24))
		Expect(sc.LeaseKeys).To(Equal(4096))
		Expect(sc.LeaseHorizon).To(BeZero(), "leases off")
		Expect(sc.RedisTimeout).To(Equal(100 * time.Millisecond))
		Expect(sc.TrustedHops).To(Equal(1))
	})

	It("lose to the pod's annotations, which the status annotation does not list as defaults", func(ctx SpecContext) {
		pod := annotatedPod(ns, "annotated",
			contract.AnnotationFailureMode, contract.FailureModeOpen,
			contract.AnnotationSidecarCPU, "200m",
			contract.AnnotationSidecarMemory, "48Mi",
			contract.AnnotationSidecarMaxProcs, "4",
			contract.AnnotationRedisPoolSize, "6",
			contract.AnnotationTrustedHops, "0")
		out, _, err := podinject.NewInjector(defaultsConfig(), true).Inject(ctx, pod)
		Expect(err).NotTo(HaveOccurred())
		c := sidecarOf(out)
		Expect(c.Args).To(ContainElements("--failure-mode=Open", "--max-procs=4", "--redis-pool-size=6"))
		Expect(c.Args).NotTo(ContainElements("--failure-mode=Closed", "--max-procs=2", "--redis-pool-size=24"))
		Expect(c.Args).NotTo(ContainElement(HavePrefix("--trusted-hops")), "trusted-hops 0 is a value: the peer address")
		Expect(c.Resources.Requests.Cpu().String()).To(Equal("200m"))
		Expect(c.Resources.Requests.Memory().String()).To(Equal("48Mi"))
		Expect(c.Resources.Limits.Memory().String()).To(Equal("48Mi"))
		Expect(injectedStatus(out).Defaults).To(Equal(map[string]string{
			"sidecar-lease-keys": "4096", "sidecar-lease-horizon": "0s", "sidecar-redis-timeout": "100ms",
		}), "what no annotation can set still comes from the manager")
		Expect(k8s.Create(ctx, out)).To(Succeed())
	})

	It("leave today's pods alone when unset: no extra flags, no defaults recorded", func(ctx SpecContext) {
		out, _, err := podinject.NewInjector(testConfig(podinject.NativeSidecarsAuto), true).Inject(ctx, annotatedPod(ns, "unset"))
		Expect(err).NotTo(HaveOccurred())
		for _, a := range sidecarOf(out).Args {
			Expect(a).NotTo(HavePrefix("--failure-mode"))
			Expect(a).NotTo(HavePrefix("--max-procs"))
			Expect(a).NotTo(HavePrefix("--redis-pool-size"))
			Expect(a).NotTo(HavePrefix("--lease-"))
			Expect(a).NotTo(HavePrefix("--redis-timeout"))
			Expect(a).NotTo(HavePrefix("--trusted-hops"))
		}
		Expect(injectedStatus(out).Defaults).To(BeEmpty())
		Expect(out.Annotations[contract.AnnotationInjected]).NotTo(ContainSubstring("defaults"))
	})
})

var _ = Describe("Redis over TLS", func() {
	const ns = "redis-tls"
	BeforeEach(func() { createNamespace(ns) })

	It("mounts the namespace's TLS Secret, optional, and the sidecar accepts the flags that point into it", func(ctx SpecContext) {
		out, _, err := podinject.NewInjector(tlsConfig(), true).Inject(ctx, annotatedPod(ns, "tls"))
		Expect(err).NotTo(HaveOccurred())
		var vol *corev1.Volume
		for i := range out.Spec.Volumes {
			if out.Spec.Volumes[i].Name == contract.RedisTLSVolume {
				vol = &out.Spec.Volumes[i]
			}
		}
		Expect(vol).NotTo(BeNil())
		Expect(vol.Secret.SecretName).To(Equal("redline-redis-tls"))
		Expect(vol.Secret.Optional).To(HaveValue(BeTrue()), "a namespace whose own Redis has no TLS has no such Secret")
		c := sidecarOf(out)
		Expect(c.VolumeMounts).To(ContainElement(corev1.VolumeMount{Name: contract.RedisTLSVolume, MountPath: contract.RedisTLSDir, ReadOnly: true}))

		env := map[string]string{contract.EnvRedisURL: tlsConfig().RedisURL, contract.EnvPodNamespace: ns}
		sc, err := app.ParseConfig(c.Args, func(k string) string { return env[k] }, GinkgoWriter)
		Expect(err).NotTo(HaveOccurred())
		Expect(sc.RedisTLS.ServerName).To(Equal("redis.redline-system.svc"))
		Expect(sc.RedisTLS.MinVersion).To(Equal("1.3"))
		// Every file a flag names is a key the volume projects, under the mount.
		mounted := map[string]bool{}
		for _, it := range vol.Secret.Items {
			mounted[filepath.Join(contract.RedisTLSDir, it.Path)] = true
		}
		Expect(mounted).To(Equal(map[string]bool{sc.RedisTLS.CAFile: true, sc.RedisTLS.CertFile: true, sc.RedisTLS.KeyFile: true}))
		Expect(k8s.Create(ctx, out)).To(Succeed(), "the API server accepts the pod")
	})

	It("mounts only the CA without a client certificate, and nothing without a Secret", func(ctx SpecContext) {
		cfg := tlsConfig()
		cfg.SidecarRedisTLS = podinject.SidecarTLS{Secret: "redline-redis-ca"}
		out, _, err := podinject.NewInjector(cfg, true).Inject(ctx, annotatedPod(ns, "ca-only"))
		Expect(err).NotTo(HaveOccurred())
		Expect(sidecarOf(out).Args).To(ContainElement("--redis-tls-ca-file=" + contract.RedisTLSDir + "/" + contract.RedisTLSCAKey))
		for _, v := range out.Spec.Volumes {
			if v.Name == contract.RedisTLSVolume {
				Expect(v.Secret.Items).To(Equal([]corev1.KeyToPath{{Key: contract.RedisTLSCAKey, Path: contract.RedisTLSCAKey}}))
			}
		}

		out, _, err = podinject.NewInjector(testConfig(podinject.NativeSidecarsAuto), true).Inject(ctx, annotatedPod(ns, "plain"))
		Expect(err).NotTo(HaveOccurred())
		for _, a := range sidecarOf(out).Args {
			Expect(a).NotTo(HavePrefix("--redis-tls-"))
		}
		for _, v := range out.Spec.Volumes {
			Expect(v.Name).NotTo(Equal(contract.RedisTLSVolume))
		}
	})
})
