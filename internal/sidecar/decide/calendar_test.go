package decide_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redline-dev/redline/internal/calendar"
	"github.com/redline-dev/redline/internal/limiter"
	"github.com/redline-dev/redline/internal/policydoc"
	"github.com/redline-dev/redline/internal/redisconn"
	"github.com/redline-dev/redline/internal/sidecar/decide"
	"github.com/redline-dev/redline/internal/sidecar/ruleset"
	"github.com/redline-dev/redline/internal/testutil/redistest"
	"github.com/redline-dev/redline/internal/testutil/sidecartest"
)

// calendarBudgetSet is a token budget of 1,000 a day in Berlin, and beside it a plain rule of
// calls with a candidate of 3 calls a month in Berlin, on the same requests.
func calendarBudgetSet(t *testing.T) *ruleset.Set {
	t.Helper()
	longest := func(spec calendar.Spec) int64 {
		c, err := calendar.New(spec)
		if err != nil {
			t.Fatal(err)
		}
		return c.MaxLength().Milliseconds()
	}
	day := &policydoc.Calendar{Unit: "Day", Zone: "Europe/Berlin"}
	month := &policydoc.Calendar{Unit: "Month", Zone: "Europe/Berlin"}
	tokens := sidecartest.BudgetRule("tokens", "x-key", "FixedWindow", 1000, 100, 10, policydoc.OnErrorUsed)
	tokens.Calendar, tokens.WindowMS = day, longest(day.Spec())
	calls := sidecartest.WindowRule("calls", "x-key", 1000)
	calls.Candidate = &policydoc.Candidate{Algorithm: "FixedWindow", Requests: 3, WindowMS: longest(month.Spec()), Calendar: month}
	return buildSet(t, "tok", []policydoc.Policy{{Name: "llm", Generation: 1, FailureMode: "Closed",
		Rules: []policydoc.Rule{tokens, calls}}})
}

// TestCalendarTokenBudgetAndCandidate: on Berlin's 23-hour day (DST began that night), a token
// budget per day holds and settles in the day, and its RateLimit fields give the day's true
// length and end; a candidate of calls per month would refuse the fourth call, saying when
// the month ends. Redis's clock is on that day; the sidecar's is not.
func TestCalendarTokenBudgetAndCandidate(t *testing.T) {
	srv, err := redistest.StartAt(time.Date(2028, 3, 26, 21, 0, 0, 0, time.FixedZone("CEST", 2*3600)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	c, err := redisconn.NewClient(srv.URL(), redisconn.Options{ReadTimeout: 5 * time.Second, WriteTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	lim, err := limiter.New(c, limiter.Options{LeaseHorizon: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(lim.Close)
	set := calendarBudgetSet(t)
	e := &decide.Engine{Limiter: lim}
	ctx := context.Background()
	dayEnd := time.Date(2028, 3, 27, 0, 0, 0, 0, time.FixedZone("CEST", 2*3600))
	monthEnd := time.Date(2028, 4, 1, 0, 0, 0, 0, time.FixedZone("CEST", 2*3600))
	var settled int64
	for i := range 4 {
		before, err := c.Time(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		d, hs, err := reserveReq(ctx, e, set, budgetReq("k"), decide.Need{Sized: true, Prompt: 50, Output: 200})
		if err != nil || !d.Allowed {
			t.Fatalf("request %d: %+v, %v", i, d, err)
		}
		if units, _ := hs.Afford(); units != 250 {
			t.Fatalf("request %d holds %d, want 250", i, units)
		}
		f := d.Fields()
		if !strings.Contains(f.Policy, `"llm/tokens";q=1000;w=82800`) {
			t.Errorf("request %d: RateLimit-Policy %q, want the tokens' 23-hour day", i, f.Policy)
		}
		for _, o := range d.Outcomes {
			if o.Rule.Name != "tokens" {
				continue
			}
			if want := 1000 - settled - 250; o.Result.Remaining != want {
				t.Errorf("request %d: %d tokens remaining, want %d", i, o.Result.Remaining, want)
			}
			if got, most := o.Result.ResetAfter, dayEnd.Sub(before)+time.Millisecond; got > most || got < most-time.Minute {
				t.Errorf("request %d: the day resets after %s, want about %s", i, got, most)
			}
		}
		cands := d.WaitCandidates()
		if len(cands) != 1 || cands[0].Result.OverLimit != (i == 3) {
			t.Fatalf("request %d: candidates %+v, want the fourth call of the month over", i, cands)
		}
		if got, most := cands[0].Result.ResetAfter, monthEnd.Sub(before)+time.Millisecond; got > most || got < most-time.Minute {
			t.Errorf("request %d: the candidate's month resets after %s, want about %s", i, got, most)
		}
		s, err := hs.Settle(ctx, 100, true, false)
		if err != nil || s.Returned != 150 {
			t.Fatalf("request %d: settled %+v, %v; want 150 back", i, s, err)
		}
		settled += 100
	}
}
