package limiter_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"github.com/redis/go-redis/v9"

	"github.com/redline-dev/redline/internal/calendar"
	"github.com/redline-dev/redline/internal/limiter"
	"github.com/redline-dev/redline/internal/limiter/scripts"
	"github.com/redline-dev/redline/internal/testutil/redistest"
)

// holdSharesFleet is three limiters on url, each with a client of its own, with a ReplicaID
// each (shares) or without; grants never wait after a restore (no RestoreHold), so each call's
// outcome is its own.
func holdSharesFleet(t *testing.T, url string, withShares bool) []*limiter.Limiter {
	t.Helper()
	var ls []*limiter.Limiter
	for range 3 {
		o := limiter.TestOptions{PrecheckSize: -1, BreakerOpenFor: 100 * time.Millisecond, MaxOpenHolds: 1000}
		if withShares {
			o.ReplicaID = limiter.NewReplicaID()
		}
		ls = append(ls, newLimiter(t, newClient(t, url), o))
	}
	return ls
}

// untilRedisAnswers polls a dry run on every limiter until Redis answers each: the first calls
// after a restart may meet a connection to the process that is gone.
func untilRedisAnswers(t *testing.T, ls []*limiter.Limiter, key string, lim limiter.Limit) {
	t.Helper()
	for _, l := range ls {
		NewWithT(t).Eventually(func() error {
			_, err := l.Peek(context.Background(), key, lim, 1)
			return err
		}).WithTimeout(30 * time.Second).WithPolling(50 * time.Millisecond).Should(Succeed())
	}
}

// dayCount is what Redis counts in the day of key (a Day calendar) starting at start.
func dayCount(t *testing.T, c redis.UniversalClient, key string, start int64) int64 {
	t.Helper()
	n, err := c.Get(context.Background(), fmt.Sprintf("%s:cal:day:%d", key, start)).Int64()
	if err == redis.Nil {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// reserveAll holds want units of key as l, and fails the test when fewer are held. Its
// deadline is a period away: no hold of these tests expires.
func reserveAll(t *testing.T, l *limiter.Limiter, key string, lim limiter.Limit, want int64) *limiter.Hold {
	t.Helper()
	r, h, err := l.Reserve(context.Background(), key, lim, 1, want, lim.Window)
	if err != nil || h == nil || h.Units != want || h.Degraded {
		t.Fatalf("reserving %d: %+v, %+v, %v", want, r, h, err)
	}
	return h
}

func settle(t *testing.T, l *limiter.Limiter, h *limiter.Hold, used int64) limiter.Settled {
	t.Helper()
	s, err := l.Settle(context.Background(), h, used)
	if err != nil {
		t.Fatalf("settling %d of %d: %v", used, h.Units, err)
	}
	return s
}

// A token budget on a day in a zone, spent by three replicas through holds that give back,
// overrun and use exactly what they held, charges and holds still open; Redis restarted empty
// (SIGKILL, no persistence) in the middle of the day. With shares, each replica's next call
// (a reserve, a settle of a hold still open, a decision) raises the day's count by exactly
// what that replica had used or still held, and the three together restore it to the sum;
// without, the day counts only what came after the restart, and admits it all again.
func TestCalendarHoldSharesRestoreARestartedRedis(t *testing.T) {
	for _, withShares := range []bool{true, false} {
		t.Run(fmt.Sprintf("shares=%v", withShares), func(t *testing.T) {
			g := NewWithT(t)
			ctx := context.Background()
			srv, err := redistest.Start()
			g.Expect(err).NotTo(HaveOccurred())
			t.Cleanup(func() { _ = srv.Close() })
			ls := holdSharesFleet(t, srv.URL(), withShares)
			c := newClient(t, srv.URL())
			lim, start := dayAwayFromMidnight(t, c, 100_000)
			lim.FailureMode = limiter.FailureModeClosed
			key := uniqueKey(t)
			count := func() int64 { return dayCount(t, c, key, start) }

			var spent [3]int64 // what each replica used, or holds still open
			open := make([]*limiter.Hold, 3)
			for i, l := range ls {
				for j := range 6 {
					h := reserveAll(t, l, key, lim, int64(10+j))
					used := h.Units + []int64{-3, 4, 0}[j%3] // gives back 3, overruns by 4, exact
					s := settle(t, l, h, used)
					g.Expect(s.Returned - s.Debt).To(Equal(h.Units - used))
					spent[i] += used
				}
				s, err := l.Charge(ctx, key, lim, 5)
				g.Expect(err).NotTo(HaveOccurred())
				g.Expect(s.Debt).To(BeEquivalentTo(5))
				open[i] = reserveAll(t, l, key, lim, 7)
				spent[i] += 5 + 7
			}
			total := spent[0] + spent[1] + spent[2]
			lost := total
			g.Expect(count()).To(Equal(total), "the day counts what was used and held")

			g.Expect(srv.Stop()).To(Succeed()) // SIGKILL: the day's count is gone
			g.Expect(srv.Start()).To(Succeed())
			untilRedisAnswers(t, ls, key, lim)
			g.Expect(count()).To(BeZero())

			// Replica 0 reserves: its call restores its share first.
			h := reserveAll(t, ls[0], key, lim, 3)
			if withShares {
				g.Expect(count()).To(Equal(spent[0]+3), "replica 0's share, restored, and its new hold")
			}
			spent[0] += 3
			settle(t, ls[0], h, 3)
			// Replica 1 settles the hold it still had open, giving 2 back: restored, then lowered.
			s := settle(t, ls[1], open[1], 5)
			spent[1] -= 2
			if withShares {
				g.Expect(s.Returned).To(BeEquivalentTo(2))
				g.Expect(count()).To(Equal(spent[0] + spent[1]))
			}
			// Replica 2 decides: a plain grant restores its held units too.
			r, err := ls[2].Allow(ctx, key, lim, 1)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(r.Allowed).To(BeTrue())
			spent[2]++
			settle(t, ls[0], open[0], 9) // overruns by 2
			spent[0] += 2
			settle(t, ls[2], open[2], 7)
			total = spent[0] + spent[1] + spent[2]

			var restored uint64
			for _, l := range ls {
				restored += l.Stats().RestoredUnits
			}
			t.Logf("shares=%v: %d used in the day, Redis counts %d after the restart, %d units restored", withShares, total, count(), restored)
			if !withShares {
				g.Expect(count()).To(BeNumerically("<", total/2), "the restart must lose the day for this test to mean anything")
				g.Expect(remaining(t, ls[0], key, lim)).To(BeNumerically(">", lim.Requests-total/2), "and the day admits it again")
				return
			}
			g.Expect(count()).To(Equal(total), "every replica restored exactly what it used or held")
			g.Expect(remaining(t, ls[0], key, lim)).To(Equal(lim.Requests - total))
			g.Expect(restored).To(BeEquivalentTo(lost), "what the restart lost, once")
		})
	}
}

// A hold taken before midnight in Berlin and settled after it (Redis restarted empty at the
// reset): its units ended with their day, and its overrun counts in the new day and in this
// replica's share of it, so a second restart restores the overrun in the new day, and nothing
// of what the old day counted (100 units) there.
func TestCalendarHoldSharesAcrossTheReset(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	s := startAt(t, "2028-10-29T23:00:00+01:00")
	lim := calendarLimit(t, 1000, calendar.Spec{Unit: calendar.Day, Zone: "Europe/Berlin"})
	lim.FailureMode = limiter.FailureModeClosed
	key := uniqueKey(t)
	c := newClient(t, s.URL())
	l := newLimiter(t, newClient(t, s.URL()), limiter.TestOptions{ReplicaID: limiter.NewReplicaID(), PrecheckSize: -1,
		BreakerOpenFor: 100 * time.Millisecond})
	a := reserveAll(t, l, key, lim, 50)
	b := reserveAll(t, l, key, lim, 20)
	r, err := l.Allow(ctx, key, lim, 30)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(r.Allowed).To(BeTrue())
	day, _ := lim.Calendar.PeriodMS(redisNow(t, s).UnixMilli())
	g.Expect(dayCount(t, c, key, day)).To(BeEquivalentTo(100))

	move(t, s, "2028-10-30T00:00:30+01:00") // the next day, on a Redis restarted empty
	untilRedisAnswers(t, []*limiter.Limiter{l}, key, lim)
	next, _ := lim.Calendar.PeriodMS(redisNow(t, s).UnixMilli())
	g.Expect(next).To(BeNumerically(">", day))
	g.Expect(settle(t, l, a, 60)).To(Equal(limiter.Settled{Debt: 10}), "the overrun, in the new day")
	g.Expect(settle(t, l, b, 5)).To(Equal(limiter.Settled{}), "its unused units ended with their day")
	g.Expect(dayCount(t, c, key, next)).To(BeEquivalentTo(10))

	g.Expect(s.Stop()).To(Succeed()) // and once more, in the new day
	g.Expect(s.Start()).To(Succeed())
	untilRedisAnswers(t, []*limiter.Limiter{l}, key, lim)
	r, err = l.Allow(ctx, key, lim, 1)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(r.Allowed).To(BeTrue())
	g.Expect(dayCount(t, c, key, next)).To(BeEquivalentTo(11), "the overrun restored, and the new grant")
	g.Expect(l.Stats().RestoredUnits).To(BeEquivalentTo(10))
}

// Settles racing re-assertions and decisions on a Redis restarted empty: three replicas settle
// the holds they had open (half give back, half overrun) while each keeps asking for a
// re-assertion of all its shares and deciding; whatever the order Redis ran them in, the day
// counts exactly what was used and admitted (a restore raises a share to what the replica
// knows, never adds it twice; a call read before a settle's give-back restores nothing of it).
func TestCalendarHoldSharesSettleRacingARestore(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	srv := startOwnRedis(t)
	ls := holdSharesFleet(t, srv.URL(), true)
	c := newClient(t, srv.URL())
	lim, start := dayAwayFromMidnight(t, c, 100_000)
	lim.FailureMode = limiter.FailureModeClosed
	key := uniqueKey(t)
	const perReplica = 40
	holds := make([][]*limiter.Hold, 3)
	var total int64
	for i, l := range ls {
		for range perReplica {
			holds[i] = append(holds[i], reserveAll(t, l, key, lim, 10))
		}
		total += 10 * perReplica
	}
	g.Expect(dayCount(t, c, key, start)).To(Equal(total))
	g.Expect(srv.Stop()).To(Succeed())
	g.Expect(srv.Start()).To(Succeed())
	untilRedisAnswers(t, ls, key, lim)

	var mu sync.Mutex
	var wg sync.WaitGroup
	for i, l := range ls {
		wg.Go(func() { // settles: used 4 (6 back) or 13 (3 over)
			for j, h := range holds[i] {
				used := []int64{4, 13}[j%2]
				s, err := l.Settle(ctx, h, used)
				if err != nil {
					t.Errorf("settle: %v", err)
					return
				}
				if s.Returned-s.Debt != 10-used {
					t.Errorf("settled %d of 10: %+v", used, s)
				}
				mu.Lock()
				total += used - 10
				mu.Unlock()
			}
		})
		wg.Go(func() { // re-assertions and decisions
			for range perReplica {
				l.Reassert()
				r, err := l.Allow(ctx, key, lim, 1)
				if err != nil || !r.Allowed {
					t.Errorf("decision: %+v, %v", r, err)
					return
				}
				mu.Lock()
				total++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	// Each replica's last word: a decision that restores whatever of its share is missing.
	for _, l := range ls {
		r, err := l.Allow(ctx, key, lim, 1)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(r.Allowed).To(BeTrue())
		total++
	}
	got := dayCount(t, c, key, start)
	t.Logf("the day counts %d, %d used and admitted", got, total)
	g.Expect(got).To(Equal(total))
	g.Expect(remaining(t, ls[0], key, lim)).To(Equal(lim.Requests - total))
}

// The scripts, in both orders a settle and a re-assertion of the same replica can reach a
// Redis that lost the day: the settle says what the replica knew before its give-back (10
// held) with the stamp of that give-back, a re-assertion what it knew when it was read. Raised
// to, never added: the day ends counting the 4 units used, whichever ran first, and however
// often the stale re-assertion (read before the give-back, run after it) comes.
func TestCalendarHoldSharesScriptsRaiseNeverAdd(t *testing.T) {
	ctx := context.Background()
	c := newClient(t, shared.URL())
	lim, _ := dayAwayFromMidnight(t, c, 1000)
	now, err := c.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	s1, e1 := lim.Calendar.PeriodMS(now.UnixMilli())
	s0, _ := lim.Calendar.PeriodMS(s1 - 1)
	_, e2 := lim.Calendar.PeriodMS(e1)
	span := lim.Window.Milliseconds()
	run := func(g Gomega, s scripts.Script, keys []string, args ...any) []int64 {
		cmds := []redis.Cmder{scripts.EvalSha(ctx, s, keys, args...)}
		scripts.Exec(ctx, c, cmds, []scripts.Script{s})
		n, err := cmds[0].(*redis.Cmd).Int64Slice()
		g.Expect(err).NotTo(HaveOccurred())
		return n
	}
	for _, settleFirst := range []bool{true, false} {
		t.Run(fmt.Sprintf("settle first=%v", settleFirst), func(t *testing.T) {
			g := NewWithT(t)
			sk := uniqueKey(t) + ":cal:day"
			var periods, hashes []string
			for _, b := range []int64{s0, s1, e1} {
				periods = append(periods, fmt.Sprintf("%s:%d", sk, b))
				hashes = append(hashes, fmt.Sprintf("%s:%d:r", sk, b))
			}
			cal := []any{lim.Requests, span, 0, 0, s0, s1, e1, e2}
			with := func(cost int64, extra ...any) []any {
				a := append([]any{}, cal...)
				a[2] = cost
				return append(a, extra...)
			}
			withHolds := append(append(append([]string{}, periods...), sk+":h"), hashes...)
			r := run(g, scripts.CalendarReserve(), withHolds, with(1, 10, "a:1", 3_600_000, 64, "a", s1, 0, 0, 0, 0, 1)...)
			g.Expect(r[5]).To(BeEquivalentTo(10))
			g.Expect(c.Del(ctx, periods[1], hashes[1]).Err()).To(Succeed()) // Redis lost the day
			count := func() int64 {
				n, _ := c.Get(ctx, periods[1]).Int64()
				return n
			}
			reassert := func(known, lv int64) int64 {
				return run(g, scripts.CalendarWindow(), append(append([]string{}, periods...), hashes...),
					with(0, "a", s1, known, 0, 0, 0, lv)...)[6]
			}
			settleIt := func() []int64 {
				return run(g, scripts.CalendarSettle(), withHolds,
					with(0, fmt.Sprintf("%d:10:a:1", s1), 4, r[7], "a", s1, 10, 0, 0, 0, 2)...)
			}
			if settleFirst {
				st := settleIt()
				g.Expect(st[0]).To(BeEquivalentTo(6), "given back")
				g.Expect(st[3]).To(BeEquivalentTo(10), "restored first")
			} else {
				g.Expect(reassert(4, 2)).To(BeEquivalentTo(4), "read after the give-back, run before it")
				st := settleIt()
				g.Expect(st[0]).To(BeEquivalentTo(6))
				g.Expect(st[3]).To(BeEquivalentTo(6), "only what the re-assertion did not")
			}
			g.Expect(count()).To(BeEquivalentTo(4))
			for range 2 {
				g.Expect(reassert(10, 1)).To(BeZero(), "read before the give-back: older than this Redis")
				g.Expect(reassert(4, 2)).To(BeZero())
			}
			g.Expect(count()).To(BeEquivalentTo(4))
		})
	}
}
