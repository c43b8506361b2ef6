package topkeys

import "sync/atomic"

// Sketch sizes of a Tracker: 32 counters find every key above 1/32 of a rule's refusals in an
// interval (the published list holds the heaviest 8), and 8 the heaviest admitted keys, for
// one sidecar's debugging view. A full Tracker holds about 40 entries of a 32-byte key and a
// label of at most MaxLabelBytes: under 10 KiB.
const (
	RefusedKeys  = 32
	AdmittedKeys = 8
)

// Tracker counts one rule's decisions between two Takes: how many, and who was refused and
// who admitted. For a shadow rule or a candidate limit "refused" is what it would have
// refused. It is safe for concurrent use.
type Tracker struct {
	decisions atomic.Uint64
	refused   *Sketch
	admitted  *Sketch

	// Slots counts an in-flight rule's slots held now, by key.
	Slots Holders
	// Quota keeps a long window's heaviest users of the current period.
	Quota Usage
}

// NewTracker returns an empty Tracker.
func NewTracker() *Tracker {
	return &Tracker{refused: New(RefusedKeys), admitted: New(AdmittedKeys)}
}

// Observe counts one decision of key (label: its readable form, "" to keep none).
func (t *Tracker) Observe(key, label string, refused bool) {
	t.decisions.Add(1)
	if refused {
		t.refused.Add(key, 1, label)
		return
	}
	t.admitted.Add(key, 1, label)
}

// Interval is what a Tracker counted between two Takes.
type Interval struct {
	Decisions uint64
	Refused   Snapshot
	Admitted  Snapshot
}

// Take returns what t counted since the last Take and starts again.
func (t *Tracker) Take() Interval {
	return Interval{Decisions: t.decisions.Swap(0), Refused: t.refused.Take(), Admitted: t.admitted.Take()}
}

// Peek returns what t counted since the last Take.
func (t *Tracker) Peek() Interval {
	return Interval{Decisions: t.decisions.Load(), Refused: t.refused.Peek(), Admitted: t.admitted.Peek()}
}
