package topkeys

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
)

// truth counts a stream exactly, for comparison.
type truth map[string]uint64

func (t truth) top(n int) []string {
	keys := make([]string, 0, len(t))
	for k := range t {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b string) int {
		if t[a] != t[b] {
			if t[a] > t[b] {
				return -1
			}
			return 1
		}
		if a < b {
			return -1
		}
		return 1
	})
	return keys[:min(n, len(keys))]
}

func zipfStream(seed uint64, n int, keys uint64, s float64) []string {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	z := rand.NewZipf(r, s, 1, keys-1)
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%032x", z.Uint64())
	}
	return out
}

// checkBounds holds the Space-Saving guarantees of snap against the exact counts of its stream.
// all says snap holds everything the sketch kept (not a merge cut to its top entries), so
// every key seen more than Total/k times must be in it.
func checkBounds(t *testing.T, snap Snapshot, exact truth, k int, all bool) {
	t.Helper()
	var total uint64
	for _, c := range exact {
		total += c
	}
	if snap.Total != total {
		t.Fatalf("Total = %d, the stream had %d", snap.Total, total)
	}
	held := map[string]bool{}
	for _, e := range snap.Entries {
		held[e.Key] = true
		c := exact[e.Key]
		if e.Count < c || e.Count-e.Err > c {
			t.Fatalf("key %s: Count %d Err %d, true count %d: not Count-Err <= true <= Count", e.Key, e.Count, e.Err, c)
		}
		if e.Err > total/uint64(k) {
			t.Fatalf("key %s: Err %d over Total/k = %d", e.Key, e.Err, total/uint64(k))
		}
	}
	for key, c := range exact {
		if all && c > total/uint64(k) && !held[key] {
			t.Fatalf("key %s seen %d times (> Total/k = %d) is not held", key, c, total/uint64(k))
		}
		if !held[key] && c > snap.Min {
			t.Fatalf("key %s seen %d times is missing, but Min is %d", key, c, snap.Min)
		}
	}
}

func TestSketchKeepsItsBoundsOnRandomStreams(t *testing.T) {
	for seed := range uint64(50) {
		r := rand.New(rand.NewPCG(seed, 1))
		k := 1 + r.IntN(16)
		s := New(k)
		exact := truth{}
		for range 2000 {
			key := fmt.Sprint(r.IntN(1 + r.IntN(200)))
			n := uint64(1 + r.IntN(3))
			s.Add(key, n, "")
			exact[key] += n
		}
		snap := s.Peek()
		if len(snap.Entries) > k {
			t.Fatalf("seed %d: %d entries held with capacity %d", seed, len(snap.Entries), k)
		}
		checkBounds(t, snap, exact, k, true)
	}
}

// TestSketchFindsTheTopKeysOfAZipfWorkload: the question an operator asks ("who is refused?")
// answered from 64 counters over a million requests from 100,000 clients.
func TestSketchFindsTheTopKeysOfAZipfWorkload(t *testing.T) {
	const k, top = 64, 10
	for _, skew := range []float64{1.1, 1.5} {
		stream := zipfStream(7, 1_000_000, 100_000, skew)
		s := New(k)
		exact := truth{}
		for _, key := range stream {
			s.Add(key, 1, "")
			exact[key]++
		}
		snap := s.Peek()
		checkBounds(t, snap, exact, k, true)
		want := exact.top(top)
		var got []string
		for _, e := range snap.Entries[:top] {
			got = append(got, e.Key)
		}
		hits := 0
		var worst float64
		for _, key := range want {
			if slices.Contains(got, key) {
				hits++
			}
		}
		for _, e := range snap.Entries[:top] {
			worst = math.Max(worst, float64(e.Count-exact[e.Key])/float64(exact[e.Key]))
		}
		precision := float64(hits) / top
		t.Logf("zipf s=%.1f, 1,000,000 adds over %d distinct keys, k=%d: precision of the top %d %.2f, worst over-count of those %.2f%%",
			skew, len(exact), k, top, precision, 100*worst)
		if precision < 1 {
			t.Errorf("zipf s=%.1f: the sketch's top %d are %v, the true top %d %v (precision %.2f)", skew, top, got, top, want, precision)
		}
	}
}

func TestSketchMemoryIsFixed(t *testing.T) {
	const k = 32
	s := New(k)
	for i := range 200_000 {
		s.Add(fmt.Sprintf("%032x", i), 1, "label")
	}
	s.mu.Lock()
	held, capacity := len(s.index), cap(s.heap)
	s.mu.Unlock()
	if held != k || capacity != k {
		t.Fatalf("after 200,000 distinct keys the sketch holds %d keys in a heap of capacity %d, want %d and %d", held, capacity, k, k)
	}
	// A held key costs nothing; a new one its own copy of key and label (two strings).
	hot := fmt.Sprintf("%032x", 199_999)
	if n := testing.AllocsPerRun(1000, func() { s.Add(hot, 1, "label") }); n != 0 {
		t.Errorf("adding a held key allocates %.1f times, want 0", n)
	}
	i := 0
	keys := make([]string, 1001)
	for j := range keys {
		keys[j] = fmt.Sprintf("new-%028x", j)
	}
	if n := testing.AllocsPerRun(1000, func() { s.Add(keys[i], 1, ""); i++ }); n > 1 {
		t.Errorf("adding a new key allocates %.1f times, want at most 1 (its key's copy)", n)
	}
}

func TestSketchDoesNotRetainTheCallersStrings(t *testing.T) {
	s := New(2)
	long := make([]byte, 1<<16)
	for i := range long {
		long[i] = 'a'
	}
	s.Add(string(long), 1, string(long))
	e := s.Peek().Entries[0]
	if len(e.Key) != MaxKeyBytes || len(e.Label) != MaxLabelBytes {
		t.Fatalf("a 64 KiB key and label are kept as %d and %d bytes, want %d and %d", len(e.Key), len(e.Label), MaxKeyBytes, MaxLabelBytes)
	}
}

func TestLabelIsPrintableAndBounded(t *testing.T) {
	cases := map[string]string{
		"alice":                   "alice",
		"\x1b[2J\x1b]0;pwned\x07": "?[2J?]0;pwned?",
		"tab\there\nnewline":      "tab?here?newline",
		"\xff\xfe":                "??",
		"ünïcödé":                 "ünïcödé",
		string(make([]byte, 70)):  string(slices.Repeat([]byte("?"), MaxLabelBytes)),
		"a" + string(slices.Repeat([]rune("é"), 40)): "a" + string(slices.Repeat([]rune("é"), 31)), // 1+62 bytes; the cut é is dropped
	}
	for in, want := range cases {
		if got := Label(in); got != want {
			t.Errorf("Label(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestTakeEmptiesTheSketch(t *testing.T) {
	s := New(4)
	s.Add("a", 5, "")
	s.Add("b", 1, "")
	first := s.Take()
	if first.Total != 6 || len(first.Entries) != 2 || first.Entries[0].Key != "a" {
		t.Fatalf("first Take = %+v", first)
	}
	if second := s.Take(); second.Total != 0 || len(second.Entries) != 0 {
		t.Fatalf("a Take after a Take = %+v, want empty", second)
	}
	s.Add("c", 1, "")
	if third := s.Take(); third.Total != 1 || len(third.Entries) != 1 || third.Entries[0].Key != "c" {
		t.Fatalf("Take after new adds = %+v", third)
	}
}

func TestCountsSaturateInsteadOfWrapping(t *testing.T) {
	s := New(1)
	s.Add("a", math.MaxUint64-1, "")
	s.Add("a", 10, "")
	s.Add("b", 10, "") // takes over a's counter
	snap := s.Peek()
	if snap.Total != math.MaxUint64 || snap.Entries[0].Count != math.MaxUint64 {
		t.Fatalf("saturated sketch = %+v, want Total and Count at the maximum", snap)
	}
	m := Merge(1, snap, snap)
	if m.Total != math.MaxUint64 || m.Entries[0].Count != math.MaxUint64 {
		t.Fatalf("saturated merge = %+v", m)
	}
}

// TestMergeOfReplicasKeepsTheBounds: three replicas each see a part of the traffic (a load
// balancer's share, uneven); their merged summary finds the fleet's heavy hitters and keeps
// Count-Err <= true <= Count.
func TestMergeOfReplicasKeepsTheBounds(t *testing.T) {
	const k = 32
	stream := zipfStream(11, 300_000, 50_000, 1.2)
	r := rand.New(rand.NewPCG(3, 3))
	sketches := []*Sketch{New(k), New(k), New(k)}
	exact := truth{}
	for _, key := range stream {
		sketches[r.IntN(3)].Add(key, 1, "")
		exact[key]++
	}
	parts := make([]Snapshot, len(sketches))
	for i, s := range sketches {
		parts[i] = s.Take()
	}
	m := Merge(10, parts...)
	if len(m.Entries) != 10 {
		t.Fatalf("merge kept %d entries, want 10", len(m.Entries))
	}
	checkBounds(t, m, exact, k, false) // each part's Err and Min are at most its Total/k, so the merge's Err is at most Total/k
	want := exact.top(5)
	for _, key := range want {
		found := false
		for _, e := range m.Entries[:5] {
			found = found || e.Key == key
		}
		if !found {
			t.Errorf("the fleet's true top 5 %v: %s is not in the merge's top 5 %v", want, key, m.Entries[:5])
		}
	}
}

func TestSketchIsSafeForConcurrentUse(t *testing.T) {
	s := New(8)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 10_000 {
				s.Add(fmt.Sprint(i%20+g), 1, "")
				if i%1000 == 0 {
					s.Peek()
				}
			}
		})
	}
	wg.Wait()
	if got := s.Peek().Total; got != 80_000 {
		t.Fatalf("Total after 80,000 concurrent adds = %d", got)
	}
}

func BenchmarkAdd(b *testing.B) {
	stream := zipfStream(5, 1<<16, 100_000, 1.1)
	for _, k := range []int{16, 64} {
		b.Run(fmt.Sprintf("k=%d", k), func(b *testing.B) {
			s := New(k)
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				s.Add(stream[i&(len(stream)-1)], 1, "")
				i++
			}
		})
	}
}
