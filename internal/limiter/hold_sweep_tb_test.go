package limiter_test

import (
	"context"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/redline-dev/redline/internal/limiter"
)

// A TokenBucket reserve refused even after its sweep gave expired holds back still writes the
// bucket back: the tokens the sweep freed are there for the next reserve, not only once the
// bucket refills.
func TestHoldTokenBucketRefusedReserveKeepsWhatItSwept(t *testing.T) {
	g := NewWithT(t)
	c := newClient(t, shared.URL())
	l := newLimiter(t, c, limiter.Options{ReplicaID: limiter.NewReplicaID()})
	ctx, key, lim := context.Background(), uniqueKey(t), holdLimit(limiter.TokenBucket, 100)

	_, short, err := l.Reserve(ctx, key, lim, 60, 60, 300*time.Millisecond)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(short.Units).To(Equal(int64(60)))
	_, long, err := l.Reserve(ctx, key, lim, 40, 40, time.Hour)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(long.Units).To(Equal(int64(40)))
	recs, err := c.ZRangeWithScores(ctx, holdsKey(key, lim), 0, 0).Result()
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(recs).To(HaveLen(1))
	waitRedisMS(t, c, int64(recs[0].Score)+1) // the short hold is due

	// The sweep gives the short hold's 60 back, but 80 do not fit: refused.
	r, h, err := l.Reserve(ctx, key, lim, 80, 80, time.Minute)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(h).To(BeNil())
	g.Expect(r.Allowed).To(BeFalse())
	// The 60 are in the bucket now.
	r, h, err = l.Reserve(ctx, key, lim, 60, 60, time.Minute)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(r.Allowed).To(BeTrue(), "the tokens the refused reserve swept back were lost")
	g.Expect(h.Units).To(Equal(int64(60)))
}
