package limiter_test

import (
	"context"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/redline-dev/redline/internal/limiter"
)

// A usage charged without a hold counts in full, past the limit if need be (the TokenBucket and
// the log carry at most what refuses the key as long as more would, see TestHoldDebt); the key
// is then refused until it is repaid.
func TestCharge(t *testing.T) {
	holdAll(t, func(t *testing.T, alg limiter.Algorithm) {
		g := NewWithT(t)
		c := newClient(t, shared.URL())
		l := newLimiter(t, c, limiter.TestOptions{ReplicaID: limiter.NewReplicaID()})
		ctx, key, lim := context.Background(), uniqueKey(t), holdLimit(alg, 100)

		s, err := l.Charge(ctx, key, lim, 30)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(s).To(Equal(limiter.Settled{Debt: 30}))
		g.Expect(counted(t, c, key, lim)).To(Equal(int64(30)))

		s, err = l.Charge(ctx, key, lim, 1e12)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(s.Debt).To(Equal(int64(1e12)), "a claim counts in full")
		want := map[limiter.Algorithm]int64{limiter.FixedWindow: 1e12 + 30, limiter.SlidingWindowCounter: 1e12 + 30, limiter.TokenBucket: 200, limiter.SlidingWindowLog: 130}
		g.Expect(counted(t, c, key, lim)).To(Equal(want[alg]))
		s, err = l.Charge(ctx, key, lim, 1<<62)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(s.Debt).To(Equal(int64(limiter.MaxUsed)), "past 2^50 a claim is a lie, counted as 2^50")

		r, h, err := l.Reserve(ctx, key, lim, 1, 1, time.Minute)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(h).To(BeNil())
		g.Expect(r.Allowed).To(BeFalse(), "a key in debt holds nothing")

		s, err = l.Charge(ctx, key, lim, 0)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(s).To(Equal(limiter.Settled{}))
	})
}

// A reserve refused while every unit is held is asked again as soon as a settle of this
// limiter gives units back, not repeated from the pre-check.
func TestHoldRefusalForgottenOnSettle(t *testing.T) {
	holdAll(t, func(t *testing.T, alg limiter.Algorithm) {
		g := NewWithT(t)
		c := newClient(t, shared.URL())
		l := newLimiter(t, c, limiter.TestOptions{ReplicaID: limiter.NewReplicaID()})
		ctx, key, lim := context.Background(), uniqueKey(t), holdLimit(alg, 100)

		_, h, err := l.Reserve(ctx, key, lim, 100, 100, time.Minute)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(h).NotTo(BeNil())
		r, none, err := l.Reserve(ctx, key, lim, 10, 50, time.Minute)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(none).To(BeNil())
		g.Expect(r.Allowed).To(BeFalse())

		_, err = l.Settle(ctx, h, 50)
		g.Expect(err).NotTo(HaveOccurred())
		r, h2, err := l.Reserve(ctx, key, lim, 10, 50, time.Minute)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(r.Source).To(Equal(limiter.SourceRedis), "the refusal was repeated after units went back")
		g.Expect(h2).NotTo(BeNil())
		g.Expect(h2.Units).To(Equal(int64(50)))
	})
}
