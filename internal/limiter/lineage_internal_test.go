package limiter

import (
	"fmt"
	"testing"
)

// What a reply's replication IDs say about the node that answered, shard by shard.
func TestLineagesSeeANodeChange(t *testing.T) {
	const a, b, c = "aaaa", "bbbb", "cccc"
	cases := []struct {
		name                   string
		shard, before, id, id2 string
		known                  map[string]string // shard -> ID recorded before the call
		changed                bool
	}{
		{name: "first call to a shard", shard: "s1", id: a, id2: noLineage},
		{name: "the same node", shard: "s1", before: a, id: a, id2: noLineage, known: map[string]string{"s1": a}},
		{name: "restarted (new ID)", shard: "s1", before: a, id: b, id2: noLineage, known: map[string]string{"s1": a}, changed: true},
		{name: "a promoted replica behind the old address (MOVED)", shard: "s1", before: a, id: b, id2: a, known: map[string]string{"s1": a}, changed: true},
		{name: "a promoted replica under its own address, of a master known", shard: "s2", id: b, id2: a, known: map[string]string{"s1": a}, changed: true},
		{name: "a promoted replica of a master never talked to", shard: "s2", id: b, id2: c, known: map[string]string{"s1": a}},
		{name: "recorded by another call meanwhile, same node", shard: "s1", id: a, id2: noLineage, known: map[string]string{"s1": a}},
		{name: "recorded by another call meanwhile, another node", shard: "s1", id: b, id2: noLineage, known: map[string]string{"s1": a}, changed: true},
		{name: "several nodes under other: only a known replid2 tells", shard: shardOther, id: b, id2: noLineage, known: map[string]string{shardOther: a}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ls := newLineages()
			for s, id := range tc.known {
				ls.observe(s, "", id, noLineage, func() {})
			}
			ran := false
			got := ls.observe(tc.shard, tc.before, tc.id, tc.id2, func() { ran = true })
			if got != tc.changed || ran != tc.changed {
				t.Fatalf("observe = %v (onChange ran: %v), want %v", got, ran, tc.changed)
			}
			if tc.shard != shardOther && ls.of(tc.shard) != tc.id {
				t.Fatalf("the shard's ID is %q after the reply, want %q", ls.of(tc.shard), tc.id)
			}
		})
	}
}

// Whatever IDs and shard names the replies carry, the memory stays bounded.
func TestLineagesBounded(t *testing.T) {
	ls := newLineages()
	for i := range 3 * maxLineages {
		ls.observe(fmt.Sprint("shard", i), "", fmt.Sprint("id", i), noLineage, func() {})
	}
	if len(ls.byShard) > maxLineages || len(ls.seen) > maxLineages {
		t.Fatalf("%d shards and %d IDs remembered, bound %d", len(ls.byShard), len(ls.seen), maxLineages)
	}
}
