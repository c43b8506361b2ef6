package limiter_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"github.com/redis/go-redis/v9"

	"github.com/redline-dev/redline/internal/limiter"
	"github.com/redline-dev/redline/internal/redisconn"
	"github.com/redline-dev/redline/internal/testutil/redistest"
)

func inFlight(n int64) limiter.InFlight {
	return limiter.InFlight{Max: n, FailureMode: limiter.FailureModeClosed}
}

// Three replicas share one key's slots: N are taken, the next is refused at once, a release
// frees one for any replica, and a crowd of them never holds more than N at any instant.
func TestSlotsExactAcrossReplicas(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ls := make([]*limiter.Limiter, 3)
	for i := range ls {
		ls[i] = newLimiter(t, newClient(t, shared.URL()), limiter.TestOptions{ReplicaID: limiter.NewReplicaID()})
	}
	key := uniqueKey(t)
	const n = 5
	var held []*limiter.Slot
	for i := range n {
		res, s, err := ls[i%3].Acquire(ctx, key, inFlight(n))
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(res.Allowed).To(BeTrue())
		g.Expect(res.InUse).To(Equal(int64(i + 1)))
		g.Expect(s).NotTo(BeNil())
		held = append(held, s)
	}
	for _, l := range ls {
		res, s, err := l.Acquire(ctx, key, inFlight(n))
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(res.Allowed).To(BeFalse())
		g.Expect(res.Full).To(BeTrue())
		g.Expect(res.RetryAfter).To(Equal(time.Second))
		g.Expect(s).To(BeNil())
	}
	ls[1].Release(ctx, held[4])
	ls[0].Release(ctx, held[4]) // a second release does nothing, by any replica
	res, s, err := ls[2].Acquire(ctx, key, inFlight(n))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(res.Allowed).To(BeTrue())
	held[4] = s
	for i, s := range held {
		ls[i%3].Release(ctx, s)
	}

	// The crowd: 48 workers on 3 replicas, each taking and releasing slots; a shared count of
	// the requests "in progress" between an acquire and its release never passes n.
	var cur, peak atomic.Int64
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for w := range 48 {
		l := ls[w%3]
		wg.Go(func() {
			for range 20 {
				res, s, err := l.Acquire(ctx, key, inFlight(n))
				if err != nil || !res.Allowed {
					continue
				}
				c := cur.Add(1)
				for p := peak.Load(); c > p && !peak.CompareAndSwap(p, c); p = peak.Load() {
				}
				admitted.Add(1)
				time.Sleep(time.Millisecond)
				cur.Add(-1)
				l.Release(ctx, s)
			}
		})
	}
	wg.Wait()
	g.Expect(peak.Load()).To(BeNumerically("<=", n))
	g.Expect(admitted.Load()).To(BeNumerically(">", 0))
	for _, l := range ls {
		g.Expect(l.SlotStats().Held).To(BeZero())
	}
	g.Expect(newClient(t, shared.URL()).ZCard(ctx, key).Val()).To(BeZero(), "every slot went back")
}

// A replica that stops renewing (dead) keeps its slots until their expiry on Redis's clock, not
// a moment less; one that keeps renewing keeps them past it.
func TestSlotsReturnOnlyAfterTheirHolderStopsRenewing(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	c := newClient(t, shared.URL())
	expiry := 3 * time.Second
	opts := limiter.TestOptions{ReplicaID: limiter.NewReplicaID(), SlotExpiry: expiry}
	live := newLimiter(t, newClient(t, shared.URL()), opts)
	other := newLimiter(t, newClient(t, shared.URL()), limiter.TestOptions{ReplicaID: limiter.NewReplicaID()})
	deadC := newClient(t, shared.URL())
	dead, err := limiter.NewWith(deadC, limiter.TestOptions{ReplicaID: limiter.NewReplicaID(), SlotExpiry: expiry})
	g.Expect(err).NotTo(HaveOccurred())

	liveKey, deadKey := uniqueKey(t), uniqueKey(t)
	res, liveSlot, err := live.Acquire(ctx, liveKey, inFlight(1))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(res.Allowed).To(BeTrue())
	before := redisNowMS(t, c) // the dead slot expires no sooner than expiry after this
	res, _, err = dead.Acquire(ctx, deadKey, inFlight(1))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(res.Allowed).To(BeTrue())
	takenMS := redisNowMS(t, c) // nor later than expiry after this
	dead.Close()                // renews nothing from now on, releases nothing: a SIGKILLed sidecar

	// Before the expiry the dead holder's slot still counts.
	res, _, _ = other.Acquire(ctx, deadKey, inFlight(1))
	if redisNowMS(t, c) < before+expiry.Milliseconds() {
		g.Expect(res.Allowed).To(BeFalse(), "a dead holder's slot returned before its expiry")
	}
	waitRedisMS(t, c, takenMS+expiry.Milliseconds()+expiry.Milliseconds()/2)

	res, s, err := other.Acquire(ctx, deadKey, inFlight(1))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(res.Allowed).To(BeTrue(), "the dead holder's slot came back after its expiry")
	other.Release(ctx, s)

	res, _, err = other.Acquire(ctx, liveKey, inFlight(1))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(res.Allowed).To(BeFalse(), "a live holder's slot is renewed past its first expiry")
	g.Expect(live.SlotStats().Renewals).To(BeNumerically(">", 0))
	select {
	case <-liveSlot.Lost():
		t.Fatal("a renewed slot was lost")
	default:
	}
	live.Release(ctx, liveSlot)
	res, s, _ = other.Acquire(ctx, liveKey, inFlight(1))
	g.Expect(res.Allowed).To(BeTrue(), "a released slot is free at once")
	other.Release(ctx, s)
}

// A key stuffed with dead members (the tenant's own key) still decides, sweeps a few of them a
// call, and counts only live ones; the limit's max is bounded.
func TestSlotsOnAStuffedKey(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	c := newClient(t, shared.URL())
	l := newLimiter(t, newClient(t, shared.URL()), limiter.TestOptions{ReplicaID: limiter.NewReplicaID()})
	key := uniqueKey(t)
	pipe := c.Pipeline()
	for i := range 20_000 {
		pipe.ZAdd(ctx, key, redis.Z{Score: float64(i), Member: i})
	}
	pipe.PExpire(ctx, key, time.Minute)
	_, err := pipe.Exec(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	res, s, err := l.Acquire(ctx, key, inFlight(1))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(res.Allowed).To(BeTrue())
	g.Expect(c.ZCard(ctx, key).Val()).To(Equal(int64(20_000 - 16 + 1)))
	l.Release(ctx, s)
	_, _, err = l.Acquire(ctx, key, inFlight(limiter.MaxInFlight+1))
	g.Expect(err).To(MatchError(limiter.ErrInvalidLimit))
	g.Expect(c.PExpire(ctx, key, time.Millisecond).Err()).To(Succeed())
}

// A replica whose renewals do not reach Redis (paused here; a partition is the same) gives its
// slots up on its own clock, which it does before their expiry (see renewSlots), so that their
// requests end before another can take their place. Decided while Redis cannot be asked, a slot
// follows the failure mode.
func TestSlotGivenUpWhenRenewalsFail(t *testing.T) {
	g := NewWithT(t)
	srv, err := redistest.Start()
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { _ = srv.Close() })
	fast := redisconn.Options{
		DialTimeout: 200 * time.Millisecond, ReadTimeout: 300 * time.Millisecond,
		WriteTimeout: 300 * time.Millisecond, PoolTimeout: 300 * time.Millisecond,
	}
	c, err := redisconn.NewClient(srv.URL(), fast)
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { _ = c.Close() })
	l := newLimiter(t, c, limiter.TestOptions{ReplicaID: limiter.NewReplicaID(), SlotExpiry: 2 * time.Second})
	ctx := context.Background()
	key := uniqueKey(t)
	_, s, err := l.Acquire(ctx, key, inFlight(1))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(s).NotTo(BeNil())

	g.Expect(srv.Pause()).To(Succeed())
	select {
	case <-s.Lost():
	case <-time.After(time.Minute):
		t.Fatal("a slot whose renewals failed was not given up")
	}
	g.Expect(l.SlotStats().RenewErrors).To(BeNumerically(">", 0))
	g.Expect(l.SlotStats().Lost).To(Equal(uint64(1)))

	res, none, err := l.Acquire(ctx, key, inFlight(1))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(none).To(BeNil())
	g.Expect(res.Allowed).To(BeFalse(), "Closed refuses while Redis cannot be asked")
	g.Expect(res.Err).To(HaveOccurred())
	open := limiter.InFlight{Max: 1, FailureMode: limiter.FailureModeOpen}
	res, none, _ = l.Acquire(ctx, key, open)
	g.Expect(none).To(BeNil())
	g.Expect(res.Allowed).To(BeTrue(), "Open admits without a slot")
	g.Expect(srv.Resume()).To(Succeed())
	l.Release(ctx, s)
}

// Replicas with different expiries share a key: the key lives as long as its latest slot, so a
// shorter expiry never drops the longer slots of another replica with it.
func TestSlotKeyOutlivesItsLatestSlot(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	c := newClient(t, shared.URL())
	long := newLimiter(t, newClient(t, shared.URL()), limiter.TestOptions{ReplicaID: limiter.NewReplicaID(), SlotExpiry: time.Minute})
	short := newLimiter(t, newClient(t, shared.URL()), limiter.TestOptions{ReplicaID: limiter.NewReplicaID(), SlotExpiry: 2 * time.Second})
	key := uniqueKey(t)
	_, ls, err := long.Acquire(ctx, key, inFlight(3))
	g.Expect(err).NotTo(HaveOccurred())
	_, ss, err := short.Acquire(ctx, key, inFlight(3))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(c.PTTL(ctx, key).Val()).To(BeNumerically(">", 30*time.Second))
	short.Release(ctx, ss)
	long.Release(ctx, ls)
}
