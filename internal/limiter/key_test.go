package limiter

import (
	"strings"
	"testing"
	"time"

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
	g.Expect(stateKey(k, TokenBucket)).To(Equal(k + ":tb"))
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
		if tag := hashTag(stateKey(k, SlidingWindowCounter)); tag != k[4:len(k)-1] {
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

func FuzzDecodeReply(f *testing.F) {
	f.Add(int64(1), int64(4), int64(0), int64(1000), 4)
	f.Add(int64(0), int64(0), int64(-1), int64(5), 4)
	f.Add(int64(2), int64(-3), int64(-9), int64(1<<62), 3)
	f.Fuzz(func(t *testing.T, a, rem, retry, reset int64, n int) {
		vals := []int64{a, rem, retry, reset, 0}
		if n >= 0 && n <= len(vals) {
			vals = vals[:n]
		}
		r, _, err := decodeReply(vals)
		if err != nil {
			if r != (Result{}) {
				t.Fatalf("error %v with a non-zero result %+v", err, r)
			}
			return
		}
		if len(vals) != 4 {
			t.Fatalf("decoded %d values", len(vals))
		}
		if r.Allowed == r.OverLimit {
			t.Fatalf("allowed and over-limit agree: %+v", r)
		}
		if r.Allowed && r.RetryAfter != 0 {
			t.Fatalf("admitted with a retry-after: %+v", r)
		}
		if r.Remaining < 0 || r.ResetAfter < 0 || r.RetryAfter < -1 {
			t.Fatalf("negative value decoded: %+v", r)
		}
		if r.Source != SourceRedis {
			t.Fatalf("source %s", r.Source)
		}
	})
}

func TestLimitValidate(t *testing.T) {
	good := Limit{Algorithm: FixedWindow, Requests: 1, Window: time.Millisecond}
	cases := map[string]func(*Limit){
		"unknown algorithm": func(l *Limit) { l.Algorithm = "Leaky" },
		"zero requests":     func(l *Limit) { l.Requests = 0 },
		"sub-ms window":     func(l *Limit) { l.Window = time.Microsecond },
		"negative burst":    func(l *Limit) { l.Burst = -1 },
		"unknown mode":      func(l *Limit) { l.FailureMode = "Sometimes" },
	}
	NewWithT(t).Expect(good.Validate()).To(Succeed())
	for name, mutate := range cases {
		t.Run(name, func(t *testing.T) {
			l := good
			mutate(&l)
			NewWithT(t).Expect(l.Validate()).To(MatchError(ErrInvalidLimit))
		})
	}
}
