package limiter_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"github.com/redis/go-redis/v9"

	"github.com/redline-dev/redline/internal/limiter"
	"github.com/redline-dev/redline/internal/limiter/scripts"
)

// The window state and its shares, script by script: what the scripts promise whatever the
// limiter does (shares_open.lua).
func TestSharesScripts(t *testing.T) {
	ctx := context.Background()
	c := newClient(t, shared.URL())
	fw, _ := scripts.For(string(limiter.FixedWindow))
	const window = int64(3_600_000)
	run := func(g Gomega, s scripts.Script, key string, args ...any) []int64 {
		cmds := []redis.Cmder{scripts.EvalSha(ctx, s, []string{key}, args...)}
		scripts.Exec(ctx, c, cmds, []scripts.Script{s})
		n, err := cmds[0].(*redis.Cmd).Int64Slice()
		g.Expect(err).NotTo(HaveOccurred())
		return n
	}
	count := func(g Gomega, key, field string) int64 {
		n, err := c.HGet(ctx, key, field).Int64()
		g.Expect(err).NotTo(HaveOccurred())
		return n
	}
	// grant asks for cost units as replica id, which knows it was granted known in window start.
	grant := func(g Gomega, key string, cost int64, id string, start, known, knownPrev int64) []int64 {
		return run(g, fw, key, 100, window, cost, 0, cost, id, start, known, knownPrev)
	}

	// earlyInAWindow waits until Redis's clock is in the first half of a window of w ms (so
	// that a case has the rest of it) and returns how to read that clock.
	earlyInAWindow := func(g Gomega, w int64) func() int64 {
		redisMS := func() int64 {
			n, err := c.Time(ctx).Result()
			g.Expect(err).NotTo(HaveOccurred())
			return n.UnixMilli()
		}
		g.Eventually(func() int64 { return redisMS() % w }).WithTimeout(5 * time.Second).WithPolling(5 * time.Millisecond).
			Should(BeNumerically("<", w/2))
		return redisMS
	}

	t.Run("a lost window is restored once, however often it is asserted", func(t *testing.T) {
		g := NewWithT(t)
		key := uniqueKey(t) + ":swc"
		r := grant(g, key, 30, "a", 0, 0, 0)
		g.Expect(r[5]).To(BeEquivalentTo(30))
		start := r[4] / 1000 / window * window
		g.Expect(grant(g, key, 20, "b", 0, 0, 0)[5]).To(BeEquivalentTo(20))
		g.Expect(c.Del(ctx, key).Err()).To(Succeed()) // Redis lost the window

		restored := 0
		for range 3 {
			restored += int(run(g, fw, key, 100, window, 0, 0, 0, "a", start, 30, 0)[6])
		}
		g.Expect(restored).To(Equal(30))
		g.Expect(count(g, key, "c")).To(BeEquivalentTo(30), "a's share, once")
		r = grant(g, key, 1, "b", start, 20, 0)
		g.Expect(r[6]).To(BeEquivalentTo(20), "b restores its share with its next call")
		g.Expect(r[5]).To(BeEquivalentTo(1))
		g.Expect(count(g, key, "c")).To(BeEquivalentTo(51))
		g.Expect(grant(g, key, 1, "b", start, 21, 0)[6]).To(BeZero(), "nothing twice")
		g.Expect(count(g, key, "c")).To(BeEquivalentTo(52))
	})

	t.Run("a partly replicated share is topped up, not added again", func(t *testing.T) {
		g := NewWithT(t)
		key := uniqueKey(t) + ":swc"
		r := grant(g, key, 10, "a", 0, 0, 0)
		start := r[4] / 1000 / window * window
		// What a replica that saw a's first grant of 10 but not its next 15 holds.
		f, err := c.HGet(ctx, key, "a").Result()
		g.Expect(err).NotTo(HaveOccurred())
		r = grant(g, key, 15, "a", start, 10, 0)
		g.Expect(r[5]).To(BeEquivalentTo(15))
		g.Expect(c.HSet(ctx, key, "c", 10, "a", f).Err()).To(Succeed())

		r = grant(g, key, 5, "a", start, 25, 0)
		g.Expect(r[6]).To(BeEquivalentTo(15), "only the 15 the replica did not see")
		g.Expect(count(g, key, "c")).To(BeEquivalentTo(30))
	})

	t.Run("knowledge older than the state adds nothing", func(t *testing.T) {
		g := NewWithT(t)
		key := uniqueKey(t) + ":swc"
		r := grant(g, key, 40, "a", 0, 0, 0)
		start := r[4] / 1000 / window * window
		// A reply lost on the way back: Redis counted 40, the replica knows of none.
		r = grant(g, key, 1, "a", start, 0, 0)
		g.Expect(r[6]).To(BeZero())
		g.Expect(count(g, key, "c")).To(BeEquivalentTo(41))
	})

	t.Run("a lease goes back only to a Redis that holds it", func(t *testing.T) {
		g := NewWithT(t)
		key := uniqueKey(t) + ":swc"
		ret := scripts.LeaseReturn()
		r := grant(g, key, 30, "a", 0, 0, 0)
		start := r[4] / 1000 / window * window
		g.Expect(grant(g, key, 20, "b", 0, 0, 0)[5]).To(BeEquivalentTo(20))
		// z never held units here: a return of 9 by z takes nothing off the others' count.
		g.Expect(run(g, ret, key, window, start, 9, "z", start, 0, 0)).To(Equal([]int64{0, 0}))
		g.Expect(count(g, key, "c")).To(BeEquivalentTo(50))
		// After a loss, a's return restores its share first, then gives back what it returns.
		g.Expect(c.HSet(ctx, key, "c", 20, "a", 0).Err()).To(Succeed())
		g.Expect(run(g, ret, key, window, start, 10, "a", start, 30, 0)).To(Equal([]int64{10, 30}))
		g.Expect(count(g, key, "c")).To(BeEquivalentTo(40), "20 + a's 30 restored - 10 returned")
		g.Expect(run(g, ret, key, window, start, 100, "a", start, 20, 0)).To(Equal([]int64{20, 0}),
			"never more than a's share")
		g.Expect(count(g, key, "c")).To(BeEquivalentTo(20))
	})

	t.Run("a decision that read a share before its lease went back restores nothing", func(t *testing.T) {
		g := NewWithT(t)
		key := uniqueKey(t) + ":swc"
		ret := scripts.LeaseReturn()
		r := grant(g, key, 30, "a", 0, 0, 0)
		start := r[4] / 1000 / window * window
		// a lowers its share of 30 by the 10 it returns (stamp 2) and says what it knew before.
		g.Expect(run(g, ret, key, window, start, 10, "a", start, 30, 0, 2)).To(Equal([]int64{10, 0}))
		g.Expect(count(g, key, "c")).To(BeEquivalentTo(20))
		// A decision of a that read its share (30) before the lowering (stamp 1) runs after the
		// return: Redis is not short of anything, and the decision restores nothing.
		r = run(g, fw, key, 100, window, 1, 0, 1, "a", start, 30, 0, 3000, 0, 1)
		g.Expect(r[6]).To(BeZero(), "nothing restored")
		g.Expect(r[2]).NotTo(BeEquivalentTo(-3), "no hold")
		g.Expect(count(g, key, "c")).To(BeEquivalentTo(21))
		// One that read it after (stamp 2, 20 + the 1 just granted) restores nothing either.
		g.Expect(run(g, fw, key, 100, window, 1, 0, 1, "a", start, 21, 0, 3000, 0, 2)[6]).To(BeZero())
		g.Expect(count(g, key, "c")).To(BeEquivalentTo(22))
	})

	t.Run("a new window drops dead replicas' fields, but never scans a stuffed state", func(t *testing.T) {
		for _, dead := range []int{40, 200} {
			g := NewWithT(t)
			key := uniqueKey(t) + ":swc"
			now, err := c.Time(ctx).Result()
			g.Expect(err).NotTo(HaveOccurred())
			start := now.UnixMilli() / window * window
			q := (start / window) % 4096
			// The state of the previous window: one live replica's field (a, of that window) and
			// dead ones of a window long gone.
			fields := []any{"s", start - window, "c", 10, "p", 0, "a", 10*4096 + (q+4095)%4096}
			for i := range dead {
				fields = append(fields, fmt.Sprintf("dead%04d", i), 5*4096+(q+4000)%4096)
			}
			g.Expect(c.HSet(ctx, key, fields...).Err()).To(Succeed())
			g.Expect(grant(g, key, 1, "b", 0, 0, 0)[5]).To(BeEquivalentTo(1))
			n, err := c.HLen(ctx, key).Result()
			g.Expect(err).NotTo(HaveOccurred())
			if dead <= 128 {
				g.Expect(n).To(BeEquivalentTo(5), "s, c, p, a (of the previous window) and b")
			} else {
				g.Expect(n).To(BeEquivalentTo(5+dead), "a stuffed state is left as it is")
			}
		}
	})

	t.Run("the previous window is restored where the roll was lost", func(t *testing.T) {
		g := NewWithT(t)
		key := uniqueKey(t) + ":swc"
		swc, _ := scripts.For(string(limiter.SlidingWindowCounter))
		// A short window: the replica was granted 40 in window k-1, and the Redis that took
		// over lost all of it; in window k the replica's first call restores p.
		const w = int64(2000)
		redisMS := earlyInAWindow(g, w)
		r := run(g, swc, key, 100, w, 40, 0, 40, "a", 0, 0, 0)
		g.Expect(r[5]).To(BeEquivalentTo(40))
		prevStart := r[4] / 1000 / w * w
		g.Expect(c.Del(ctx, key).Err()).To(Succeed())
		g.Eventually(func() int64 { return redisMS() / w * w }).WithTimeout(5 * time.Second).WithPolling(10 * time.Millisecond).
			Should(BeEquivalentTo(prevStart + w))
		r = run(g, swc, key, 100, w, 1, 0, 1, "a", prevStart, 40, 0)
		g.Expect(r[6]).To(BeEquivalentTo(40))
		g.Expect(count(g, key, "p")).To(BeEquivalentTo(40))
		r = run(g, swc, key, 100, w, 1, 0, 1, "a", prevStart+w, 1, 40)
		g.Expect(r[6]).To(BeZero(), "p is restored once")
		g.Expect(count(g, key, "p")).To(BeEquivalentTo(40))
	})

	// call is one decision of replica id with its known share, a hold of 60 s and the peers it
	// saw live lately.
	call := func(g Gomega, key string, cost int64, id string, start, known, peers int64) []int64 {
		return run(g, fw, key, 100, window, cost, 0, cost, id, start, known, 0, 60_000, peers)
	}
	// lost grants ra, rb and rc (ids as short as a state's own fields would collide) 10 each in a window and then loses the state, as a failover to a
	// replica that received none of it; it returns the window's start.
	lost := func(g Gomega, key string) int64 {
		var start int64
		for _, id := range []string{"ra", "rb", "rc"} {
			r := call(g, key, 10, id, 0, 0, 3)
			g.Expect(r[5]).To(BeEquivalentTo(10))
			start = r[4] / 1000 / window * window
		}
		g.Expect(c.Del(ctx, key).Err()).To(Succeed())
		return start
	}
	marks := func(g Gomega, key string) int {
		all, err := c.HGetAll(ctx, key).Result()
		g.Expect(err).NotTo(HaveOccurred())
		n := 0
		for f := range all {
			if strings.HasPrefix(f, "@") {
				n++
			}
		}
		return n
	}

	t.Run("a hold ends once as many replicas as were live re-asserted", func(t *testing.T) {
		g := NewWithT(t)
		key := uniqueKey(t) + ":swc"
		start := lost(g, key)
		r := call(g, key, 1, "ra", start, 10, 3)
		g.Expect(r[2]).To(BeEquivalentTo(-3), "a restored its share: grants wait")
		g.Expect(r[6]).To(BeEquivalentTo(10))
		r = call(g, key, 1, "ra", start, 10, 3)
		g.Expect(r[2]).To(BeEquivalentTo(-3), "a replica counts once in a hold")
		r = call(g, key, 1, "rb", start, 10, 1)
		g.Expect(r[2]).To(BeEquivalentTo(-3), "b is the second of three: a caller that saw fewer peers does not shorten the hold")
		g.Expect(marks(g, key)).To(Equal(2))
		r = run(g, fw, key, 100, window, 0, 0, 0, "rc", start, 10, 0, 60_000, 0) // c re-asserts
		g.Expect(r[6]).To(BeEquivalentTo(10))
		g.Expect(marks(g, key)).To(BeZero(), "the hold ended and its marks went")
		r = call(g, key, 1, "ra", start, 10, 3)
		g.Expect(r[0]).To(BeEquivalentTo(1), "grants go on")
		g.Expect(count(g, key, "c")).To(BeEquivalentTo(31), "every share once, and the grant")
	})

	t.Run("a hold whose peers are unknown runs its length", func(t *testing.T) {
		g := NewWithT(t)
		key := uniqueKey(t) + ":swc"
		start := lost(g, key)
		for _, id := range []string{"ra", "rb", "rc"} {
			r := call(g, key, 1, id, start, 10, 0)
			g.Expect(r[2]).To(BeEquivalentTo(-3), id)
		}
		g.Expect(count(g, key, "c")).To(BeEquivalentTo(30))
	})

	t.Run("a hold carries over into the next window with its marks", func(t *testing.T) {
		g := NewWithT(t)
		swc, _ := scripts.For(string(limiter.SlidingWindowCounter))
		key := uniqueKey(t) + ":swc"
		const w = int64(2000)
		redisMS := earlyInAWindow(g, w)
		one := func(id string, start, known, knownPrev, peers int64) []int64 {
			return run(g, swc, key, 100, w, 1, 0, 1, id, start, known, knownPrev, 60_000, peers)
		}
		r := one("ra", 0, 0, 0, 2)
		g.Expect(r[5]).To(BeEquivalentTo(1))
		start := r[4] / 1000 / w * w
		g.Expect(one("rb", 0, 0, 0, 2)[5]).To(BeEquivalentTo(1))
		g.Expect(c.Del(ctx, key).Err()).To(Succeed())
		g.Expect(one("ra", start, 1, 0, 2)[2]).To(BeEquivalentTo(-3), "a restored: the hold begins")
		g.Eventually(func() int64 { return redisMS() / w * w }).WithTimeout(5 * time.Second).WithPolling(10 * time.Millisecond).
			Should(BeEquivalentTo(start + w))
		r = one("ra", start, 1, 0, 2)
		g.Expect(r[2]).To(BeEquivalentTo(-3), "the hold outlives its window")
		g.Expect(r[6]).To(BeZero())
		r = one("rb", start, 1, 0, 2)
		g.Expect(r[6]).To(BeEquivalentTo(1), "b's share of the window before")
		g.Expect(r[0]).To(BeEquivalentTo(1), "b is the second of two: the hold ends")
		g.Expect(count(g, key, "p")).To(BeEquivalentTo(2))
	})
}

// More keys than the share table: the units beyond it are counted as unkept, and decisions go
// on exactly.
func TestShareTableBound(t *testing.T) {
	g := NewWithT(t)
	c := newClient(t, shared.URL())
	l := newLimiter(t, c, limiter.TestOptions{ReplicaID: limiter.NewReplicaID(), ShareKeys: 4})
	lim := limiter.Limit{Algorithm: limiter.FixedWindow, Requests: 3, Window: time.Hour, Replicas: 1}
	for i := range 10 {
		key := fmt.Sprintf("%s-%d", uniqueKey(t), i)
		for j := range 4 {
			r, err := l.Allow(context.Background(), key, lim, 1)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(r.Allowed).To(Equal(j < 3), "key %d decision %d", i, j)
		}
	}
	st := l.Stats()
	g.Expect(st.ShareKeys).To(Equal(4))
	g.Expect(st.UnkeptShareUnits).To(BeEquivalentTo(6 * 3))
}
