package ruleset_test

import (
	"testing"

	. "github.com/onsi/gomega"

	"github.com/redline-dev/redline/internal/policydoc"
	"github.com/redline-dev/redline/internal/sidecar/ruleset"
)

// An in-flight rule lets its requests finish on a lost slot only when its document says
// Finish; by default they are ended.
func TestInFlightRuleLetsFinishAsTheDocumentSays(t *testing.T) {
	g := NewWithT(t)
	rule := func(name, onLost string) policydoc.Rule {
		return policydoc.Rule{Name: name, Key: []policydoc.KeyPart{{Header: "x-key"}}, InFlight: 4, Mode: "Enforce", OnSlotLost: onLost}
	}
	_, data, err := policydoc.Build("shop", []policydoc.Policy{{
		Name: "p", Generation: 1, FailureMode: "Closed",
		Selector: policydoc.Selector{MatchLabels: map[string]string{"app": "web"}},
		Rules:    []policydoc.Rule{rule("end", ""), rule("finish", policydoc.SlotLostFinish)},
	}}, map[string]string{})
	g.Expect(err).NotTo(HaveOccurred())
	doc, err := policydoc.Parse(data)
	g.Expect(err).NotTo(HaveOccurred())
	set, err := ruleset.NewBuilder("").Build(doc, map[string]string{"app": "web"})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(set.FindInFlight("p", "end").LetFinish).To(BeFalse())
	g.Expect(set.FindInFlight("p", "finish").LetFinish).To(BeTrue())
}
