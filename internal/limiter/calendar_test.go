package limiter_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/redline-dev/redline/internal/calendar"
	"github.com/redline-dev/redline/internal/limiter"
	"github.com/redline-dev/redline/internal/testutil/redistest"
)

// These tests move Redis's clock (redistest.StartAt) to the days calendars get wrong: a DST
// change, a leap day, a billing day past a month's end. The limiters run on the real clock, years
// away: their first call finds Redis's clock in none of the periods they sent and asks again
// around it, as a sidecar whose clock is far off would.

func startAt(t *testing.T, at string, extra ...string) *redistest.Server {
	t.Helper()
	when, err := time.Parse(time.RFC3339, at)
	if err != nil {
		t.Fatal(err)
	}
	s, err := redistest.StartAt(when, extra...)
	if err != nil {
		t.Fatalf("starting redis-server at %s: %v", at, err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func calendarLimit(t *testing.T, requests int64, spec calendar.Spec) limiter.Limit {
	t.Helper()
	c, err := calendar.New(spec)
	if err != nil {
		t.Fatal(err)
	}
	return limiter.Limit{Algorithm: limiter.FixedWindow, Requests: requests, Window: c.MaxLength(), Calendar: c}
}

// redisNow reads Redis's clock.
func redisNow(t *testing.T, s *redistest.Server) time.Time {
	t.Helper()
	c := s.Client("")
	defer c.Close()
	now, err := c.Time(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	return now
}

// TestCalendarPeriodsOnRedisClock: three replicas share a day, a month and a billing month
// exactly, and every decision says the true length of its period and the true time to its end,
// bounded by Redis's clock read before and after the decisions.
func TestCalendarPeriodsOnRedisClock(t *testing.T) {
	cases := []struct {
		name     string
		redisAt  string
		spec     calendar.Spec
		end      string
		period   time.Duration
		requests int64
	}{
		{"Berlin's 23-hour day", "2028-03-26T12:00:00+02:00", calendar.Spec{Unit: calendar.Day, Zone: "Europe/Berlin"},
			"2028-03-27T00:00:00+02:00", 23 * time.Hour, 30},
		{"New York's February of a leap year", "2028-02-29T12:00:00-05:00", calendar.Spec{Unit: calendar.Month, Zone: "America/New_York"},
			"2028-03-01T00:00:00-05:00", 29 * 24 * time.Hour, 45},
		{"Tokyo's billing day 31 on Feb 29", "2028-02-29T12:00:00+09:00", calendar.Spec{Unit: calendar.Month, Zone: "Asia/Tokyo", BillingDay: 31},
			"2028-03-31T00:00:00+09:00", 31 * 24 * time.Hour, 21},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := startAt(t, tc.redisAt)
			lim := calendarLimit(t, tc.requests, tc.spec)
			end, _ := time.Parse(time.RFC3339, tc.end)
			key := uniqueKey(t)
			before := redisNow(t, s)
			var mu sync.Mutex
			var results []limiter.Result
			var wg sync.WaitGroup
			for range 3 {
				l := newLimiter(t, newClient(t, s.URL()), limiter.TestOptions{})
				wg.Go(func() {
					for range 2 * tc.requests / 3 {
						r, err := l.Allow(context.Background(), key, lim, 1)
						if err != nil {
							t.Error(err)
							return
						}
						mu.Lock()
						results = append(results, r)
						mu.Unlock()
					}
				})
			}
			wg.Wait()
			after := redisNow(t, s)
			var admitted int64
			for _, r := range results {
				if r.Source != limiter.SourceRedis && r.Source != limiter.SourcePrecheck {
					t.Fatalf("decision from %s (%v), want redis or its refusal repeated", r.Source, r.Err)
				}
				if r.Allowed {
					admitted++
				} else if r.RetryAfter != r.ResetAfter {
					t.Errorf("refused with retry-after %s, reset %s: a fixed period frees at its end", r.RetryAfter, r.ResetAfter)
				}
				if r.Period != tc.period {
					t.Errorf("period %s, want %s", r.Period, tc.period)
				}
				lo, hi := end.Sub(after).Truncate(time.Millisecond), end.Sub(before)
				if r.Source == limiter.SourcePrecheck {
					// A repeated refusal counts down on the local clock from before its call:
					// early by a round trip at most, never late.
					lo -= time.Second
				}
				if r.ResetAfter < lo || r.ResetAfter > hi {
					t.Errorf("reset after %s, want between %s and %s (to %s on Redis's clock)", r.ResetAfter, lo, hi, end)
				}
			}
			if admitted != tc.requests {
				t.Fatalf("admitted %d of %d requests over three replicas, want exactly %d", admitted, len(results), tc.requests)
			}
		})
	}
}

// TestCalendarRaiseMidMonth: a month's quota raised mid-month admits at once, since only
// admitted units are counted; lowered below the count it refuses what comes next and takes
// nothing back.
func TestCalendarRaiseMidMonth(t *testing.T) {
	s := startAt(t, "2028-02-15T12:00:00+01:00")
	l := newLimiter(t, newClient(t, s.URL()), limiter.TestOptions{})
	key := uniqueKey(t)
	spec := calendar.Spec{Unit: calendar.Month, Zone: "Europe/Berlin"}
	admit := func(lim limiter.Limit, n int) (yes int) {
		for range n {
			r, err := l.Allow(context.Background(), key, lim, 1)
			if err != nil {
				t.Fatal(err)
			}
			if r.Allowed {
				yes++
			}
		}
		return yes
	}
	if got := admit(calendarLimit(t, 10, spec), 25); got != 10 {
		t.Fatalf("admitted %d of 25 under 10 a month", got)
	}
	if got := admit(calendarLimit(t, 15, spec), 10); got != 5 {
		t.Fatalf("raised to 15 after 15 refusals: admitted %d more, want 5 at once", got)
	}
	if got := admit(calendarLimit(t, 8, spec), 3); got != 0 {
		t.Fatalf("lowered to 8 below a count of 15: admitted %d", got)
	}
	r, err := l.Allow(context.Background(), key, calendarLimit(t, 20, spec), 1)
	if err != nil || !r.Allowed || r.Remaining != 4 {
		t.Fatalf("raised to 20: %+v, %v; want admitted with 4 remaining (15 counted, the 5 refused never were)", r, err)
	}
}

// TestCalendarNewDayAtTheZonesMidnight: a day's count persists across a restart within the day,
// and a new day starts at Berlin's midnight after a DST change, with a fresh count.
func TestCalendarNewDayAtTheZonesMidnight(t *testing.T) {
	s := startAt(t, "2028-10-29T22:00:00+01:00", "--appendonly", "yes", "--appendfsync", "always")
	c := newClient(t, s.URL())
	lim := calendarLimit(t, 4, calendar.Spec{Unit: calendar.Day, Zone: "Europe/Berlin"})
	key := uniqueKey(t)
	count := func(n int) (yes int, last limiter.Result) {
		l := newLimiter(t, c, limiter.TestOptions{})
		for range n {
			r, err := l.Allow(context.Background(), key, lim, 1)
			if err != nil {
				t.Fatal(err)
			}
			if r.Allowed {
				yes++
			}
			last = r
		}
		return yes, last
	}
	if got, r := count(6); got != 4 || r.Period != 25*time.Hour {
		t.Fatalf("on the 25-hour day: admitted %d of 6, period %s; want 4, 25h", got, r.Period)
	}
	move := func(at string) {
		when, _ := time.Parse(time.RFC3339, at)
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
	move("2028-10-29T23:30:00+01:00")
	if got, _ := count(2); got != 0 {
		t.Fatalf("later the same day: admitted %d, want 0", got)
	}
	move("2028-10-30T00:00:30+01:00")
	if got, r := count(6); got != 4 || r.Period != 24*time.Hour {
		t.Fatalf("the next day: admitted %d of 6, period %s; want 4, 24h", got, r.Period)
	}
}

// TestCalendarGiveBack: what a period admitted for a request another rule refused goes back to
// that period, so the next request of the key passes.
func TestCalendarGiveBack(t *testing.T) {
	s := startAt(t, "2028-02-29T12:00:00Z")
	l := newLimiter(t, newClient(t, s.URL()), limiter.TestOptions{})
	key := uniqueKey(t)
	lim := calendarLimit(t, 3, calendar.Spec{Unit: calendar.Month})
	var first limiter.Result
	for i := range 4 {
		r, err := l.Allow(context.Background(), key, lim, 1)
		if err != nil {
			t.Fatal(err)
		}
		if r.Allowed != (i < 3) {
			t.Fatalf("request %d: allowed %v", i, r.Allowed)
		}
		if i == 0 {
			first = r
		}
	}
	back, err := l.GiveBack(context.Background(), []limiter.Refund{{Key: key, Limit: lim, Result: first}})
	if err != nil || back != 1 {
		t.Fatalf("gave back %d, %v; want 1", back, err)
	}
	r, err := l.Allow(context.Background(), key, calendarLimit(t, 3, calendar.Spec{Unit: calendar.Month}), 1)
	if err != nil || !r.Allowed || r.Remaining != 0 {
		t.Fatalf("after the give-back: %+v, %v; want admitted with none left", r, err)
	}
}

// TestCalendarPeek: a dry run of a calendar window answers what the next decision gets, through
// the month's limit and past it, on Redis's clock years from the limiter's (each dry run first
// misses the periods it sent and asks again around Redis's), and writes nothing.
func TestCalendarPeek(t *testing.T) {
	s := startAt(t, "2028-02-29T23:30:00+01:00")
	c := newClient(t, s.URL())
	l := newLimiter(t, c, limiter.TestOptions{PrecheckSize: -1})
	key := uniqueKey(t)
	lim := calendarLimit(t, 5, calendar.Spec{Unit: calendar.Month, Zone: "Europe/Berlin"})
	g := NewWithT(t)
	ctx := context.Background()
	for i, cost := range []int64{1, 2, 6, 1, 3, 1, 1} {
		start := time.Now()
		peek, err := l.Peek(ctx, key, lim, cost)
		g.Expect(err).NotTo(HaveOccurred())
		before := stateOf(t, c, key)
		for range 20 {
			_, err := l.Peek(ctx, key, lim, cost)
			g.Expect(err).NotTo(HaveOccurred())
		}
		g.Expect(stateOf(t, c, key)).To(Equal(before), "step %d: dry runs changed the state", i)
		got, err := l.Allow(ctx, key, lim, cost)
		g.Expect(err).NotTo(HaveOccurred())
		what := fmt.Sprintf("step %d, cost %d: dry run %+v, decision %+v", i, cost, peek, got)
		sameAnswer(g, peek, got, time.Since(start), what)
		if cost <= lim.Requests { // a cost past the limit is refused before Redis is asked
			g.Expect(peek.Period).To(Equal(29*24*time.Hour), what)
		}
	}
}

// TestCalendarUnitChangeStartsAfresh: a rule moved from months to days on the 1st, when both
// periods start at the same instant, counts the day afresh, not with the month's units.
func TestCalendarUnitChangeStartsAfresh(t *testing.T) {
	s := startAt(t, "2028-03-01T00:30:00+01:00")
	l := newLimiter(t, newClient(t, s.URL()), limiter.TestOptions{})
	key := uniqueKey(t)
	month := calendarLimit(t, 5, calendar.Spec{Unit: calendar.Month, Zone: "Europe/Berlin"})
	day := calendarLimit(t, 5, calendar.Spec{Unit: calendar.Day, Zone: "Europe/Berlin"})
	for range 5 {
		if r, err := l.Allow(context.Background(), key, month, 1); err != nil || !r.Allowed {
			t.Fatalf("month: %+v, %v", r, err)
		}
	}
	r, err := l.Allow(context.Background(), key, day, 1)
	if err != nil || !r.Allowed || r.Remaining != 4 {
		t.Fatalf("the first of the day after the month's 5: %+v, %v; want admitted with 4 remaining", r, err)
	}
}
