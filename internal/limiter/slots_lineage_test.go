package limiter_test

import (
	"context"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/redline-dev/redline/internal/limiter"
	"github.com/redline-dev/redline/internal/testutil/redistest"
)

// A node restarted empty at the same address answers every call again without an error (the
// client's broken connections are replaced before the next call): nothing failed, yet the node
// lacks the slot a running request holds. A replica that talked to the node before sees the
// new history in the reply, undoes what it took and decides by the failure mode; the holder
// sees it too and re-asserts its slot before any is granted.
func TestSlotsOfANodeRestartedEmptyAreNotGrantedAgain(t *testing.T) {
	g := NewWithT(t)
	srv, err := redistest.Start()
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { _ = srv.Close() })
	ctx := context.Background()
	// Long expiries: no renewal round comes during the test, only what the calls trigger.
	hc, oc := newClient(t, srv.URL()), newClient(t, srv.URL())
	holder := newLimiter(t, hc, limiter.TestOptions{ReplicaID: limiter.NewReplicaID(), SlotExpiry: 10 * time.Minute})
	other := newLimiter(t, oc, limiter.TestOptions{ReplicaID: limiter.NewReplicaID(), SlotExpiry: 10 * time.Minute})
	key := uniqueKey(t)
	_, s, err := holder.Acquire(ctx, key, inFlight(1))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(s).NotTo(BeNil())
	res, none, err := other.Acquire(ctx, key, inFlight(1))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(none).To(BeNil())
	g.Expect(res.Full).To(BeTrue(), "the holder's request has the key's one place")

	g.Expect(srv.Stop()).To(Succeed())
	g.Expect(srv.Start()).To(Succeed())
	// Each client's broken connections go on a PING of the test's: the limiters' next calls
	// meet no error at all.
	g.Eventually(func() error { return hc.Ping(ctx).Err() }, time.Minute, 10*time.Millisecond).Should(Succeed())
	g.Eventually(func() error { return oc.Ping(ctx).Err() }, time.Minute, 10*time.Millisecond).Should(Succeed())
	admin := newClient(t, srv.URL())
	g.Expect(admin.Exists(ctx, key).Val()).To(BeZero(), "the node came back empty")

	res, none, err = other.Acquire(ctx, key, inFlight(1))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(none).To(BeNil(), "a place the holder's running request holds is not granted")
	g.Expect(res.Allowed).To(BeFalse(), "Closed refuses")
	g.Expect(res.Err).To(MatchError(limiter.ErrSlotsNodeChanged))
	g.Expect(admin.Exists(ctx, key).Val()).To(BeZero(), "the slot the call took was given back")
	g.Expect(other.SlotStats().NodeChanges).To(Equal(uint64(1)))
	res, _, _ = other.Acquire(ctx, uniqueKey(t), inFlight(1))
	g.Expect(res.Err).To(MatchError(limiter.ErrSlotsSettling), "new slots wait for the holders to re-assert theirs")

	// The holder's next call sees the new node too, and its next Acquire re-asserts first.
	res, _, _ = holder.Acquire(ctx, uniqueKey(t), inFlight(1))
	g.Expect(res.Err).To(MatchError(limiter.ErrSlotsNodeChanged))
	res, _, _ = holder.Acquire(ctx, uniqueKey(t), inFlight(1))
	g.Expect(res.Err).To(MatchError(limiter.ErrSlotsSettling))
	g.Expect(holder.SlotStats().Reasserted).To(Equal(uint64(1)))
	g.Expect(admin.ZRange(ctx, key, 0, -1).Val()).To(HaveLen(1), "the running request counts again")
	select {
	case <-s.Lost():
		t.Fatal("the re-asserted slot was lost")
	default:
	}
	holder.Release(ctx, s)
}
