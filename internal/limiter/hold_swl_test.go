package limiter_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"github.com/redis/go-redis/v9"

	"github.com/redline-dev/redline/internal/limiter"
	"github.com/redline-dev/redline/internal/limiter/scripts"
)

// A SlidingWindowLog hold is not in the log: its units are held beside it, and its settle
// appends one member for what the request used (none for nothing), at the settle's time.
func TestHoldLogAppendsAtSettle(t *testing.T) {
	g := NewWithT(t)
	c := newClient(t, shared.URL())
	l := newLimiter(t, c, limiter.TestOptions{ReplicaID: limiter.NewReplicaID()})
	ctx, key, lim := context.Background(), uniqueKey(t), holdLimit(limiter.SlidingWindowLog, 100)
	log := key + ":swl"

	_, h1, err := l.Reserve(ctx, key, lim, 1, 30, time.Minute)
	g.Expect(err).NotTo(HaveOccurred())
	_, h2, err := l.Reserve(ctx, key, lim, 1, 30, time.Minute)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(c.ZCard(ctx, log).Val()).To(BeZero(), "a reserve writes no member")
	g.Expect(c.Get(ctx, log+":held").Val()).To(Equal("60"))
	r, err := l.Allow(ctx, key, lim, 1)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(r.Remaining).To(Equal(int64(99)), "a plain decision does not read what is held")

	before := redisNowMS(t, c)
	g.Expect(l.Settle(ctx, h1, 12)).To(Equal(limiter.Settled{Returned: 18}))
	g.Expect(l.Settle(ctx, h2, 0)).To(Equal(limiter.Settled{Returned: 30}))
	members, err := c.ZRangeWithScores(ctx, log, 0, -1).Result()
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(members).To(HaveLen(2), "the decision's and one settle's")
	g.Expect(members[1].Member).To(Equal(fmt.Sprintf("%017d", 13)), "the running total goes on")
	g.Expect(int64(members[1].Score)).To(BeNumerically(">=", before), "counted from the settle")
	g.Expect(c.Get(ctx, log+":held").Val()).To(Equal("0"))
	g.Expect(counted(t, c, key, lim)).To(Equal(int64(13)))
}

// A reserve that a failover lost (Redis lost it: FLUSHALL) leaves its settle without a record
// before its deadline: what is held now is other holds', and stays; the use is appended. Taking
// the lost hold's units off it instead would let the other holds' units be held again.
func TestHoldLogLostReserve(t *testing.T) {
	g := NewWithT(t)
	srv := startOwnRedis(t)
	c := newClient(t, srv.URL())
	l := newLimiter(t, c, limiter.TestOptions{ReplicaID: limiter.NewReplicaID()})
	ctx, key, lim := context.Background(), uniqueKey(t), holdLimit(limiter.SlidingWindowLog, 100)

	_, lost, err := l.Reserve(ctx, key, lim, 1, 50, time.Minute)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(c.FlushAll(ctx).Err()).To(Succeed())
	_, kept, err := l.Reserve(ctx, key, lim, 1, 70, time.Minute)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(kept.Units).To(Equal(int64(70)), "the log keeps no shares: the lost hold is not restored")
	s, err := l.Settle(ctx, lost, 10)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(s).To(Equal(limiter.Settled{Returned: 40}))
	g.Expect(counted(t, c, key, lim)).To(Equal(int64(80)), "70 held and 10 used")
	r, h, err := l.Reserve(ctx, key, lim, 31, 31, time.Minute)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(h).To(BeNil())
	g.Expect(r.Allowed).To(BeFalse())
	g.Expect(r.RetryAfter).To(BeNumerically(">", 0))
	g.Expect(r.RetryAfter).To(BeNumerically("<=", time.Second), "a second at most while holds are open: their settles give back at any time")
}

// The log is the tenant's: a newest member that is no running total has the settle refuse
// before it writes anything, and the hold stays counted (moved into the log as spent at its
// deadline).
func TestHoldLogNotATotal(t *testing.T) {
	g := NewWithT(t)
	c := newClient(t, shared.URL())
	l := newLimiter(t, c, limiter.TestOptions{ReplicaID: limiter.NewReplicaID()})
	ctx, key, lim := context.Background(), uniqueKey(t), holdLimit(limiter.SlidingWindowLog, 100)
	log := key + ":swl"
	_, h, err := l.Reserve(ctx, key, lim, 1, 10, time.Minute)
	g.Expect(err).NotTo(HaveOccurred())
	recs, err := c.ZRange(ctx, log+":h", 0, -1).Result()
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(recs).To(HaveLen(1))
	for _, m := range []string{"nan", "inf", "1e300", "-5", "1.5", "x", string(make([]byte, 40))} {
		g.Expect(c.Del(ctx, log).Err()).To(Succeed())
		g.Expect(c.ZAdd(ctx, log, redis.Z{Score: float64(redisNowMS(t, c)), Member: m}).Err()).To(Succeed())
		err := c.EvalSha(ctx, scripts.HoldSettleSlidingWindowLog().SHA, []string{log, log + ":h", log + ":held"},
			100, longWindow.Milliseconds(), recs[0], 5, time.Now().Add(time.Hour).UnixMilli()).Err()
		g.Expect(err).To(MatchError(ContainSubstring("not a running total")), "%q", m)
		g.Expect(c.ZRange(ctx, log+":h", 0, -1).Val()).To(Equal(recs), "%q: nothing written", m)
		g.Expect(c.ZCard(ctx, log).Val()).To(Equal(int64(1)))
	}
	g.Expect(c.Del(ctx, log).Err()).To(Succeed())
	g.Expect(l.Settle(ctx, h, 5)).To(Equal(limiter.Settled{Returned: 5}))
}
