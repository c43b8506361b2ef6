package metrics

import (
	"errors"
	"testing"

	. "github.com/onsi/gomega"

	"github.com/redline-dev/redline/internal/limiter"
	"github.com/redline-dev/redline/internal/sidecar/decide"
	"github.com/redline-dev/redline/internal/sidecar/ruleset"
)

// What a token budget's settles did shows by rule: settles by result, units given back, and
// the debt responses ran up past their holds.
func TestSettled(t *testing.T) {
	g := NewWithT(t)
	m := New(nil, nil)
	r := &ruleset.Rule{Policy: &ruleset.Policy{Name: "llm"}, Name: "tokens"}
	m.Settled(r, limiter.Settled{Returned: 300}, nil)
	m.Settled(r, limiter.Settled{Debt: 40}, nil)
	m.Settled(r, limiter.Settled{Expired: true}, nil)
	m.Settled(r, limiter.Settled{}, errors.New("redis down"))
	got := map[string]float64{}
	families, err := m.Registry.Gather()
	g.Expect(err).NotTo(HaveOccurred())
	for _, f := range families {
		for _, s := range f.GetMetric() {
			name := f.GetName()
			for _, l := range s.GetLabel() {
				if l.GetName() == "result" {
					name += "/" + l.GetValue()
				}
			}
			if c := s.GetCounter(); c != nil {
				got[name] = c.GetValue()
			}
		}
	}
	g.Expect(got).To(HaveKeyWithValue("redline_sidecar_hold_settles_total/settled", 2.0))
	g.Expect(got).To(HaveKeyWithValue("redline_sidecar_hold_settles_total/expired", 1.0))
	g.Expect(got).To(HaveKeyWithValue("redline_sidecar_hold_settles_total/failed", 1.0))
	g.Expect(got).To(HaveKeyWithValue("redline_sidecar_hold_returned_units_total", 300.0))
	g.Expect(got).To(HaveKeyWithValue("redline_sidecar_debt_units_total", 40.0))
}

// Holds refused for want of room in a registry show by face and reason.
func TestRegistryRefused(t *testing.T) {
	g := NewWithT(t)
	m := New(nil, nil)
	check, rls := m.RegistryRefused(FaceCheck), m.RegistryRefused(FaceRLS)
	check(&decide.RefusedError{Err: decide.ErrKeyShareFull})
	check(&decide.RefusedError{Err: decide.ErrKeyShareFull})
	rls(&decide.RefusedError{Err: decide.ErrTooManyHolds})
	rls(&decide.RefusedError{Err: decide.ErrNoMemory})
	got := map[string]float64{}
	families, err := m.Registry.Gather()
	g.Expect(err).NotTo(HaveOccurred())
	for _, f := range families {
		if f.GetName() != "redline_sidecar_hold_registry_refusals_total" {
			continue
		}
		for _, s := range f.GetMetric() {
			name := ""
			for _, l := range s.GetLabel() {
				name += "/" + l.GetValue()
			}
			got[name] = s.GetCounter().GetValue()
		}
	}
	g.Expect(got).To(Equal(map[string]float64{"/check/key_share": 2, "/check/full": 0, "/check/memory": 0, "/rls/key_share": 0, "/rls/full": 1, "/rls/memory": 1}))
}
