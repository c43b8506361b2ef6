package limiter

import (
	"errors"
	"testing"
	"time"

	. "github.com/onsi/gomega"
)

// The local fallback must never admit more than its share in any window-long interval, however
// requests are spread: it is the only limit left while Redis is down.
func TestLocalFallbackAdmitsAtMostItsShareInAnyWindow(t *testing.T) {
	g := NewWithT(t)
	f, err := newFallback(16)
	g.Expect(err).NotTo(HaveOccurred())
	limit := Limit{Algorithm: TokenBucket, Requests: 100, Window: time.Minute, FailureMode: FailureModeLocalFallback}
	const replicas = 4 // share 25
	start := time.Unix(1_700_000_000, 0)
	var admittedAt []time.Time
	// One request every 100ms for three windows.
	for i := range 1800 {
		now := start.Add(time.Duration(i) * 100 * time.Millisecond)
		r := f.allow("k", limit, 1, replicas, now, errors.New("redis down"))
		g.Expect(r.Source).To(Equal(SourceFallback))
		if r.Allowed {
			admittedAt = append(admittedAt, now)
		} else {
			g.Expect(r.RetryAfter).To(BeNumerically(">", 0))
		}
	}
	for i := range admittedAt {
		in := 0
		for _, t2 := range admittedAt[i:] {
			if t2.Sub(admittedAt[i]) < time.Minute {
				in++
			}
		}
		g.Expect(in).To(BeNumerically("<=", 25), "admitted in the minute from %s", admittedAt[i].Sub(start))
	}
	g.Expect(len(admittedAt)).To(BeNumerically(">=", 3*25-5), "the share is used, not starved")
}

func TestLocalFallbackRetryAfterIsEnough(t *testing.T) {
	g := NewWithT(t)
	f, err := newFallback(16)
	g.Expect(err).NotTo(HaveOccurred())
	limit := Limit{Algorithm: FixedWindow, Requests: 10, Window: 10 * time.Second, FailureMode: FailureModeLocalFallback}
	now := time.Unix(1_700_000_000, 0)
	for range 10 {
		g.Expect(f.allow("k", limit, 1, 1, now, nil).Allowed).To(BeTrue())
	}
	r := f.allow("k", limit, 1, 1, now, nil)
	g.Expect(r.Allowed).To(BeFalse())
	g.Expect(f.allow("k", limit, 1, 1, now.Add(r.RetryAfter), nil).Allowed).To(BeTrue())
	g.Expect(f.allow("k", limit, 11, 1, now, nil).RetryAfter).To(Equal(time.Duration(-1)), "a cost over the share never fits")
}
