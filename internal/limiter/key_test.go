package limiter

import (
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/redline-dev/redline/internal/keyscheme"
)

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

func TestStateKeyAppendsTheAlgorithm(t *testing.T) {
	k := keyscheme.Key("shop", "checkout-per-key", "per-api-key", "secret-api-key")
	NewWithT(t).Expect(stateKey(k, TokenBucket)).To(Equal(k + ":tb"))
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
