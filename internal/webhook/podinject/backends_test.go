package podinject_test

import (
	"context"
	"path/filepath"
	"slices"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"

	"github.com/redline-dev/redline/internal/backend"
	"github.com/redline-dev/redline/internal/sidecar/app"
	"github.com/redline-dev/redline/internal/sidecar/contract"
	"github.com/redline-dev/redline/internal/webhook/podinject"
)

// backendOf is a BackendResolver serving every namespace from one NamespaceRedis.
type backendOf backend.NamespaceRedis

func (b backendOf) Redis(context.Context, string) (backend.NamespaceRedis, error) {
	return backend.NamespaceRedis(b), nil
}

func envValue(c corev1.Container, name string) string {
	for _, e := range c.Env {
		if e.Name == name {
			return e.Value
		}
	}
	return ""
}

func flagValues(c corev1.Container, prefix string) []string {
	var out []string
	for _, a := range c.Args {
		if strings.HasPrefix(a, "--"+prefix) {
			out = append(out, a)
		}
	}
	return out
}

var _ = Describe("The namespace's Redis backend", func() {
	const ns = "backends"
	BeforeEach(func() { createNamespace(ns) })

	// The manager's Redis is TLS, with its server name and Secret for sidecars.
	tlsConfig := func() podinject.Config {
		cfg := testConfig(podinject.NativeSidecarsTrue)
		cfg.RedisURL = "rediss://redis.redline-system.svc:6380"
		cfg.SidecarRedisTLS = podinject.SidecarTLS{Secret: "redline-redis-tls", ServerName: "redis.internal", MinVersion: "1.3"}
		return cfg
	}

	It("gives a backend's pods its URL and its TLS names, never the manager's, from the namespace's ConfigMap", func(ctx SpecContext) {
		cfg := tlsConfig()
		cfg.Backends = backendOf{URL: "rediss://payments.redis:6380", Backend: true, TLSServerName: "payments.internal"}
		out, _, err := podinject.NewInjector(cfg, true).Inject(ctx, annotatedPod(ns, "tls-backend"))
		Expect(err).NotTo(HaveOccurred())
		Expect(podJSON(out)).NotTo(ContainSubstring("payments"), "the pod spec names the ConfigMap, not what is in it")
		Expect(slices.ContainsFunc(out.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == contract.RedisTLSVolume })).To(BeTrue())

		By("the manager writing the namespace's ConfigMap: the sidecar's settings, from its environment and flags as kubelet resolves them")
		reconcileRedisConfigMap(ctx, cfg, ns)
		env, args := kubeletView(ctx, out)
		env[contract.EnvPodNamespace] = ns
		sc, err := app.ParseConfig(args, func(k string) string { return env[k] }, GinkgoWriter)
		Expect(err).NotTo(HaveOccurred())
		Expect(sc.RedisURL).To(Equal("rediss://payments.redis:6380"))
		Expect(sc.RedisTLS.ServerName).To(Equal("payments.internal"))
		Expect(sc.RedisTLS.MinVersion).To(Equal("1.3"), "the sidecars' minimum version where the backend sets none")
		Expect(k8s.Create(ctx, out)).To(Succeed(), "the API server accepts it")
	})

	It("gives a TLS backend that names no server name nor minimum version the sidecar's defaults, which it accepts", func(ctx SpecContext) {
		const bare = "backends-tls-defaults"
		createNamespace(bare)
		cfg := testConfig(podinject.NativeSidecarsTrue)
		cfg.SidecarRedisTLS = podinject.SidecarTLS{Secret: "redline-redis-tls"}
		cfg.Backends = backendOf{URL: "rediss://payments.redis:6380", Backend: true}
		out, _, err := podinject.NewInjector(cfg, true).Inject(ctx, annotatedPod(bare, "tls-defaults"))
		Expect(err).NotTo(HaveOccurred())
		reconcileRedisConfigMap(ctx, cfg, bare)
		env, args := kubeletView(ctx, out)
		env[contract.EnvPodNamespace] = bare
		sc, err := app.ParseConfig(args, func(k string) string { return env[k] }, GinkgoWriter)
		Expect(err).NotTo(HaveOccurred())
		Expect(sc.RedisURL).To(Equal("rediss://payments.redis:6380"))
		Expect(sc.RedisTLS.ServerName).To(BeEmpty(), "the host dialed")
		Expect(sc.RedisTLS.MinVersion).To(BeEmpty(), "TLS 1.2")
		Expect(sc.RedisTLS.CAFile).To(Equal(filepath.Join(contract.RedisTLSDir, contract.RedisTLSCAKey)))
	})

	It("gives a backend without TLS the patch of one with TLS, whose TLS settings its ConfigMap leaves empty", func(ctx SpecContext) {
		const plain = "backends-plain"
		createNamespace(plain)
		cfg := tlsConfig()
		cfg.Backends = backendOf{URL: "redis://payments.redis:6379", Backend: true}
		out, _, err := podinject.NewInjector(cfg, true).Inject(ctx, annotatedPod(plain, "same-pod"))
		Expect(err).NotTo(HaveOccurred())
		withTLS := cfg
		withTLS.Backends = backendOf{URL: "rediss://payments.redis:6380", Backend: true, TLSServerName: "payments.internal", TLSMinVersion: "1.3"}
		tlsOut, _, err := podinject.NewInjector(withTLS, true).Inject(ctx, annotatedPod(plain, "same-pod"))
		Expect(err).NotTo(HaveOccurred())
		Expect(out.Spec).To(Equal(tlsOut.Spec), "the patch tells nothing of whether the Redis uses TLS")
		Expect(out.Annotations).To(Equal(tlsOut.Annotations))
		Expect(out.Spec.Volumes).To(ContainElement(HaveField("Secret.Optional", HaveValue(BeTrue()))),
			"the TLS Secret's volume is optional: a namespace whose Redis has no TLS has no such Secret")

		By("the sidecar, as kubelet runs it, gets no TLS setting")
		reconcileRedisConfigMap(ctx, cfg, plain)
		env, args := kubeletView(ctx, out)
		env[contract.EnvPodNamespace] = plain
		sc, err := app.ParseConfig(args, func(k string) string { return env[k] }, GinkgoWriter)
		Expect(err).NotTo(HaveOccurred())
		Expect(sc.RedisURL).To(Equal("redis://payments.redis:6379"))
		Expect(sc.RedisTLS.IsZero()).To(BeTrue(), "none of the cluster Redis's TLS settings: %+v", sc.RedisTLS)
	})

	It("gives a pod the same patch, byte for byte, whether a RedisBackend serves its namespace or not", func(ctx SpecContext) {
		const same = "backends-same"
		createNamespace(same)
		onDefault := tlsConfig()
		onDefault.Backends = backendOf{}
		onBackend := tlsConfig()
		onBackend.Backends = backendOf{URL: "rediss://payments.redis:6380", Backend: true, TLSServerName: "payments.internal", TLSMinVersion: "1.2"}
		onPlainBackend := tlsConfig()
		onPlainBackend.Backends = backendOf{URL: "redis://payments.redis:6379", Backend: true}
		var patches []string
		for _, cfg := range []podinject.Config{onDefault, onBackend, onPlainBackend} {
			out, warnings, err := podinject.NewInjector(cfg, true).Inject(ctx, annotatedPod(same, "same-pod"))
			Expect(err).NotTo(HaveOccurred())
			Expect(warnings).To(BeEmpty())
			patches = append(patches, podJSON(out))
		}
		Expect(patches[1]).To(Equal(patches[0]))
		Expect(patches[2]).To(Equal(patches[0]))

		By("before the manager has written the namespace's ConfigMap, the sidecar starts on the cluster's Redis")
		out, _, err := podinject.NewInjector(onBackend, true).Inject(ctx, annotatedPod(same, "same-pod"))
		Expect(err).NotTo(HaveOccurred())
		env, args := kubeletView(ctx, out)
		env[contract.EnvPodNamespace] = same
		sc, err := app.ParseConfig(args, func(k string) string { return env[k] }, GinkgoWriter)
		Expect(err).NotTo(HaveOccurred())
		Expect(sc.RedisURL).To(Equal(onDefault.RedisURL))
		Expect(sc.RedisTLS.ServerName).To(Equal("redis.internal"))
	})

	It("gives the manager's Redis's pods its URL and TLS names", func(ctx SpecContext) {
		cfg := tlsConfig()
		cfg.Backends = backendOf{}
		out, _, err := podinject.NewInjector(cfg, true).Inject(ctx, annotatedPod(ns, "default-backend"))
		Expect(err).NotTo(HaveOccurred())
		sc := sidecarOf(out)
		Expect(envValue(sc, contract.EnvRedisURL)).To(Equal(cfg.RedisURL))
		Expect(flagValues(sc, contract.FlagRedisTLSServerName)).To(Equal([]string{"--" + contract.FlagRedisTLSServerName + "=redis.internal"}))
	})
})
