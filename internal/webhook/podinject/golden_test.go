package podinject_test

import (
	"context"
	"os"
	"path/filepath"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

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
		func(mode string, native bool, extra ...string) {
			ctx := context.Background()
			pod := annotatedPod(ns, "checkout-"+mode, extra...)
			in := podinject.NewInjector(testConfig(podinject.NativeSidecarsAuto), native)

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
		Entry("native sidecar", "native", true),
		Entry("regular container", "regular", false),
		Entry("every annotation set", "overrides", true,
			contract.AnnotationListenPort, "8001",
			contract.AnnotationFailureMode, contract.FailureModeLocalFallback,
			contract.AnnotationSidecarCPU, "200m",
			contract.AnnotationSidecarMemory, "96Mi",
			contract.AnnotationExposeDecisionAPI, "true"),
	)
})
