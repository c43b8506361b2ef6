package limiter_test

import (
	"context"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"github.com/redis/go-redis/v9"

	"github.com/redline-dev/redline/internal/limiter"
	"github.com/redline-dev/redline/internal/limiter/scripts"
)

// take is one try of l on key, of one slot, for w (nil: a try without a waiter): whether it
// was granted, and the slot to release.
func take(g Gomega, l *limiter.Limiter, key string, w *limiter.Waiter) (bool, *limiter.Slot) {
	var res limiter.SlotResult
	var s *limiter.Slot
	var err error
	if w == nil {
		res, s, err = l.Acquire(context.Background(), key, inFlight(1))
	} else {
		res, s, err = l.AcquireInTurn(context.Background(), key, inFlight(1), w)
	}
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(res.Err).NotTo(HaveOccurred())
	g.Expect(res.Allowed).To(Equal(s != nil))
	return res.Allowed, s
}

// Two replicas on a key of one slot: a waiter of the one that does not hold it joins the line,
// and when the slot is given back neither a newcomer nor a later waiter of the other replica
// passes it; each gets its turn in the order it came, and the line is gone once nobody waits.
func TestSlotLineTakesTurnsAcrossReplicas(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	c := newClient(t, shared.URL())
	a := newLimiter(t, newClient(t, shared.URL()), limiter.TestOptions{ReplicaID: limiter.NewReplicaID()})
	b := newLimiter(t, newClient(t, shared.URL()), limiter.TestOptions{ReplicaID: limiter.NewReplicaID()})
	key := uniqueKey(t)
	line, due := key+":q", key+":qd"

	ok, held := take(g, a, key, nil)
	g.Expect(ok).To(BeTrue())
	wb := &limiter.Waiter{Expiry: time.Hour}
	ok, _ = take(g, b, key, wb)
	g.Expect(ok).To(BeFalse(), "the key is full")
	g.Expect(c.ZCard(ctx, line).Val()).To(Equal(int64(1)), "b's waiter joined the line")
	g.Expect(c.PTTL(ctx, line).Val()).To(BeNumerically(">", 0))
	g.Expect(c.PTTL(ctx, due).Val()).To(BeNumerically(">", 0))

	a.Release(ctx, held)
	res, _, err := a.Acquire(ctx, key, inFlight(1))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(res.Allowed).To(BeFalse(), "a newcomer does not pass a waiter of another replica")
	g.Expect(res.InUse).To(BeZero(), "though no slot is held")
	wa := &limiter.Waiter{Expiry: time.Hour}
	ok, _ = take(g, a, key, wa)
	g.Expect(ok).To(BeFalse(), "a later waiter waits behind the earlier one")
	g.Expect(c.ZCard(ctx, line).Val()).To(Equal(int64(2)))
	ok, _ = take(g, a, key, wa)
	g.Expect(ok).To(BeFalse(), "and again: its place is kept, not moved to the front")

	ok, held = take(g, b, key, wb)
	g.Expect(ok).To(BeTrue(), "the earliest waiter gets the slot")
	g.Expect(c.ZCard(ctx, line).Val()).To(Equal(int64(1)), "and left the line with it")
	b.LeaveLine(ctx, key, wb) // granted: nothing to take off
	g.Expect(c.ZCard(ctx, line).Val()).To(Equal(int64(1)))

	b.Release(ctx, held)
	ok, _ = take(g, b, key, nil)
	g.Expect(ok).To(BeFalse(), "a's waiter is next")
	ok, held = take(g, a, key, wa)
	g.Expect(ok).To(BeTrue())
	g.Expect(c.Exists(ctx, line, due).Val()).To(BeZero(), "nobody waits: the line is gone")
	a.Release(ctx, held)

	// A waiter that leaves without a slot is taken off at once: a newcomer is granted.
	ok, held = take(g, a, key, nil)
	g.Expect(ok).To(BeTrue())
	wc := &limiter.Waiter{Expiry: time.Hour}
	ok, _ = take(g, b, key, wc)
	g.Expect(ok).To(BeFalse())
	a.Release(ctx, held)
	b.LeaveLine(ctx, key, wc)
	g.Expect(c.Exists(ctx, line, due).Val()).To(BeZero())
	ok, held = take(g, a, key, nil)
	g.Expect(ok).To(BeTrue())
	a.Release(ctx, held)
}

// The waiter of a replica that died (it asks no more) leaves the line after its expiry, by
// itself: until then a newcomer waits behind it, after it the key is free again.
func TestSlotLineForgetsADeadReplicasWaiter(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	c := newClient(t, shared.URL())
	a := newLimiter(t, newClient(t, shared.URL()), limiter.TestOptions{ReplicaID: limiter.NewReplicaID()})
	dead, err := limiter.NewWith(newClient(t, shared.URL()), limiter.TestOptions{ReplicaID: limiter.NewReplicaID()})
	g.Expect(err).NotTo(HaveOccurred())
	key := uniqueKey(t)
	expiry := 2 * time.Second

	ok, held := take(g, a, key, nil)
	g.Expect(ok).To(BeTrue())
	before := redisNowMS(t, c) // the waiter's deadline is no sooner than expiry after this
	ok, _ = take(g, dead, key, &limiter.Waiter{Expiry: expiry})
	g.Expect(ok).To(BeFalse())
	dead.Close() // asks nothing more, leaves nothing: a SIGKILLed sidecar's head
	a.Release(ctx, held)

	ok, _ = take(g, a, key, nil)
	if redisNowMS(t, c) < before+expiry.Milliseconds() {
		g.Expect(ok).To(BeFalse(), "the dead replica's waiter left the line before its expiry")
	}
	g.Eventually(func(g Gomega) {
		ok, held = take(g, a, key, nil)
		g.Expect(ok).To(BeTrue())
	}, time.Minute, 50*time.Millisecond).Should(Succeed(), "the key is free once the dead waiter's expiry passed")
	g.Expect(c.Exists(ctx, key+":q", key+":qd").Val()).To(BeZero(), "it was swept")
	a.Release(ctx, held)
}

// A line stuffed with dead waiters (the tenant's own keys) holds up nobody and is swept a few
// a call; a live line counts at most MaxInFlight waiters; a waiter id is bounded.
func TestSlotLineOnStuffedKeys(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	c := newClient(t, shared.URL())
	l := newLimiter(t, newClient(t, shared.URL()), limiter.TestOptions{ReplicaID: limiter.NewReplicaID()})
	key := uniqueKey(t)
	line, due := key+":q", key+":qd"
	stuff := func(n int, deadline float64) {
		pipe := c.Pipeline()
		for i := range n {
			pipe.ZAdd(ctx, line, redis.Z{Score: float64(i), Member: i})
			pipe.ZAdd(ctx, due, redis.Z{Score: deadline, Member: i})
		}
		pipe.PExpire(ctx, line, time.Minute)
		pipe.PExpire(ctx, due, time.Minute)
		_, err := pipe.Exec(ctx)
		g.Expect(err).NotTo(HaveOccurred())
	}
	stuff(20_000, 1) // each one's deadline long past, and each one came before any waiter
	ok, held := take(g, l, key, nil)
	g.Expect(ok).To(BeTrue(), "dead waiters hold up no newcomer")
	l.Release(ctx, held)
	ok, held = take(g, l, key, &limiter.Waiter{})
	g.Expect(ok).To(BeTrue(), "nor a waiter that came after them")
	l.Release(ctx, held)
	g.Expect(c.ZCard(ctx, line).Val()).To(Equal(int64(20_000-32)), "16 swept a call")
	g.Expect(c.ZCard(ctx, due).Val()).To(Equal(int64(20_000 - 32)))

	// A line of MaxInFlight live waiters: a waiter that finds it full does not join it.
	g.Expect(c.Del(ctx, line, due).Err()).NotTo(HaveOccurred())
	stuff(limiter.MaxInFlight, 1e15)
	w := &limiter.Waiter{}
	ok, _ = take(g, l, key, w)
	g.Expect(ok).To(BeFalse(), "a hundred thousand live waiters came first")
	g.Expect(c.ZCard(ctx, line).Val()).To(Equal(int64(limiter.MaxInFlight)), "the full line took no one more")
	l.LeaveLine(ctx, key, w)
	g.Expect(c.Del(ctx, line, due).Err()).NotTo(HaveOccurred())

	// The script refuses a waiter id over its bound, as it does a slot id.
	err := c.EvalSha(ctx, scriptSHA(g, c), []string{key, line, due}, "r:s1", 1, 60000, limiter.MaxInFlight, strings.Repeat("w", 129), 1000).Err()
	g.Expect(err).To(MatchError(ContainSubstring("waiter id too long")))
}

// scriptSHA loads the slot acquisition script, for calls the limiter would never make.
func scriptSHA(g Gomega, c redis.UniversalClient) string {
	sha, err := c.ScriptLoad(context.Background(), scripts.SlotAcquire().Source).Result()
	g.Expect(err).NotTo(HaveOccurred())
	return sha
}
