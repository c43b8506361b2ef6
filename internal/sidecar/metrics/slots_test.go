package metrics

import (
	"testing"

	. "github.com/onsi/gomega"

	"github.com/redline-dev/redline/internal/limiter"
	"github.com/redline-dev/redline/internal/sidecar/ruleset"
)

// inFlightGauges gathers m's per-rule gauges of requests in progress, by "policy/rule".
func inFlightGauges(g Gomega, m *Metrics) map[string]float64 {
	families, err := m.Registry.Gather()
	g.Expect(err).NotTo(HaveOccurred())
	got := map[string]float64{}
	for _, f := range families {
		if f.GetName() != "redline_sidecar_in_flight" {
			continue
		}
		for _, s := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range s.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			got[labels[labelPolicy]+"/"+labels[labelRule]] = s.GetGauge().GetValue()
		}
	}
	return got
}

// Every in-flight rule's gauge shows from its load on, at 0 before its first slot: a sidecar
// through which no request of the rule runs yet says 0, not nothing, so a sum over the
// sidecars counts each of them. A reload keeps what is held, and the gauge of a rule no longer
// in force stays for the releases of the requests taken under it.
func TestInFlightGaugeFromLoad(t *testing.T) {
	g := NewWithT(t)
	m := New(nil, nil)
	m.WatchSlots(func() limiter.SlotStats { return limiter.SlotStats{} })
	p := &ruleset.Policy{Name: "p"}
	slots := &ruleset.Rule{Policy: p, Name: "slots", InFlight: &limiter.InFlight{Max: 8}}
	other := &ruleset.Rule{Policy: p, Name: "other", InFlight: &limiter.InFlight{Max: 2}}
	m.ConfigLoaded(&ruleset.Set{Namespace: "ns", Hash: "a", InFlight: []*ruleset.Rule{slots, other}})
	g.Expect(inFlightGauges(g, m)).To(Equal(map[string]float64{"p/slots": 0, "p/other": 0}))

	m.SlotsHeld(slots, 1)
	m.SlotsHeld(other, 1)
	m.ConfigLoaded(&ruleset.Set{Namespace: "ns", Hash: "b", InFlight: []*ruleset.Rule{slots}})
	g.Expect(inFlightGauges(g, m)).To(Equal(map[string]float64{"p/slots": 1, "p/other": 1}))
	m.SlotsHeld(other, -1)
	g.Expect(inFlightGauges(g, m)).To(Equal(map[string]float64{"p/slots": 1, "p/other": 0}))
}
