package decide_test

import (
	"context"
	"errors"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/redline-dev/redline/internal/limiter"
	"github.com/redline-dev/redline/internal/redisconn"
	"github.com/redline-dev/redline/internal/sidecar/decide"
	"github.com/redline-dev/redline/internal/testutil/redistest"
	"github.com/redline-dev/redline/internal/testutil/sidecartest"
)

// No key keeps more slots in a face than its rule's limit: when Redis stopped counting a kept
// slot (its entry gone, not yet found lost by a renewal), Redis admits one more of the key,
// and the registry refuses to keep it rather than let the key's kept slots pass the limit.
func TestSlotRegistryKeepsNoMoreOfAKeyThanItsLimit(t *testing.T) {
	g := NewWithT(t)
	srv, err := redistest.Start()
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { _ = srv.Close() })
	c, err := redisconn.NewClient(srv.URL(), redisconn.Options{ReadTimeout: 5 * time.Second, PoolTimeout: time.Minute})
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { _ = c.Close() })
	// Renewals minutes apart: none finds the missing slot during the test.
	lim, err := limiter.New(c, limiter.Options{SlotExpiry: 10 * time.Minute})
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(lim.Close)
	store := sidecartest.StoreOf(t, sidecartest.DocumentRules("ns", "p", "web", sidecartest.InFlightRule("slots", "x-key", 2)))
	e := &decide.Engine{Limiter: lim}
	reg := &decide.SlotRegistry{Lease: time.Minute}
	ctx := context.Background()
	hit := []decide.Hit{{Policy: "p", Rule: "slots", Key: []string{"a"}}}
	take := func() (*decide.Slots, error) {
		s, err := acquireHits(ctx, e, store.Current(), hit)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(s.Refused).To(BeNil())
		_, _, err = reg.Put(s, "")
		return s, err
	}
	for range 2 {
		_, err := take()
		g.Expect(err).NotTo(HaveOccurred())
	}
	key := slotKey(store.Current(), "p", "slots", "a")
	g.Expect(c.ZPopMin(ctx, key, 1).Err()).To(Succeed())
	third, err := take()
	var refused *decide.RefusedError
	g.Expect(errors.As(err, &refused)).To(BeTrue(), "%v", err)
	g.Expect(err).To(MatchError(decide.ErrKeyFull))
	third.Release(ctx)
	entries, slots := reg.Len()
	g.Expect([]int{entries, slots}).To(Equal([]int{2, 2}))
	// Another key has room of its own.
	other, err := acquireHits(ctx, e, store.Current(), []decide.Hit{{Policy: "p", Rule: "slots", Key: []string{"b"}}})
	g.Expect(err).NotTo(HaveOccurred())
	_, _, err = reg.Put(other, "")
	g.Expect(err).NotTo(HaveOccurred())
}
