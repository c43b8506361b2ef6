// Package topkeys finds the heaviest keys of a stream in fixed memory: the Space-Saving
// algorithm (Metwally, Agrawal and El Abbadi, "Efficient Computation of Frequent and Top-k
// Elements in Data Streams", 2005).
//
// A Sketch of capacity k holds k counters. A key it holds has its counter incremented; a key
// it does not hold takes over the smallest counter, which keeps its count (the new key's count
// is over-estimated by at most that much, recorded as the entry's Err). So whatever the stream:
//
//   - memory and work per Add are fixed: k entries, O(log k) per Add;
//   - every key seen more than Total/k times is held;
//   - a held key's Count is never below its true count and never above it by more than Err,
//     and Err <= Total/k.
//
// A rate limiter must know who it refuses without a table per key (a client controls how many
// keys there are) and without a metric label per key (the same, for Prometheus): a sidecar
// keeps one Sketch per rule, and what it reports is k entries whatever the traffic.
package topkeys

import (
	"cmp"
	"slices"
	"strings"
	"sync"
	"unicode"
	"unicode/utf8"
)

// MaxLabelBytes is the most bytes of a label a Sketch keeps: a label is a readable form of a
// key, made from what a client sent, for a person to read in a policy's status.
const MaxLabelBytes = 64

// MaxKeyBytes is the most bytes of a key a Sketch keeps: keys are hashes of fixed length (the
// limiter's 32 hex digits), and a longer one is cut, so no caller can grow a Sketch with long
// keys.
const MaxKeyBytes = 64

// Entry is one held key.
type Entry struct {
	// Key identifies the key (the hash the limiter names its Redis keys by).
	Key string
	// Label is a readable form of the key, "" unless the caller gave one.
	Label string
	// Count over-estimates how often the key was added, by at most Err: Count-Err <= true
	// count <= Count.
	Count uint64
	// Err bounds the over-estimate of Count.
	Err uint64
}

// Snapshot is what a Sketch held when it was taken.
type Snapshot struct {
	// Total is the sum of every Add's n since the last Take.
	Total uint64
	// Min is the smallest Count held when the Sketch was full, 0 when it was not: a key
	// missing from the snapshot was added at most Min times (exactly 0 times when Min is 0).
	Min uint64
	// Entries are the held keys, the largest Count first (ties by Key).
	Entries []Entry
}

// Sketch is a Space-Saving summary of capacity k. It is safe for concurrent use.
type Sketch struct {
	mu    sync.Mutex
	k     int
	heap  []Entry        // a min-heap on Count
	index map[string]int // key -> position in heap
	total uint64
}

// New returns a Sketch of capacity k (at least 1). Its memory is taken on its first Add: a
// rule that never refuses costs its refusals' sketch nothing.
func New(k int) *Sketch {
	return &Sketch{k: max(k, 1)}
}

// Capacity is k.
func (s *Sketch) Capacity() int { return s.k }

// Add counts n more of key. label, when not "", is kept (cut to MaxLabelBytes) when the key
// enters the sketch, or when it is held without one. Neither key nor label is retained: a
// copy of at most MaxKeyBytes and MaxLabelBytes is.
func (s *Sketch) Add(key string, n uint64, label string) {
	if n == 0 {
		return
	}
	key = cut(key, MaxKeyBytes)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.index == nil {
		s.heap, s.index = make([]Entry, 0, s.k), make(map[string]int, s.k)
	}
	s.total = addSat(s.total, n)
	if i, ok := s.index[key]; ok {
		e := &s.heap[i]
		e.Count = addSat(e.Count, n)
		if e.Label == "" && label != "" {
			e.Label = Label(label)
		}
		s.down(i)
		return
	}
	e := Entry{Key: strings.Clone(key), Count: n}
	if label != "" {
		e.Label = Label(label)
	}
	if len(s.heap) < s.k {
		s.heap = append(s.heap, e)
		s.index[e.Key] = len(s.heap) - 1
		s.up(len(s.heap) - 1)
		return
	}
	// Take over the smallest counter: its count is the most the new key can have been seen
	// before and not be held.
	old := s.heap[0]
	delete(s.index, old.Key)
	e.Err = old.Count
	e.Count = addSat(old.Count, n)
	s.heap[0] = e
	s.index[e.Key] = 0
	s.down(0)
}

// Peek returns what the sketch holds, the largest first, without resetting it.
func (s *Sketch) Peek() Snapshot {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.snapshot(make([]Entry, len(s.heap)))
}

// Take returns what the sketch holds and empties it, for the next interval: a sidecar
// publishes what one interval refused, so a key refused an hour ago does not stay on top.
func (s *Sketch) Take() Snapshot {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := s.snapshot(make([]Entry, len(s.heap)))
	s.heap = s.heap[:0]
	clear(s.index)
	s.total = 0
	return out
}

func (s *Sketch) snapshot(dst []Entry) Snapshot {
	copy(dst, s.heap)
	sortEntries(dst)
	out := Snapshot{Total: s.total, Entries: dst}
	if len(s.heap) == s.k {
		out.Min = s.heap[0].Count
	}
	return out
}

func sortEntries(es []Entry) {
	slices.SortFunc(es, func(a, b Entry) int {
		if c := cmp.Compare(b.Count, a.Count); c != 0 {
			return c
		}
		return strings.Compare(a.Key, b.Key)
	})
}

func (s *Sketch) less(i, j int) bool { return s.heap[i].Count < s.heap[j].Count }

func (s *Sketch) swap(i, j int) {
	s.heap[i], s.heap[j] = s.heap[j], s.heap[i]
	s.index[s.heap[i].Key] = i
	s.index[s.heap[j].Key] = j
}

func (s *Sketch) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if !s.less(i, p) {
			return
		}
		s.swap(i, p)
		i = p
	}
}

func (s *Sketch) down(i int) {
	n := len(s.heap)
	for {
		l := 2*i + 1
		if l >= n {
			return
		}
		m := l
		if r := l + 1; r < n && s.less(r, l) {
			m = r
		}
		if !s.less(m, i) {
			return
		}
		s.swap(i, m)
		i = m
	}
}

// Merge combines snapshots of the same stream's parts (one per replica) into the n largest
// entries of the whole. A key missing from a full part may have been seen there up to that
// part's Min times: its merged Count adds Min and so does its Err, so Count-Err <= true count
// <= Count holds for the merge as for one sketch. The merge allocates in proportion to the
// entries given, never more; the caller bounds those.
func Merge(n int, parts ...Snapshot) Snapshot {
	type acc struct {
		e       Entry
		present uint64 // sum of Min over the parts that hold the key
	}
	var out Snapshot
	var mins uint64
	byKey := make(map[string]*acc)
	var order []*acc
	for _, p := range parts {
		out.Total = addSat(out.Total, p.Total)
		mins = addSat(mins, p.Min)
		for _, e := range p.Entries {
			a := byKey[e.Key]
			if a == nil {
				a = &acc{e: Entry{Key: e.Key}}
				byKey[e.Key] = a
				order = append(order, a)
			}
			a.e.Count = addSat(a.e.Count, e.Count)
			a.e.Err = addSat(a.e.Err, e.Err)
			a.present = addSat(a.present, p.Min)
			if a.e.Label == "" {
				a.e.Label = e.Label
			}
		}
	}
	entries := make([]Entry, 0, len(order))
	for _, a := range order {
		missing := mins - a.present // the Min of every full part that does not hold the key
		a.e.Count = addSat(a.e.Count, missing)
		a.e.Err = addSat(a.e.Err, missing)
		entries = append(entries, a.e)
	}
	sortEntries(entries)
	out.Min = mins // a key no part holds was seen at most this often
	if n >= 0 && len(entries) > n {
		out.Min = max(out.Min, entries[n].Count)
		entries = entries[:n]
	}
	out.Entries = entries
	return out
}

// addSat adds without wrapping: counts come from clients' traffic and, merged, from what
// replicas report, and none of it may wrap a count to a small one.
func addSat(a, b uint64) uint64 {
	if s := a + b; s >= a {
		return s
	}
	return ^uint64(0)
}

// Label returns s as a Sketch keeps a label: at most MaxLabelBytes of valid UTF-8, every
// control or other non-printable character replaced by '?' (a label is a client's bytes, shown
// to a person by kubectl, whose terminal must not take them for escape sequences), in a string
// of its own.
func Label(s string) string {
	s = cut(s, MaxLabelBytes)
	var b strings.Builder
	b.Grow(len(s))
	for i, r := range s {
		switch {
		case r == utf8.RuneError && !utf8.FullRuneInString(s[i:]):
			// A rune cut by the byte bound: drop its start.
			return b.String()
		case r == utf8.RuneError || !unicode.IsPrint(r):
			b.WriteByte('?')
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// cut returns s cut to at most n bytes.
func cut(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}
