package policies

import (
	"fmt"
	"testing"

	. "github.com/onsi/gomega"

	"github.com/redline-dev/redline/internal/policydoc"
)

func TestEncodeDocumentPicksTheFormThatFits(t *testing.T) {
	g := NewWithT(t)
	ps := compileAll(t, testPolicy("a", 1), testPolicy("b", 2))
	doc, data, err := policydoc.Build("shop", ps, nil)
	g.Expect(err).NotTo(HaveOccurred())

	p, err := encodeDocument("shop", doc, data, len(data), nil)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(p.data).To(HaveKey(policydoc.DataKey))
	g.Expect(p.binary).To(BeEmpty())

	p, err = encodeDocument("shop", doc, data, len(data)-1, nil)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(p.data).To(BeEmpty())
	back, err := policydoc.Decompress(p.binary[policydoc.GzipDataKey])
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(back).To(Equal(data))

	_, err = encodeDocument("shop", doc, data, 100, nil)
	g.Expect(err).To(MatchError(ContainSubstring(fmt.Sprintf("namespace shop compile to %d bytes", len(data)))))
	g.Expect(err).To(MatchError(ContainSubstring("over the 100 bytes a ConfigMap holds")))
	g.Expect(err).To(MatchError(ContainSubstring("Remove or merge policies or rules (2 policies, 2 rules now)")))
}
