package rls_test

import (
	"slices"
	"testing"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	"google.golang.org/protobuf/proto"

	"github.com/redline-dev/redline/internal/sidecar/rls"
)

// FuzzHitFor feeds HitFor descriptors decoded from arbitrary protobuf bytes (the seeds under
// testdata/fuzz/FuzzHitFor are marshalled descriptors). Whatever a client sends, the mapping
// names a rule only with both names set, takes every key part from an entry, in order, and
// never takes a selecting entry as a key part.
func FuzzHitFor(f *testing.F) {
	for _, d := range []*rlv3.RateLimitDescriptor{
		desc("policy", "p", "rule", "r", "api_key", "k"),
		desc("generic_key", "p/r", "remote_address", "10.0.0.1"),
		desc("generic_key", "/r"),
		desc("generic_key", "p/"),
		desc("generic_key", "a", "generic_key", "p/r/x", "policy", "p"),
	} {
		b, err := proto.Marshal(d)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var d rlv3.RateLimitDescriptor
		if proto.Unmarshal(b, &d) != nil {
			return
		}
		h, ok := rls.HitFor(&d)
		if !ok {
			return
		}
		if h.Policy == "" || h.Rule == "" {
			t.Fatalf("hit without a rule: %+v", h)
		}
		if len(h.Key) >= len(d.Entries) {
			t.Fatalf("%d key parts from %d entries: a selecting entry became a key part", len(h.Key), len(d.Entries))
		}
		values := make([]string, 0, len(d.Entries))
		for _, e := range d.Entries {
			values = append(values, e.GetValue())
		}
		j := 0
		for _, k := range h.Key {
			i := slices.Index(values[j:], k)
			if i < 0 {
				t.Fatalf("key part %q is not an entry value after position %d of %q", k, j, values)
			}
			j += i + 1
		}
		again, _ := rls.HitFor(&d)
		if !slices.Equal(again.Key, h.Key) || again.Policy != h.Policy || again.Rule != h.Rule {
			t.Fatalf("HitFor is not deterministic: %+v then %+v", h, again)
		}
	})
}
