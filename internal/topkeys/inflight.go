package topkeys

import (
	"cmp"
	"slices"
	"strings"
	"sync"
)

// MaxHolderKeys is the most keys of one in-flight rule whose slots a Holders counts one by
// one: a key beyond it while that many hold slots is counted in Held only. Each entry is a
// 32-byte key and a label of at most MaxLabelBytes, about 200 bytes with the map's overhead:
// a full Holders is about 200 KiB, and it holds an entry only while a request of its key is in
// progress, which the sidecar's own bound of slots bounds first.
const MaxHolderKeys = 1024

// Holders counts the slots of one in-flight rule this sidecar holds now, in all and by key,
// the most held at once since the last Take, and the requests waiting for a slot. Unlike a
// Sketch its counts go down: it is a gauge, not a stream. It is safe for concurrent use.
type Holders struct {
	mu     sync.Mutex
	held   int64
	peak   int64
	queued int64
	keys   map[string]*holder
}

type holder struct {
	label string
	n     int64
}

// Hold moves the slots key holds by delta (+1 taken, -1 given back). label, when not "", is
// kept (cut to MaxLabelBytes) when the key enters. A release of a key it does not count (one
// taken while MaxHolderKeys keys held slots) moves Held only.
func (h *Holders) Hold(key, label string, delta int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.held = max(h.held+delta, 0)
	h.peak = max(h.peak, h.held)
	e := h.keys[key]
	switch {
	case e != nil:
		if e.n += delta; e.n <= 0 {
			delete(h.keys, key)
		}
	case delta > 0 && len(h.keys) < MaxHolderKeys:
		if h.keys == nil {
			h.keys = map[string]*holder{}
		}
		key, label = own(key, label)
		h.keys[key] = &holder{label: label, n: delta}
	}
}

// Queue moves the requests waiting for a slot by delta.
func (h *Holders) Queue(delta int64) {
	h.mu.Lock()
	h.queued = max(h.queued+delta, 0)
	h.mu.Unlock()
}

// InFlight is what a Holders counted: now, and the most at once since the previous Take.
type InFlight struct {
	// Held counts the slots held now; Peak the most held at once since the previous Take.
	Held, Peak int64
	// Queued counts the requests waiting for a slot now.
	Queued int64
	// Top holds the k keys holding the most slots now, the most first (ties by Key), as a
	// Snapshot: Total is Held, Min the most a key left out holds.
	Top Snapshot
}

// Take returns what h counts, with its k heaviest keys, and starts the peak again from the
// slots held now.
func (h *Holders) Take(k int) InFlight {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := InFlight{Held: h.held, Peak: h.peak, Queued: h.queued}
	h.peak = h.held
	out.Top.Total = uint64(max(h.held, 0))
	if len(h.keys) == 0 {
		return out
	}
	es := make([]Entry, 0, len(h.keys))
	for key, e := range h.keys {
		es = append(es, Entry{Key: key, Label: e.label, Count: uint64(e.n)})
	}
	slices.SortFunc(es, func(a, b Entry) int {
		if c := cmp.Compare(b.Count, a.Count); c != 0 {
			return c
		}
		return strings.Compare(a.Key, b.Key)
	})
	if len(es) > k {
		out.Top.Min = es[k].Count
		es = es[:k]
	}
	out.Top.Entries = slices.Clip(es)
	return out
}

// own is key and label cut as a Sketch cuts them, copied: what a tracker keeps must not hold
// the caller's memory.
func own(key, label string) (string, string) {
	if len(key) > MaxKeyBytes {
		key = key[:MaxKeyBytes]
	}
	return strings.Clone(key), strings.Clone(cut(label, MaxLabelBytes))
}
