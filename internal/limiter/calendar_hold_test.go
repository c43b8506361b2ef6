package limiter_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/redline-dev/redline/internal/calendar"
	"github.com/redline-dev/redline/internal/limiter"
)

// TestCalendarHoldAcrossReset: a token budget per day in Berlin (on the 25-hour day of its DST
// change) and per month in New York (at the end of a leap February). Holds count in the period
// at once and say its true end; a settle in the period gives back what was not used, also past
// the hold's deadline; a hold taken before the reset and settled after it gives nothing back to
// the new period (its units ended with the old one) and charges its excess to the new one, as a
// charge does. Redis's clock moves by restarting it with its append-only file.
func TestCalendarHoldAcrossReset(t *testing.T) {
	cases := []struct {
		name                 string
		spec                 calendar.Spec
		at, later, next, end string
		period, nextPeriod   time.Duration
	}{
		{"a Berlin day", calendar.Spec{Unit: calendar.Day, Zone: "Europe/Berlin"},
			"2028-10-29T21:00:00+01:00", "2028-10-29T23:30:00+01:00", "2028-10-30T00:00:30+01:00", "2028-10-30T00:00:00+01:00",
			25 * time.Hour, 24 * time.Hour},
		{"a New York month", calendar.Spec{Unit: calendar.Month, Zone: "America/New_York"},
			"2028-02-29T21:00:00-05:00", "2028-02-29T23:30:00-05:00", "2028-03-01T00:00:30-05:00", "2028-03-01T00:00:00-05:00",
			29 * 24 * time.Hour, 31*24*time.Hour - time.Hour}, // March loses an hour to DST
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			ctx := context.Background()
			s := startAt(t, tc.at, "--appendonly", "yes", "--appendfsync", "always")
			lim := calendarLimit(t, 100, tc.spec)
			key := uniqueKey(t)
			l := newLimiter(t, newClient(t, s.URL()), limiter.TestOptions{PrecheckSize: -1})
			end, _ := time.Parse(time.RFC3339, tc.end)

			before := redisNow(t, s)
			r, a, err := l.Reserve(ctx, key, lim, 1, 50, time.Hour)
			after := redisNow(t, s)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(a).NotTo(BeNil())
			g.Expect(a.Units).To(BeEquivalentTo(50))
			g.Expect(r.Remaining).To(BeEquivalentTo(50))
			g.Expect(r.Period).To(Equal(tc.period))
			g.Expect(r.ResetAfter).To(BeNumerically(">=", end.Sub(after).Truncate(time.Millisecond)))
			g.Expect(r.ResetAfter).To(BeNumerically("<=", end.Sub(before)+time.Millisecond), "Redis counts to the end in whole ms")
			_, b, err := l.Reserve(ctx, key, lim, 1, 45, 48*time.Hour) // past the period's end
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(b.Units).To(BeEquivalentTo(45))
			_, c, err := l.Reserve(ctx, key, lim, 1, 45, 48*time.Hour)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(c.Units).To(BeEquivalentTo(5), "what is left of the period")
			r, none, err := l.Reserve(ctx, key, lim, 1, 10, time.Hour)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(none).To(BeNil())
			g.Expect(r.Allowed).To(BeFalse())
			g.Expect(r.RetryAfter).To(BeNumerically("<=", time.Second), "open holds may give back at any time")

			move(t, s, tc.later) // past a's deadline (an hour), the same period
			l = newLimiter(t, newClient(t, s.URL()), limiter.TestOptions{PrecheckSize: -1})
			_, e, err := l.Reserve(ctx, key, lim, 1, 1, time.Hour) // sweeps a's record, past its deadline
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(e).To(BeNil(), "the period is spent until a settle")
			st, err := l.Settle(ctx, a, 20)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(st).To(Equal(limiter.Settled{Returned: 30, Expired: true}), "a late settle in its period gives back as a timely one")
			g.Expect(remaining(t, l, key, lim)).To(BeEquivalentTo(30))

			move(t, s, tc.next)
			l = newLimiter(t, newClient(t, s.URL()), limiter.TestOptions{PrecheckSize: -1})
			st, err = l.Settle(ctx, b, 60)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(st).To(Equal(limiter.Settled{Debt: 15}), "taken before the reset: nothing back, the excess in the new period")
			st, err = l.Settle(ctx, c, 1)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(st).To(Equal(limiter.Settled{}), "its unused units ended with their period")
			st, err = l.Charge(ctx, key, lim, 10)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(st.Debt).To(BeEquivalentTo(10))
			r, d, err := l.Reserve(ctx, key, lim, 1, 1000, time.Hour)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(d.Units).To(BeEquivalentTo(75), "the new period less the overrun and the charge")
			g.Expect(r.Period).To(Equal(tc.nextPeriod))
			g.Expect(r.ResetAfter).To(BeNumerically(">", tc.nextPeriod-time.Hour))
			g.Expect(r.ResetAfter).To(BeNumerically("<", tc.nextPeriod))
		})
	}
}

// TestCalendarHoldsExactAcrossReplicas: three replicas spend a day's token budget in Tokyo
// through holds that use less than they reserve; together they use it exactly.
func TestCalendarHoldsExactAcrossReplicas(t *testing.T) {
	s := startAt(t, "2028-02-29T12:00:00+09:00")
	lim := calendarLimit(t, 300, calendar.Spec{Unit: calendar.Day, Zone: "Asia/Tokyo"})
	key := uniqueKey(t)
	var used atomic.Int64
	spend := func(l *limiter.Limiter) error {
		for {
			_, h, err := l.Reserve(context.Background(), key, lim, 1, 7, time.Hour)
			if err != nil || h == nil {
				return err
			}
			u := min(h.Units, 5)
			if _, err := l.Settle(context.Background(), h, u); err != nil {
				return err
			}
			used.Add(u)
		}
	}
	var ls []*limiter.Limiter
	var wg sync.WaitGroup
	for range 3 {
		l := newLimiter(t, newClient(t, s.URL()), limiter.TestOptions{PrecheckSize: -1})
		ls = append(ls, l)
		wg.Go(func() {
			if err := spend(l); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	// A replica stops at its first refusal, while another's hold may still give back: one more
	// pass after all holds ended spends what is left.
	if err := spend(ls[0]); err != nil {
		t.Fatal(err)
	}
	if got := used.Load(); got != lim.Requests {
		t.Fatalf("three replicas used %d of a day's %d", got, lim.Requests)
	}
	if left := remaining(t, ls[1], key, lim); left != 0 {
		t.Fatalf("%d left after the budget was used", left)
	}
}

// move restarts s with its clock at at (RFC 3339).
func move(t *testing.T, s interface {
	Stop() error
	Start() error
	MoveClock(time.Time) error
}, at string) {
	t.Helper()
	when, err := time.Parse(time.RFC3339, at)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := s.MoveClock(when); err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
}

// remaining is what is left of key under lim, by a dry run of one unit (whose Remaining is
// what its decision would leave).
func remaining(t *testing.T, l *limiter.Limiter, key string, lim limiter.Limit) int64 {
	t.Helper()
	r, err := l.Peek(context.Background(), key, lim, 1)
	if err != nil {
		t.Fatal(err)
	}
	if r.Allowed {
		return r.Remaining + 1
	}
	return r.Remaining
}
