package podinject_test

import (
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/redline-dev/redline/internal/sidecar/app"
	"github.com/redline-dev/redline/internal/sidecar/contract"
	"github.com/redline-dev/redline/internal/webhook/podinject"
)

var _ = Describe("redline.dev/decision-log", func() {
	const ns = "decision-log"
	BeforeEach(func() { createNamespace(ns) })

	DescribeTable("sets the sidecar's --decision-log",
		func(ctx SpecContext, annotation, want string) {
			var kv []string
			if annotation != "" {
				kv = []string{contract.AnnotationDecisionLog, annotation}
			}
			out, warns, err := podinject.NewInjector(testConfig(podinject.NativeSidecarsAuto), true).Inject(ctx, annotatedPod(ns, "", kv...))
			Expect(err).NotTo(HaveOccurred())
			Expect(warns).To(BeEmpty())
			args := sidecarOf(out).Args
			if want == contract.DecisionLogOff {
				Expect(args).NotTo(ContainElement(HavePrefix("--decision-log")), "off passes nothing: the sidecar's default")
			} else {
				Expect(args).To(ContainElement("--decision-log=" + want))
			}
			env := map[string]string{contract.EnvRedisURL: testConfig("").RedisURL, contract.EnvPodNamespace: ns}
			sc, err := app.ParseConfig(args, func(k string) string { return env[k] }, GinkgoWriter)
			Expect(err).NotTo(HaveOccurred(), "the sidecar accepts the injected flag")
			Expect(sc.DecisionLog).To(Equal(want))
		},
		Entry("none", "", contract.DecisionLogOff),
		Entry("off", "off", contract.DecisionLogOff),
		Entry("refusals", "refused", contract.DecisionLogRefused),
		Entry("every decision", " all ", contract.DecisionLogAll),
	)

	It("admits a pod with a bad value unchanged, with a warning saying why", func() {
		stored, warns := createAndGet(annotatedPod(ns, "", contract.AnnotationDecisionLog, "verbose"))
		Expect(sidecarCount(stored)).To(BeZero())
		Expect(warns).To(ConsistOf(And(HavePrefix(podinject.WarningPrefix),
			ContainSubstring(`redline.dev/decision-log="verbose": want off, refused or all`))))
	})
})
