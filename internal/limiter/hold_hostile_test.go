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

// stuffHolds fills a hold zset with n members named by format (of their index), past their
// deadline, in Redis: a tenant may ZADD what it likes to its own keys.
func stuffHolds(t *testing.T, c redis.UniversalClient, key, format string, n int, score string) {
	t.Helper()
	err := c.Eval(context.Background(), `
local args = {}
for i = 1, tonumber(ARGV[2]) do
  args[#args + 1], args[#args + 2] = ARGV[3], string.format(ARGV[1], i)
  if #args >= 2000 then redis.call('ZADD', KEYS[1], unpack(args)); args = {} end
end
if #args > 0 then redis.call('ZADD', KEYS[1], unpack(args)) end
redis.call('PEXPIRE', KEYS[1], 3600000)
return 0`, []string{key}, format, n, score).Err()
	if err != nil {
		t.Fatal(err)
	}
}

// A tenant's hold records are its own bytes: 100,000 garbage or forged members past their
// deadline cost a reserve 16 of them at most, and a forged record lowers no count (a hold past
// its deadline gives nothing back).
func TestHoldStuffedRecords(t *testing.T) {
	holdAll(t, func(t *testing.T, alg limiter.Algorithm) {
		g := NewWithT(t)
		c := newClient(t, shared.URL())
		l := newLimiter(t, c, limiter.TestOptions{ReplicaID: limiter.NewReplicaID()})
		ctx, key, lim := context.Background(), uniqueKey(t), holdLimit(alg, 1000)
		hk := holdsKey(key, lim)
		_, h, err := l.Reserve(ctx, key, lim, 1, 100, time.Hour)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(h.Units).To(Equal(int64(100)))
		stuffHolds(t, c, hk, "%d"+strings.Repeat("x", 200), 50_000, "-1e300")         // too long to parse
		stuffHolds(t, c, hk, "%d:"+strings.Repeat("9", 120)+":r:x", 50_000, "-1e300") // 1e120 units, an ended window
		g.Expect(c.ZCard(ctx, hk).Val()).To(Equal(int64(100_001)))
		for i := range 3 {
			_, h2, err := l.Reserve(ctx, key, lim, 1, 1, time.Hour)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(h2).NotTo(BeNil())
			g.Expect(c.ZCard(ctx, hk).Val()).To(Equal(int64(100_001-16*(i+1)+(i+1))), "16 swept a call, one added")
		}
		g.Expect(counted(t, c, key, lim)).To(Equal(int64(103)))
		// Forged records of the current window, with units past any count: nothing goes back.
		recs, err := c.ZRange(ctx, hk, -1, -1).Result()
		g.Expect(err).NotTo(HaveOccurred())
		prefix, _, _ := strings.Cut(recs[0], ":")
		stuffHolds(t, c, hk, prefix+":"+strings.Repeat("9", 30)+":forged:%d", 16, "-inf")
		_, _, err = l.Reserve(ctx, key, lim, 1, 1, time.Hour)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(counted(t, c, key, lim)).To(Equal(int64(104)))
		// Open records past the bound, forged with deadlines far away: the key refuses its own
		// holds, retry within a second.
		stuffHolds(t, c, hk, "0:1:forged:open:%d", limiter.DefaultMaxOpenHolds, "1e15")
		r, none, err := l.Reserve(ctx, key, lim, 1, 1, time.Hour)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(none).To(BeNil())
		g.Expect(r.Allowed).To(BeFalse())
		g.Expect(r.RetryAfter).To(BeNumerically("~", time.Second, 10*time.Millisecond))
	})
}

// Any ARGV to the holds' scripts, sent by EVALSHA as a tenant can: an error, and nothing
// written.
func TestHoldScriptsRefuseBadArguments(t *testing.T) {
	g := NewWithT(t)
	c := newClient(t, shared.URL())
	l := newLimiter(t, c, limiter.TestOptions{ReplicaID: limiter.NewReplicaID()})
	ctx := context.Background()
	window := longWindow.Milliseconds()
	for _, alg := range holdAlgorithms {
		key, lim := uniqueKey(t), holdLimit(alg, 100)
		_, h, err := l.Reserve(ctx, key, lim, 1, 10, time.Hour)
		g.Expect(err).NotTo(HaveOccurred())
		state, hk := key+":swc", holdsKey(key, lim)
		keys := []string{state, hk}
		switch alg {
		case limiter.TokenBucket:
			state = key + ":tb"
			keys[0] = state
		case limiter.SlidingWindowLog:
			state = key + ":swl"
			keys = []string{state, hk, state + ":held"}
		}
		recs, err := c.ZRange(ctx, hk, 0, -1).Result()
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(recs).To(HaveLen(1))
		rec := recs[0]
		snapshot := func() string {
			v, _ := c.Dump(ctx, state).Result()
			z, _ := c.ZRangeWithScores(ctx, hk, 0, -1).Result()
			held, _ := c.Get(ctx, state+":held").Result()
			return fmt.Sprint(v, z, held)
		}
		before := snapshot()
		bad := []any{"nan", "inf", "-inf", -1, "1e300", 1.5, "x", ""}
		var calls [][]any
		sha := scripts.HoldSettle()
		if alg == limiter.SlidingWindowLog {
			sha = scripts.HoldSettleSlidingWindowLog()
		}
		if alg == limiter.TokenBucket {
			sha = scripts.HoldSettleTokenBucket()
			good := []any{100, window, 100, rec, 3, time.Now().Add(time.Hour).UnixMilli()}
			for i := range good {
				for _, b := range bad {
					if i == 3 && b == "" {
						continue
					}
					a := append([]any(nil), good...)
					a[i] = b
					calls = append(calls, a)
				}
			}
		} else {
			good := []any{100, window, rec, 3, time.Now().Add(time.Hour).UnixMilli()}
			for i := range good {
				for _, b := range bad {
					a := append([]any(nil), good...)
					a[i] = b
					calls = append(calls, a)
				}
			}
		}
		calls = append(calls, []any{}, []any{100, window, strings.Repeat("9", 161), 1, 0})
		for _, a := range calls {
			err := c.EvalSha(ctx, sha.SHA, keys, a...).Err()
			g.Expect(err).To(HaveOccurred(), "%s %v", alg, a)
		}
		err = c.EvalSha(ctx, sha.SHA, []string{state}, 100, window, rec, 1, 0).Err()
		g.Expect(err).To(HaveOccurred(), "without the records' key")
		if alg == limiter.SlidingWindowLog {
			err = c.EvalSha(ctx, sha.SHA, keys[:2], 100, window, rec, 1, 0).Err()
			g.Expect(err).To(HaveOccurred(), "without the held units' key")
		}
		// The reserve's own hold ARGV.
		algSHA, _ := scripts.For(string(alg))
		for _, ttl := range bad {
			var args []any
			switch alg {
			case limiter.TokenBucket:
				args = []any{100, window, 1, 0, 100, 5, "r:x", ttl}
			case limiter.SlidingWindowLog:
				args = []any{100, window, 1, 0, 5, "r:x", ttl}
			default:
				args = []any{100, window, 1, 0, 5, "", 0, 0, 0, 0, 0, 0, "r:x", ttl}
			}
			g.Expect(c.EvalSha(ctx, algSHA.SHA, keys, args...).Err()).To(HaveOccurred(), "%s ttl %v", alg, ttl)
		}
		if alg == limiter.SlidingWindowLog {
			// The limit, the cost and the want of a hold (a want below the cost, or none, is
			// the cost, as for a lease), and a reserve without the held key.
			for i, bads := range [][]any{bad, bad, {"nan", "inf", "1e300", 1.5}} {
				for _, b := range bads {
					a := []any{100, window, 1, 0, 5, "r:x", 1000}
					a[[]int{0, 2, 4}[i]] = b
					g.Expect(c.EvalSha(ctx, algSHA.SHA, keys, a...).Err()).To(HaveOccurred(), "%v", a)
				}
			}
			g.Expect(c.EvalSha(ctx, algSHA.SHA, keys[:2], 100, window, 1, 0, 5, "r:x", 1000).Err()).To(HaveOccurred())
		}
		g.Expect(snapshot()).To(Equal(before), "%s: nothing written", alg)
		s, err := l.Settle(ctx, h, 4)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(s.Returned).To(Equal(int64(6)))
	}
}
