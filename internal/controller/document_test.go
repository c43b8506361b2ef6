package controller

import (
	"fmt"
	"testing"

	. "github.com/onsi/gomega"

	"github.com/redline-dev/redline/internal/policydoc"
)

// Typical policies (one rule with a match, a two-part key and a two-expression selector,
// distinct names and limits): 2,000 of them do not fit plain (about 1,230 bytes each, 854 fit)
// and fit gzip-compressed (about 12 bytes each, so about 89,000 fit).
func TestConfigMapCapacity(t *testing.T) {
	g := NewWithT(t)
	const n = 2000
	ps := make([]policydoc.Policy, 0, n)
	for i := range n {
		ps = append(ps, compileAll(t, testPolicy(fmt.Sprintf("team-%d-checkout-per-api-key", i), int64(100+i)))...)
	}
	doc, data, err := policydoc.Build("shop", ps, map[string]string{"FixedWindow": "0123456789abcdef0123456789abcdef01234567"})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(len(data)).To(BeNumerically(">", MaxConfigMapBytes), "the plain form overflows")
	p, err := encodeDocument("shop", doc, data, MaxConfigMapBytes, nil)
	g.Expect(err).NotTo(HaveOccurred(), "the gzip form fits")
	gz := len(p.binary[policydoc.GzipDataKey])
	t.Logf("typical policies per ConfigMap: %d plain (%d B each), %d gzip (%d B each)",
		MaxConfigMapBytes*n/len(data), len(data)/n, MaxConfigMapBytes*n/gz, gz/n)
	g.Expect(gz * 5).To(BeNumerically("<", len(data)))
}

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
