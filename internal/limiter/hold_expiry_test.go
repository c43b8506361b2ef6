package limiter_test

import (
	"context"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"github.com/redis/go-redis/v9"

	"github.com/redline-dev/redline/internal/limiter"
)

// holdsKey is where Redis keeps key's hold records under lim.
func holdsKey(key string, lim limiter.Limit) string {
	switch lim.Algorithm {
	case limiter.TokenBucket:
		return key + ":tb:h"
	case limiter.SlidingWindowLog:
		return key + ":swl:h"
	}
	return key + ":swc:h"
}

// waitHoldsDue waits until Redis's clock has passed every hold record's deadline of key.
func waitHoldsDue(t *testing.T, c redis.UniversalClient, key string, lim limiter.Limit) {
	t.Helper()
	recs, err := c.ZRangeWithScores(context.Background(), holdsKey(key, lim), -1, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) == 1 {
		waitRedisMS(t, c, int64(recs[0].Score)+1)
	}
}

// A hold nobody settles by its deadline counts as spent: its holder is taken for dead (its
// request may have been served in full), so no unit of it goes back. Another replica's reserve
// sweeps its record and still finds its units counted; the replica that held it keeps them in
// its share, so it restores nothing Redis lacks; a late settle finds them counted and settles
// as a timely one would (the log gives nothing back: the sweep put the hold in it, spent).
func TestHoldExpiry(t *testing.T) {
	holdAll(t, func(t *testing.T, alg limiter.Algorithm) {
		g := NewWithT(t)
		c := newClient(t, shared.URL())
		a := newLimiter(t, c, limiter.TestOptions{ReplicaID: limiter.NewReplicaID()})
		b := newLimiter(t, newClient(t, shared.URL()), limiter.TestOptions{ReplicaID: limiter.NewReplicaID()})
		killed := newLimiter(t, newClient(t, shared.URL()), limiter.TestOptions{ReplicaID: limiter.NewReplicaID()})
		ctx, key, lim := context.Background(), uniqueKey(t), holdLimit(alg, 100)

		_, h, err := a.Reserve(ctx, key, lim, 1, 30, 300*time.Millisecond)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(h.Units).To(Equal(int64(30)))
		_, hk, err := killed.Reserve(ctx, key, lim, 1, 20, 300*time.Millisecond)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(hk.Units).To(Equal(int64(20)))
		killed.Close()
		g.Expect(counted(t, c, key, lim)).To(Equal(int64(50)))

		waitHoldsDue(t, c, key, lim)
		r, hb, err := b.Reserve(ctx, key, lim, 1, 1, time.Minute)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(r.Allowed).To(BeTrue())
		g.Expect(c.ZCard(ctx, holdsKey(key, lim)).Val()).To(Equal(int64(1)), "the expired records were swept")
		g.Expect(counted(t, c, key, lim)).To(Equal(int64(51)), "both expired holds stay spent")
		r, _, err = b.Reserve(ctx, key, lim, 50, 50, time.Minute)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(r.Allowed).To(BeFalse(), "49 are left, not 99")

		// The replica that held it asks again: its share counts the hold, as Redis does.
		r, err = a.Allow(ctx, key, lim, 1)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(r.Allowed).To(BeTrue())
		g.Expect(a.TestStats().RestoredUnits).To(BeZero())
		g.Expect(counted(t, c, key, lim)).To(Equal(int64(52)))

		s, err := a.Settle(ctx, h, 10)
		g.Expect(err).NotTo(HaveOccurred())
		if alg == limiter.SlidingWindowLog {
			g.Expect(s).To(Equal(limiter.Settled{Expired: true}))
			g.Expect(counted(t, c, key, lim)).To(Equal(int64(52)))
		} else {
			g.Expect(s).To(Equal(limiter.Settled{Returned: 20, Expired: true}), "a late settle gives back what was not used")
			g.Expect(counted(t, c, key, lim)).To(Equal(int64(32)))
		}
		_, err = b.Settle(ctx, hb, 1)
		g.Expect(err).NotTo(HaveOccurred())
		st := a.TestStats()
		g.Expect(st.HoldsExpired).To(Equal(uint64(1)))
		if alg == limiter.FixedWindow || alg == limiter.SlidingWindowCounter {
			g.Expect(st.HoldsLapsed).To(Equal(uint64(1)), "only the window state's holds are in shares")
		}
		g.Expect(a.TestStats().RestoredUnits).To(BeZero())
	})
}

// A late settle past its hold charges the excess as debt, the hold's units being spent already.
func TestHoldExpiredDebt(t *testing.T) {
	holdAll(t, func(t *testing.T, alg limiter.Algorithm) {
		g := NewWithT(t)
		c := newClient(t, shared.URL())
		l := newLimiter(t, c, limiter.TestOptions{ReplicaID: limiter.NewReplicaID()})
		ctx, key, lim := context.Background(), uniqueKey(t), holdLimit(alg, 100)
		_, h, err := l.Reserve(ctx, key, lim, 1, 30, 200*time.Millisecond)
		g.Expect(err).NotTo(HaveOccurred())
		waitHoldsDue(t, c, key, lim)
		_, _, err = l.Reserve(ctx, key, lim, 1, 1, time.Minute) // sweeps it
		g.Expect(err).NotTo(HaveOccurred())
		s, err := l.Settle(ctx, h, 45)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(s).To(Equal(limiter.Settled{Debt: 15, Expired: true}))
		g.Expect(counted(t, c, key, lim)).To(Equal(int64(46)))
	})
}

// Beyond MaxHolds a hold keeps no share: nothing of it is restored after a failover. Past
// their deadlines both stay spent, until their settles give back what was not used.
func TestHoldBeyondMaxHolds(t *testing.T) {
	g := NewWithT(t)
	c := newClient(t, shared.URL())
	a := newLimiter(t, c, limiter.TestOptions{ReplicaID: limiter.NewReplicaID(), MaxHolds: 1})
	b := newLimiter(t, newClient(t, shared.URL()), limiter.TestOptions{ReplicaID: limiter.NewReplicaID()})
	ctx, key, lim := context.Background(), uniqueKey(t), holdLimit(limiter.FixedWindow, 100)
	_, h1, err := a.Reserve(ctx, key, lim, 1, 10, 200*time.Millisecond)
	g.Expect(err).NotTo(HaveOccurred())
	_, h2, err := a.Reserve(ctx, key, lim, 1, 7, 200*time.Millisecond)
	g.Expect(err).NotTo(HaveOccurred())
	st := a.TestStats()
	g.Expect(st.HoldsOpen).To(Equal(1))
	g.Expect(st.HoldsUntracked).To(Equal(uint64(1)))
	g.Expect(st.UnkeptShareUnits).To(Equal(uint64(7)))

	waitHoldsDue(t, c, key, lim)
	_, _, err = b.Reserve(ctx, key, lim, 1, 1, time.Minute)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(counted(t, c, key, lim)).To(Equal(int64(18)))
	_, err = a.Allow(ctx, key, lim, 1)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(a.TestStats().RestoredUnits).To(BeZero())
	g.Expect(counted(t, c, key, lim)).To(Equal(int64(19)))
	var back int64
	for _, h := range []*limiter.Hold{h1, h2} {
		s, err := a.Settle(ctx, h, 1)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(s.Expired).To(BeTrue())
		back += s.Returned
	}
	// Both give back what they did not use: Redis's field of the replica counts h2 (Redis
	// counted its grant), only this replica's own share did not.
	g.Expect(back).To(Equal(int64(15)))
	g.Expect(counted(t, c, key, lim)).To(Equal(int64(4)))
}

// Redis loses everything between a reserve and its settle (FLUSHALL: a failover to a replica
// that lagged, a restart): the replica's share restores the held units, and the settle gives
// back what was not used of them; past its deadline too (the hold stayed spent, in the share).
func TestHoldFailover(t *testing.T) {
	for _, alg := range []limiter.Algorithm{limiter.FixedWindow, limiter.SlidingWindowCounter} {
		t.Run(string(alg), func(t *testing.T) {
			g := NewWithT(t)
			srv := startOwnRedis(t)
			c := newClient(t, srv.URL())
			l := newLimiter(t, c, limiter.TestOptions{ReplicaID: limiter.NewReplicaID()})
			ctx, key, lim := context.Background(), uniqueKey(t), holdLimit(alg, 100)

			_, h, err := l.Reserve(ctx, key, lim, 1, 50, time.Minute)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(c.FlushAll(ctx).Err()).To(Succeed())
			s, err := l.Settle(ctx, h, 20)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(s).To(Equal(limiter.Settled{Returned: 30}))
			g.Expect(counted(t, c, key, lim)).To(Equal(int64(20)))
			g.Expect(l.TestStats().RestoredUnits).To(Equal(uint64(50)))

			_, h, err = l.Reserve(ctx, key, lim, 1, 40, 200*time.Millisecond)
			g.Expect(err).NotTo(HaveOccurred())
			waitHoldsDue(t, c, key, lim)
			g.Expect(c.FlushAll(ctx).Err()).To(Succeed())
			s, err = l.Settle(ctx, h, 5)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(s).To(Equal(limiter.Settled{Returned: 35, Expired: true}))
			// The share restored the 20 used before and the expired hold's 40, of which the
			// settle gave back the 35 not used.
			g.Expect(counted(t, c, key, lim)).To(Equal(int64(25)))
		})
	}
}
