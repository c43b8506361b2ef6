package limiter_test

import (
	"context"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/redline-dev/redline/internal/limiter"
)

// A usage charged without a hold counts in full, past the limit if need be, at most one
// capacity at a time; the key is then refused until it is repaid.
func TestCharge(t *testing.T) {
	holdAll(t, func(t *testing.T, alg limiter.Algorithm) {
		g := NewWithT(t)
		c := newClient(t, shared.URL())
		l := newLimiter(t, c, limiter.Options{ReplicaID: limiter.NewReplicaID()})
		ctx, key, lim := context.Background(), uniqueKey(t), holdLimit(alg, 100)

		s, err := l.Charge(ctx, key, lim, 30)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(s).To(Equal(limiter.Settled{Debt: 30}))
		g.Expect(counted(t, c, key, lim)).To(Equal(int64(30)))

		s, err = l.Charge(ctx, key, lim, 1e12)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(s.Debt).To(Equal(int64(100)), "a claim of any size counts one capacity at most")
		g.Expect(counted(t, c, key, lim)).To(Equal(int64(130)))

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
		l := newLimiter(t, c, limiter.Options{ReplicaID: limiter.NewReplicaID()})
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
