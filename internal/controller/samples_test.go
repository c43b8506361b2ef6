package controller_test

import (
	"context"
	"os"
	"path/filepath"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"sigs.k8s.io/yaml"

	v1alpha1 "github.com/redline-dev/redline/api/v1alpha1"
)

var _ = Describe("config/samples", func() {
	// kubectl apply -f config/samples/ takes every file of the folder, so it holds policies only.
	It("are accepted by the API server and programmed", func() {
		ctx := context.Background()
		files, err := filepath.Glob(filepath.Join("..", "..", "config", "samples", "*.yaml"))
		Expect(err).NotTo(HaveOccurred())
		ns := newNamespace(ctx)
		var names []string
		for _, f := range files {
			data, err := os.ReadFile(f)
			Expect(err).NotTo(HaveOccurred())
			var p v1alpha1.RateLimitPolicy
			Expect(yaml.UnmarshalStrict(data, &p)).To(Succeed(), f)
			p.Namespace = ns
			warnings.Take()
			Expect(warnK8s.Create(ctx, &p)).To(Succeed(), f)
			Expect(warnings.Take()).To(BeEmpty(), "%s: samples use no deprecated field", f)
			names = append(names, p.Name)
		}
		Expect(names).To(HaveLen(3))
		for _, n := range names {
			expectProgrammed(ctx, ns, n)
		}
	})
})
