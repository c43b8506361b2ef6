package kubeletdir

import (
	"os"
	"path/filepath"
	"testing"

	. "github.com/onsi/gomega"
)

func TestWriteLikeKubelet(t *testing.T) {
	g := NewWithT(t)
	dir := t.TempDir()
	g.Expect(Write(dir, map[string][]byte{"policies.json": []byte("v1"), "other": []byte("x")})).To(Succeed())
	first, err := os.Readlink(filepath.Join(dir, "..data"))
	g.Expect(err).NotTo(HaveOccurred())
	link, err := os.Readlink(filepath.Join(dir, "policies.json"))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(link).To(Equal(filepath.Join("..data", "policies.json")))

	// An update swaps ..data, drops names no longer in the payload and the old payload directory.
	g.Expect(Write(dir, map[string][]byte{"policies.json": []byte("v2")})).To(Succeed())
	g.Expect(os.ReadFile(filepath.Join(dir, "policies.json"))).To(Equal([]byte("v2")))
	g.Expect(filepath.Join(dir, "other")).NotTo(BeAnExistingFile())
	g.Expect(filepath.Join(dir, first)).NotTo(BeAnExistingFile())

	// A deleted optional ConfigMap leaves an empty volume.
	g.Expect(Write(dir, map[string][]byte{})).To(Succeed())
	g.Expect(filepath.Join(dir, "policies.json")).NotTo(BeAnExistingFile())
}
