package podinject_test

import (
	"strconv"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/redline-dev/redline/internal/sidecar/app"
	"github.com/redline-dev/redline/internal/sidecar/contract"
	"github.com/redline-dev/redline/internal/webhook/podinject"
)

var _ = Describe("redline.dev/trusted-hops", func() {
	const ns = "trusted-hops"
	BeforeEach(func() { createNamespace(ns) })

	// sidecarConfig is what the injected sidecar makes of its flags.
	sidecarConfig := func(args []string) *app.Config {
		GinkgoHelper()
		env := map[string]string{contract.EnvRedisURL: testConfig("").RedisURL, contract.EnvPodNamespace: ns}
		sc, err := app.ParseConfig(args, func(k string) string { return env[k] }, GinkgoWriter)
		Expect(err).NotTo(HaveOccurred())
		return sc
	}

	DescribeTable("sets the sidecar's --trusted-hops, over the manager's --sidecar-trusted-hops",
		func(ctx SpecContext, managerDefault int, annotation string, wantHops int, wantDefault bool) {
			cfg := testConfig(podinject.NativeSidecarsAuto)
			cfg.SidecarTrustedHops = managerDefault
			var kv []string
			if annotation != "" {
				kv = []string{contract.AnnotationTrustedHops, annotation}
			}
			out, warns, err := podinject.NewInjector(cfg, true).Inject(ctx, annotatedPod(ns, "", kv...))
			Expect(err).NotTo(HaveOccurred())
			Expect(warns).To(BeEmpty())
			args := sidecarOf(out).Args
			if wantHops == 0 {
				Expect(args).NotTo(ContainElement(HavePrefix("--trusted-hops")), "0 passes nothing: the sidecar's own default is the peer")
			} else {
				Expect(args).To(ContainElement("--trusted-hops=" + strconv.Itoa(wantHops)))
			}
			Expect(sidecarConfig(args).TrustedHops).To(Equal(wantHops), "the sidecar accepts the injected flag")
			if wantDefault {
				Expect(injectedStatus(out).Defaults).To(HaveKeyWithValue("sidecar-trusted-hops", strconv.Itoa(wantHops)))
			} else {
				Expect(injectedStatus(out).Defaults).NotTo(HaveKey("sidecar-trusted-hops"))
			}
		},
		Entry("neither: the peer address", 0, "", 0, false),
		Entry("the annotation alone", 0, "1", 1, false),
		Entry("the annotation at the bound", 0, "16", 16, false),
		Entry("the annotation with spaces", 0, " 2 ", 2, false),
		Entry("the manager's default", 2, "", 2, true),
		Entry("the annotation over the manager's default", 2, "1", 1, false),
		Entry("0 in the annotation over the manager's default: a pod reached directly", 2, "0", 0, false),
	)

	DescribeTable("admits a pod with a bad value unchanged, with a warning saying why",
		func(value string) {
			pod := annotatedPod(ns, "")
			pod.Annotations[contract.AnnotationTrustedHops] = value
			stored, warns := createAndGet(pod)
			Expect(sidecarCount(stored)).To(BeZero())
			Expect(stored.Annotations).NotTo(HaveKey(contract.AnnotationInjected))
			Expect(warns).To(ConsistOf(And(HavePrefix(podinject.WarningPrefix),
				ContainSubstring(`redline.dev/trusted-hops=%q: want the number of proxies in front of the pod that append to X-Forwarded-For, 0-16`, value))))
		},
		Entry("negative", "-1"),
		Entry("beyond the bound", "17"),
		Entry("huge", "99999999999999999999"),
		Entry("a word", "two"),
		Entry("a fraction", "1.5"),
		Entry("empty", ""),
	)
})
