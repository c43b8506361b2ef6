package keyscheme

import (
	"strings"
	"testing"

	. "github.com/onsi/gomega"
)

func TestKeyShape(t *testing.T) {
	g := NewWithT(t)
	k := Key("shop", "checkout-per-key", "per-api-key", "secret-api-key")
	g.Expect(k).To(MatchRegexp(`^rl:\{shop/checkout-per-key/per-api-key/[0-9a-f]{32}\}$`))
	g.Expect(k).NotTo(ContainSubstring("secret"))
	g.Expect(Key("shop", "p", "r", "ab", "c")).NotTo(Equal(Key("shop", "p", "r", "a", "bc")))
	g.Expect(Key("shop", "p", "r", "x")).To(Equal(Key("shop", "p", "r", "x")))
	g.Expect(Key("a/b", "c", "d")).NotTo(Equal(Key("a", "b/c", "d")))
	g.Expect(Key("n{s}", "p", "r")).To(HavePrefix("rl:{n%7Bs%7D/"))
}

// hashTag returns what Redis Cluster hashes: the text between the first '{' and the next '}'.
func hashTag(k string) string {
	i := strings.IndexByte(k, '{')
	j := strings.IndexByte(k[i+1:], '}')
	return k[i+1 : i+1+j]
}

func FuzzKey(f *testing.F) {
	f.Add("shop", "policy", "rule", "client", "")
	f.Add("{", "}", "/", "\x00\xff", "}{")
	f.Add("", "", "", "", "")
	f.Fuzz(func(t *testing.T, ns, policy, rule, p1, p2 string) {
		k := Key(ns, policy, rule, p1, p2)
		if !strings.HasPrefix(k, "rl:{") || !strings.HasSuffix(k, "}") {
			t.Fatalf("key %q lacks the rl:{...} frame", k)
		}
		if strings.Count(k, "{") != 1 || strings.Count(k, "}") != 1 {
			t.Fatalf("key %q has stray braces: the hash tag would not cover the whole key", k)
		}
		if tag := hashTag(k + ":swc"); tag != k[4:len(k)-1] {
			t.Fatalf("hash tag %q of %q is not the whole limit identity", tag, k)
		}
		for i := 0; i < len(k); i++ {
			if k[i] < 0x21 || k[i] > 0x7e {
				t.Fatalf("key %q has a non-printable byte at %d", k, i)
			}
		}
		if strings.Count(k, "/") != 3 {
			t.Fatalf("key %q does not have exactly four identity segments", k)
		}
		if k != Key(ns, policy, rule, p1, p2) {
			t.Fatal("key is not deterministic")
		}
		if len(p1) > 0 && k == Key(ns, policy, rule, p1[1:], p2) {
			t.Fatalf("different key material gave the same key %q", k)
		}
	})
}

func TestHashAndPrefix(t *testing.T) {
	g := NewWithT(t)
	k := Key("shop", "p", "r", "x")
	g.Expect(Hash(k)).To(MatchRegexp(`^[0-9a-f]{32}$`))
	g.Expect(k).To(HaveSuffix("/" + Hash(k) + "}"))
	g.Expect(Hash("rl:{shop}")).To(BeEmpty(), "not a key Key built")
	g.Expect(k).To(HavePrefix(Prefix("shop")))
	g.Expect(Key("shop2", "p", "r", "x")).NotTo(HavePrefix(Prefix("shop")))
	g.Expect(Part("a b/{c}")).To(Equal("a%20b%2F%7Bc%7D"))
}
