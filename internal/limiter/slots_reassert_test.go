package limiter_test

import (
	"context"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/redline-dev/redline/internal/limiter"
	"github.com/redline-dev/redline/internal/redisconn"
	"github.com/redline-dev/redline/internal/testutil/redistest"
)

// A slot Redis no longer holds (a failover to a replica that had not received it, a restart;
// here removed) is re-asserted at the next renewal while its key has room: its request runs on,
// and the key counts it again.
func TestSlotReassertedWhenRedisLostIt(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	c := newClient(t, shared.URL())
	l := newLimiter(t, newClient(t, shared.URL()), limiter.TestOptions{ReplicaID: limiter.NewReplicaID(), SlotExpiry: 2 * time.Second})
	key := uniqueKey(t)
	_, s, err := l.Acquire(ctx, key, inFlight(1))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(s).NotTo(BeNil())
	g.Expect(c.Del(ctx, key).Err()).To(Succeed())
	g.Eventually(func() uint64 { return l.SlotStats().Reasserted }, time.Minute, 10*time.Millisecond).Should(Equal(uint64(1)))
	g.Expect(c.ZCard(ctx, key).Val()).To(Equal(int64(1)), "counted again")
	select {
	case <-s.Lost():
		t.Fatal("a re-asserted slot was lost")
	default:
	}
	other := newLimiter(t, newClient(t, shared.URL()), limiter.TestOptions{ReplicaID: limiter.NewReplicaID()})
	res, none, err := other.Acquire(ctx, key, inFlight(1))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(none).To(BeNil())
	g.Expect(res.Full).To(BeTrue(), "the key is full again")
	l.Release(ctx, s)
}

// A slot whose place another request took while Redis did not count it is lost at the next
// renewal, never renewed back over N: its Lost channel closes so that its request ends.
func TestSlotLostWhenItsPlaceWasTaken(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	c := newClient(t, shared.URL())
	l := newLimiter(t, newClient(t, shared.URL()), limiter.TestOptions{ReplicaID: limiter.NewReplicaID(), SlotExpiry: 2 * time.Second})
	key := uniqueKey(t)
	_, s, err := l.Acquire(ctx, key, inFlight(1))
	g.Expect(err).NotTo(HaveOccurred())
	// In one step, as a failover that lost the slot and a request on the new node would: the
	// slot gone, another in its place for a minute.
	g.Expect(c.Eval(ctx, `local t = redis.call('TIME')
redis.call('DEL', KEYS[1])
redis.call('ZADD', KEYS[1], tonumber(t[1]) * 1000 + 60000, 'taker')
return redis.call('PEXPIRE', KEYS[1], 60000)`, []string{key}).Err()).To(Succeed())
	select {
	case <-s.Lost():
	case <-time.After(time.Minute):
		t.Fatal("the slot was not lost")
	}
	g.Expect(l.SlotStats().Lost).To(Equal(uint64(1)))
	g.Expect(l.SlotStats().Held).To(BeZero())
	g.Expect(c.ZRange(ctx, key, 0, -1).Val()).To(Equal([]string{"taker"}), "only the taker's slot counts")
	l.Release(ctx, s)
}

// After a replica saw Redis fail, it re-asserts its slots before it takes another: a node that
// answers again without them (here: paused, then emptied) never grants their places to this
// replica's next request; and for half the expiry new slots follow the failure mode.
func TestSlotsReassertedBeforeTheNextAcquireAfterAFailure(t *testing.T) {
	g := NewWithT(t)
	srv, err := redistest.Start()
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { _ = srv.Close() })
	fast := redisconn.Options{
		DialTimeout: 200 * time.Millisecond, ReadTimeout: 300 * time.Millisecond,
		WriteTimeout: 300 * time.Millisecond, PoolTimeout: 300 * time.Millisecond,
	}
	lc, err := redisconn.NewClient(srv.URL(), fast)
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { _ = lc.Close() })
	// A long expiry: the renewer's round (every 2.5 minutes) does not come during the test.
	l := newLimiter(t, lc, limiter.TestOptions{ReplicaID: limiter.NewReplicaID(), SlotExpiry: 10 * time.Minute})
	c := newClient(t, srv.URL())
	ctx := context.Background()
	key := uniqueKey(t)
	_, s, err := l.Acquire(ctx, key, inFlight(1))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(s).NotTo(BeNil())

	g.Expect(srv.Pause()).To(Succeed())
	res, none, err := l.Acquire(ctx, key, inFlight(1))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(none).To(BeNil())
	g.Expect(res.Err).To(HaveOccurred(), "Redis could not be asked")
	g.Expect(srv.Resume()).To(Succeed())
	g.Expect(c.Del(ctx, key).Err()).To(Succeed()) // the node answers again without the slot

	res, none, err = l.Acquire(ctx, key, inFlight(1))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(none).To(BeNil(), "the running request's place was re-asserted first")
	g.Expect(res.Full).To(BeTrue())
	g.Expect(l.SlotStats().Reasserted).To(Equal(uint64(1)))
	g.Expect(c.ZCard(ctx, key).Val()).To(Equal(int64(1)))
	select {
	case <-s.Lost():
		t.Fatal("the re-asserted slot was lost")
	default:
	}
	// For half the expiry (five minutes here) the failure mode decides new slots, even of a key
	// with room: the other replicas' renewals re-assert theirs meanwhile.
	res, none, err = l.Acquire(ctx, uniqueKey(t), inFlight(1))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(none).To(BeNil())
	g.Expect(res.Allowed).To(BeFalse(), "Closed refuses while the slots settle")
	g.Expect(res.Err).To(MatchError(limiter.ErrSlotsSettling))
	open := limiter.InFlight{Max: 1, FailureMode: limiter.FailureModeOpen}
	res, _, _ = l.Acquire(ctx, uniqueKey(t), open)
	g.Expect(res.Allowed).To(BeTrue(), "Open admits without a slot")
	g.Expect(res.Err).To(MatchError(limiter.ErrSlotsSettling))
	l.Release(ctx, s)
}
