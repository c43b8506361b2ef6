package limiter_test

import (
	"context"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/redline-dev/redline/internal/limiter"
)

// direct returns a limiter without pre-check, so every decision is the script's.
func direct(t *testing.T) *limiter.Limiter {
	return newLimiter(t, newClient(t, shared.URL()), limiter.TestOptions{PrecheckSize: -1})
}

func allowN(t *testing.T, l *limiter.Limiter, key string, lim limiter.Limit, cost int64, n int) (admitted int, last limiter.Result) {
	t.Helper()
	for range n {
		r, err := l.Allow(context.Background(), key, lim, cost)
		if err != nil {
			t.Fatalf("Allow: %v", err)
		}
		if r.Source != limiter.SourceRedis {
			t.Fatalf("decision from %s, want redis (err %v)", r.Source, r.Err)
		}
		if r.Allowed {
			admitted++
		}
		last = r
	}
	return admitted, last
}

func TestAlgorithmsAdmitUpToTheLimitThenRefuse(t *testing.T) {
	allAlgorithms(t, func(t *testing.T, alg limiter.Algorithm) {
		g := NewWithT(t)
		l := direct(t)
		key := uniqueKey(t)
		lim := limiter.Limit{Algorithm: alg, Requests: 5, Window: time.Hour}
		for i := range 5 {
			r, err := l.Allow(context.Background(), key, lim, 1)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(r.Allowed).To(BeTrue(), "request %d", i)
			g.Expect(r.Remaining).To(Equal(int64(4-i)), "remaining after request %d", i)
			g.Expect(r.RetryAfter).To(BeZero())
			g.Expect(r.ResetAfter).To(BeNumerically(">", 0))
			g.Expect(r.ResetAfter).To(BeNumerically("<=", 2*time.Hour))
		}
		r, err := l.Allow(context.Background(), key, lim, 1)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(r.Allowed).To(BeFalse())
		g.Expect(r.OverLimit).To(BeTrue())
		g.Expect(r.Remaining).To(BeZero())
		g.Expect(r.RetryAfter).To(BeNumerically(">", 0))
		g.Expect(r.RetryAfter).To(BeNumerically("<=", 2*time.Hour))
	})
}

func TestAlgorithmsChargeTheCost(t *testing.T) {
	allAlgorithms(t, func(t *testing.T, alg limiter.Algorithm) {
		g := NewWithT(t)
		l := direct(t)
		key := uniqueKey(t)
		lim := limiter.Limit{Algorithm: alg, Requests: 10, Window: time.Hour}
		steps := []struct {
			cost      int64
			allowed   bool
			remaining int64
		}{
			{4, true, 6}, {4, true, 2}, {3, false, 2}, {2, true, 0}, {1, false, 0},
		}
		for i, s := range steps {
			r, err := l.Allow(context.Background(), key, lim, s.cost)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(r.Allowed).To(Equal(s.allowed), "step %d (cost %d)", i, s.cost)
			g.Expect(r.Remaining).To(Equal(s.remaining), "step %d (cost %d)", i, s.cost)
		}
		// A cost above the limit can never pass, and says so.
		r, err := l.Allow(context.Background(), uniqueKey(t), lim, 11)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(r.Allowed).To(BeFalse())
		g.Expect(r.RetryAfter).To(Equal(time.Duration(-1)))

		_, err = l.Allow(context.Background(), key, lim, 0)
		g.Expect(err).To(MatchError(limiter.ErrInvalidLimit))
	})
}

// After a refusal, waiting the retry-after is enough to be admitted. The windows are short so
// the test waits for real; it asserts what is admitted, not how fast anything runs.
func TestRetryAfterIsEnough(t *testing.T) {
	allAlgorithms(t, func(t *testing.T, alg limiter.Algorithm) {
		t.Parallel()
		g := NewWithT(t)
		l := direct(t)
		key := uniqueKey(t)
		lim := limiter.Limit{Algorithm: alg, Requests: 4, Window: 400 * time.Millisecond}
		for range 3 {
			var last limiter.Result
			for i := 0; i < 100 && (i == 0 || last.Allowed); i++ {
				_, last = allowN(t, l, key, lim, 1, 1)
			}
			g.Expect(last.Allowed).To(BeFalse())
			g.Expect(last.RetryAfter).To(BeNumerically(">", 0))
			g.Expect(last.RetryAfter).To(BeNumerically("<=", 2*lim.Window))
			time.Sleep(last.RetryAfter)
			r, err := l.Allow(context.Background(), key, lim, 1)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(r.Allowed).To(BeTrue(), "after waiting the retry-after %s", last.RetryAfter)
		}
	})
}

// waitForWindowEnd blocks until Redis's clock is in the last quarter of a window-aligned period
// and returns how long is left of it.
func waitForWindowEnd(t *testing.T, window time.Duration) time.Duration {
	t.Helper()
	c := newClient(t, shared.URL())
	for {
		now, err := c.Time(context.Background()).Result()
		if err != nil {
			t.Fatalf("reading redis time: %v", err)
		}
		left := window - time.Duration(now.UnixNano())%window
		if left < window/4 && left > window/10 {
			return left
		}
		time.Sleep(min(left-window/4+window/20, left))
	}
}

// A fixed window admits a second full limit right after its boundary; the sliding algorithms
// and the token bucket do not.
func TestBoundaryBurst(t *testing.T) {
	allAlgorithms(t, func(t *testing.T, alg limiter.Algorithm) {
		t.Parallel()
		g := NewWithT(t)
		l := direct(t)
		key := uniqueKey(t)
		lim := limiter.Limit{Algorithm: alg, Requests: 20, Window: 2 * time.Second}
		left := waitForWindowEnd(t, lim.Window)
		first, _ := allowN(t, l, key, lim, 1, 20)
		g.Expect(first).To(Equal(20))
		time.Sleep(left + 50*time.Millisecond) // just past the boundary
		second, _ := allowN(t, l, key, lim, 1, 20)
		if alg == limiter.FixedWindow {
			g.Expect(second).To(Equal(20), "fixed window resets at its boundary")
			return
		}
		g.Expect(second).To(BeNumerically("<=", 10), "%s must not admit a second full limit at a window boundary", alg)
	})
}
