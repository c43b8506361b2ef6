package limiter_test

import (
	"context"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/redline-dev/redline/internal/limiter"
)

// stateKeys are the keys Redis keeps for key under lim, with their hold records.
func stateKeys(key string, lim limiter.Limit) []string {
	switch lim.Algorithm {
	case limiter.TokenBucket:
		return []string{key + ":tb", key + ":tb:h"}
	case limiter.SlidingWindowLog:
		return []string{key + ":swl", key + ":swl:h", key + ":swl:held"}
	}
	return []string{key + ":swc", key + ":swc:h"}
}

// The image case of a token budget: 12 concurrent requests each hold 13 units of a budget of
// 10,000 and use 382,510 (inputs the estimate does not see). The books show every unit past the
// holds as debt, the key is refused for as long as its algorithm carries a debt, and no longer:
// by two windows after the settles every algorithm admits a whole budget again, and no key
// outlives that.
func TestHoldDebtInFull(t *testing.T) {
	const clients, held, used = 12, 13, 382_510
	window := 2 * time.Second
	holdAll(t, func(t *testing.T, alg limiter.Algorithm) {
		t.Parallel()
		g := NewWithT(t)
		c := newClient(t, shared.URL())
		l := newLimiter(t, c, limiter.TestOptions{ReplicaID: limiter.NewReplicaID()})
		ctx, key := context.Background(), uniqueKey(t)
		lim := limiter.Limit{Algorithm: alg, Requests: 10_000, Window: window, FailureMode: limiter.FailureModeClosed}
		start := freshWindow(t, c, window)

		holds := make([]*limiter.Hold, clients)
		var wg sync.WaitGroup
		for i := range holds {
			wg.Go(func() {
				_, h, err := l.Reserve(ctx, key, lim, held, held, time.Minute)
				g.Expect(err).NotTo(HaveOccurred())
				holds[i] = h
			})
		}
		wg.Wait()
		var debt int64
		for _, h := range holds {
			g.Expect(h).NotTo(BeNil())
			wg.Go(func() {
				s, err := l.Settle(ctx, h, used)
				g.Expect(err).NotTo(HaveOccurred())
				g.Expect(s).To(Equal(limiter.Settled{Debt: used - held}))
			})
		}
		wg.Wait()
		settled := redisNowMS(t, c)
		g.Expect(settled).To(BeNumerically("<", start+window.Milliseconds()), "reserves and settles in one window")
		debt = int64(l.TestStats().DebtUnits)
		g.Expect(debt).To(Equal(int64(clients*(used-held))), "every unit past the holds is debt")
		t.Logf("%s: %d holds of %d settled at %d each: debt %d", alg, clients, held, used, debt)

		for _, k := range stateKeys(key, lim) {
			ttl := c.PTTL(ctx, k).Val()
			g.Expect(ttl).To(BeNumerically("<=", 2*window), "%s lives at most two windows", k)
			g.Expect(ttl).NotTo(Equal(time.Duration(-1)), "%s has a TTL", k)
		}
		refused := func() bool {
			r, h, err := l.Reserve(ctx, key, lim, 1, 1, time.Minute)
			g.Expect(err).NotTo(HaveOccurred())
			if h != nil {
				_, err = l.Settle(ctx, h, 1)
				g.Expect(err).NotTo(HaveOccurred())
			}
			return !r.Allowed
		}
		g.Expect(refused()).To(BeTrue(), "a key in debt is refused")
		waitRedisMS(t, c, settled+window.Milliseconds()/2)
		g.Expect(refused()).To(BeTrue(), "still in debt half a window later")

		// Three windows after the one the debt was counted in, two past the settles at least,
		// the debt is over in every algorithm: a whole budget is admitted.
		waitRedisMS(t, c, start+3*window.Milliseconds())
		r, h, err := l.Reserve(ctx, key, lim, 10_000, 10_000, time.Minute)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(r.Allowed).To(BeTrue(), "the debt ended with the windows that carry it")
		g.Expect(h.Units).To(Equal(int64(10_000)))
		_, err = l.Settle(ctx, h, 0)
		g.Expect(err).NotTo(HaveOccurred())
	})
}

// A settle claiming more than 2^50 counts 2^50 (a lie: no response uses that much), and the
// key's state keeps a TTL Redis accepts and no longer than its algorithm carries a debt.
func TestHoldHugeDebtKeepsItsTTL(t *testing.T) {
	holdAll(t, func(t *testing.T, alg limiter.Algorithm) {
		g := NewWithT(t)
		c := newClient(t, shared.URL())
		l := newLimiter(t, c, limiter.TestOptions{ReplicaID: limiter.NewReplicaID()})
		ctx, key := context.Background(), uniqueKey(t)
		lim := limiter.Limit{Algorithm: alg, Requests: 3, Window: time.Hour, FailureMode: limiter.FailureModeClosed}
		for range 3 {
			_, h, err := l.Reserve(ctx, key, lim, 1, 1, time.Minute)
			g.Expect(err).NotTo(HaveOccurred())
			if h == nil {
				continue // refused: the key is in debt
			}
			s, err := l.Settle(ctx, h, 1<<62)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(s.Debt).To(Equal(int64(limiter.MaxUsed - 1)))
		}
		_, err := l.Charge(ctx, key, lim, 1<<62)
		g.Expect(err).NotTo(HaveOccurred())
		for _, k := range stateKeys(key, lim) {
			if c.Exists(ctx, k).Val() == 0 {
				continue
			}
			ttl := c.PTTL(ctx, k).Val()
			g.Expect(ttl).To(BeNumerically(">", 0), "%s has a TTL", k)
			g.Expect(ttl).To(BeNumerically("<=", 2*lim.Window), "%s lives at most two windows", k)
		}
		r, err := l.Allow(ctx, key, lim, 1)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(r.Allowed).To(BeFalse())
	})
}

// A key holds at most MaxOpenHolds holds at once: the next is refused like a limit's refusal,
// with a Retry-After of a second at most, while another key holds on; a settle frees its place.
func TestHoldOpenBound(t *testing.T) {
	holdAll(t, func(t *testing.T, alg limiter.Algorithm) {
		g := NewWithT(t)
		c := newClient(t, shared.URL())
		l := newLimiter(t, c, limiter.TestOptions{ReplicaID: limiter.NewReplicaID(), MaxOpenHolds: 4})
		other := newLimiter(t, newClient(t, shared.URL()), limiter.TestOptions{ReplicaID: limiter.NewReplicaID(), MaxOpenHolds: 4})
		ctx, key, lim := context.Background(), uniqueKey(t), holdLimit(alg, 1000)
		var holds []*limiter.Hold
		for i := range 4 {
			rl := l
			if i%2 == 1 {
				rl = other // the bound is the key's, in Redis, whichever replica holds
			}
			_, h, err := rl.Reserve(ctx, key, lim, 1, 10, time.Minute)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(h).NotTo(BeNil())
			holds = append(holds, h)
		}
		r, h, err := l.Reserve(ctx, key, lim, 1, 10, time.Minute)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(h).To(BeNil(), "a fifth open hold")
		g.Expect(r.Allowed).To(BeFalse())
		g.Expect(r.RetryAfter).To(BeNumerically(">", 0))
		g.Expect(r.RetryAfter).To(BeNumerically("<=", time.Second))
		g.Expect(counted(t, c, key, lim)).To(Equal(int64(40)), "the refusal counted nothing")

		_, h, err = l.Reserve(ctx, uniqueKey(t), lim, 1, 10, time.Minute)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(h).NotTo(BeNil(), "another key holds on")

		// This replica's settle (another's would leave its refusal repeated for 250ms at most).
		_, err = l.Settle(ctx, holds[0], 10)
		g.Expect(err).NotTo(HaveOccurred())
		r, h, err = l.Reserve(ctx, key, lim, 1, 10, time.Minute)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(r.Allowed).To(BeTrue(), "a settle freed a place")
		g.Expect(h).NotTo(BeNil())
	})
}

// A hold past its deadline no longer counts toward the bound (its holder is taken for dead),
// while its units stay spent.
func TestHoldOpenBoundForgetsTheDead(t *testing.T) {
	holdAll(t, func(t *testing.T, alg limiter.Algorithm) {
		g := NewWithT(t)
		c := newClient(t, shared.URL())
		l := newLimiter(t, c, limiter.TestOptions{ReplicaID: limiter.NewReplicaID(), MaxOpenHolds: 2})
		ctx, key, lim := context.Background(), uniqueKey(t), holdLimit(alg, 1000)
		for range 2 {
			_, h, err := l.Reserve(ctx, key, lim, 1, 10, 200*time.Millisecond)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(h).NotTo(BeNil())
		}
		recs, err := c.ZRangeWithScores(ctx, holdsKey(key, lim), -1, -1).Result()
		g.Expect(err).NotTo(HaveOccurred())
		waitRedisMS(t, c, int64(recs[0].Score)+1)
		_, h, err := l.Reserve(ctx, key, lim, 1, 10, time.Minute)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(h).NotTo(BeNil())
		g.Expect(counted(t, c, key, lim)).To(Equal(int64(30)))
	})
}

// With leases, a hold taken from the key's lease is bounded by the lease (MaxOpenHolds of its
// window unsettled), then asks Redis; its excess is debt in full.
func TestHoldOpenBoundFromLease(t *testing.T) {
	g := NewWithT(t)
	c := newClient(t, shared.URL())
	l := newLimiter(t, c, limiter.TestOptions{ReplicaID: limiter.NewReplicaID(), LeaseHorizon: time.Minute, MaxLease: 100, MaxOpenHolds: 2})
	ctx, key := context.Background(), uniqueKey(t)
	lim := holdLimit(limiter.FixedWindow, 1_000_000)
	lim.Replicas = 1
	for range 2 { // a cold key asks for one unit, then for a warm lease
		_, err := l.Allow(ctx, key, lim, 1)
		g.Expect(err).NotTo(HaveOccurred())
	}
	var leased []*limiter.Hold
	for range 2 {
		r, h, err := l.Reserve(ctx, key, lim, 1, 10, time.Minute)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(r.Source).To(Equal(limiter.SourceLease))
		leased = append(leased, h)
	}
	r, h, err := l.Reserve(ctx, key, lim, 1, 10, time.Minute)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(r.Source).To(Equal(limiter.SourceRedis), "the lease gives two open holds at most")
	g.Expect(h).NotTo(BeNil())
	s, err := l.Settle(ctx, leased[0], 500_000)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(s).To(Equal(limiter.Settled{Debt: 499_990}), "a leased hold's excess is debt in full")
	r, _, err = l.Reserve(ctx, key, lim, 1, 10, time.Minute)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(r.Source).To(Equal(limiter.SourceLease), "a settle freed the lease's place")
}

// A holder killed mid-stream: its holds stay spent past their deadline, so the budget its
// streams were served from is not given to others again in the window. (Before: every unit
// went back at the deadlines, and another replica admitted a second budget.)
func TestHoldKilledHolderKeepsItsUnitsSpent(t *testing.T) {
	holdAll(t, func(t *testing.T, alg limiter.Algorithm) {
		g := NewWithT(t)
		c := newClient(t, shared.URL())
		killed := newLimiter(t, newClient(t, shared.URL()), limiter.TestOptions{ReplicaID: limiter.NewReplicaID()})
		survivor := newLimiter(t, c, limiter.TestOptions{ReplicaID: limiter.NewReplicaID()})
		ctx, key, lim := context.Background(), uniqueKey(t), holdLimit(alg, 10_000)
		for range 10 {
			_, h, err := killed.Reserve(ctx, key, lim, 1000, 1000, 300*time.Millisecond)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(h).NotTo(BeNil())
		}
		killed.Close()
		recs, err := c.ZRangeWithScores(ctx, holdsKey(key, lim), -1, -1).Result()
		g.Expect(err).NotTo(HaveOccurred())
		waitRedisMS(t, c, int64(recs[0].Score)+1)
		// The survivor's reserves sweep the dead holds 16 at a time: none gives a unit back.
		for range 2 {
			r, h, err := survivor.Reserve(ctx, key, lim, 1, 1, time.Minute)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(r.Allowed).To(BeFalse(), "the dead holder's 10,000 are spent")
			g.Expect(h).To(BeNil())
		}
		g.Expect(c.ZCard(ctx, holdsKey(key, lim)).Val()).To(BeZero())
		g.Expect(counted(t, c, key, lim)).To(Equal(int64(10_000)))
	})
}

// A request with no output cap holds all the budget has: the next one of its key is refused,
// but told to retry within a second, not at the window's end, since the first one's settle
// gives back what it did not use at any time.
func TestHoldRefusedWhileHeldRetriesSoon(t *testing.T) {
	holdAll(t, func(t *testing.T, alg limiter.Algorithm) {
		g := NewWithT(t)
		c := newClient(t, shared.URL())
		l := newLimiter(t, c, limiter.TestOptions{ReplicaID: limiter.NewReplicaID()})
		ctx, key, lim := context.Background(), uniqueKey(t), holdLimit(alg, 10_000)
		_, h, err := l.Reserve(ctx, key, lim, 50, 10_000, time.Minute)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(h.Units).To(Equal(int64(10_000)))
		r, none, err := l.Reserve(ctx, key, lim, 50, 10_000, time.Minute)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(none).To(BeNil())
		g.Expect(r.RetryAfter).To(BeNumerically(">", 0))
		g.Expect(r.RetryAfter).To(BeNumerically("<=", time.Second), "not the window's end: %v", r.ResetAfter)
		_, err = l.Settle(ctx, h, 700)
		g.Expect(err).NotTo(HaveOccurred())
		r, h, err = l.Reserve(ctx, key, lim, 50, 10_000, time.Minute)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(r.Allowed).To(BeTrue())
		g.Expect(h.Units).To(Equal(int64(9_300)))
	})
}

// A window's end does not end its holds' places in the bound: a hold reserved in one window
// counts among its key's open holds in the next until its deadline (its units end with their
// window all the same).
func TestHoldOpenBoundAcrossAWindow(t *testing.T) {
	for _, alg := range []limiter.Algorithm{limiter.FixedWindow, limiter.SlidingWindowCounter} {
		t.Run(string(alg), func(t *testing.T) {
			g := NewWithT(t)
			c := newClient(t, shared.URL())
			l := newLimiter(t, c, limiter.TestOptions{ReplicaID: limiter.NewReplicaID(), MaxOpenHolds: 2, PrecheckSize: -1})
			ctx, key := context.Background(), uniqueKey(t)
			lim := limiter.Limit{Algorithm: alg, Requests: 1000, Window: time.Second, FailureMode: limiter.FailureModeClosed}
			start := freshWindow(t, c, lim.Window)
			waitRedisMS(t, c, start+300) // deadlines 300 ms at least into the next window
			for range 2 {
				_, h, err := l.Reserve(ctx, key, lim, 1, 10, time.Second)
				g.Expect(err).NotTo(HaveOccurred())
				g.Expect(h).NotTo(BeNil())
			}
			recs, err := c.ZRangeWithScores(ctx, holdsKey(key, lim), 0, 0).Result()
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(int64(recs[0].Score)).To(BeNumerically(">=", start+1300), "the deadline is a second after the reserve")
			waitRedisMS(t, c, start+lim.Window.Milliseconds())
			r, h, err := l.Reserve(ctx, key, lim, 1, 10, time.Second)
			g.Expect(err).NotTo(HaveOccurred())
			if redisNowMS(t, c) < int64(recs[0].Score) {
				g.Expect(h).To(BeNil(), "the last window's holds are still open")
				g.Expect(r.Allowed).To(BeFalse())
			}
			waitRedisMS(t, c, int64(recs[0].Score)+1)
			_, h, err = l.Reserve(ctx, key, lim, 1, 10, time.Second)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(h).NotTo(BeNil(), "past their deadline they no longer count")
		})
	}
}
