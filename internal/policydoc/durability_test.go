package policydoc

import (
	"testing"

	. "github.com/onsi/gomega"
)

// A rule's durability reads back; an unknown mode or a timeout out of bounds is refused, and so
// is durability on an in-flight rule.
func TestParseChecksDurability(t *testing.T) {
	g := NewWithT(t)
	p := samplePolicy()
	p.Rules[0].Durability = &Durability{Mode: DurabilityReplica, TimeoutMS: 100}
	_, data, err := Build("shop", []Policy{p}, map[string]string{})
	g.Expect(err).NotTo(HaveOccurred())
	doc, err := Parse(data)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(doc.Policies[0].Rules[0].Durability).To(Equal(&Durability{Mode: DurabilityReplica, TimeoutMS: 100}))

	for name, d := range map[string]*Durability{
		"unknown mode": {Mode: "Disk", TimeoutMS: 100},
		"no timeout":   {Mode: DurabilityAppendOnlyFile},
		"too long":     {Mode: DurabilityReplica, TimeoutMS: MaxDurabilityTimeoutMS + 1},
		"named None":   {Mode: "None", TimeoutMS: 100},
	} {
		p := samplePolicy()
		p.Rules[0].Durability = d
		_, data, err := Build("shop", []Policy{p}, map[string]string{})
		g.Expect(err).NotTo(HaveOccurred())
		_, err = Parse(data)
		g.Expect(err).To(MatchError(ContainSubstring("policy a rule r: durability")), name)
	}

	p = samplePolicy()
	p.Rules[0] = Rule{Name: "r", Key: []KeyPart{{Header: "x"}}, Mode: "Enforce", InFlight: 3, Durability: &Durability{Mode: DurabilityReplica, TimeoutMS: 1}}
	_, data, err = Build("shop", []Policy{p}, map[string]string{})
	g.Expect(err).NotTo(HaveOccurred())
	_, err = Parse(data)
	g.Expect(err).To(MatchError(ContainSubstring("inFlight with a candidate, a cost, countRefused or durability")))
}
