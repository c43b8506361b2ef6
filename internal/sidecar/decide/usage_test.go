package decide_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/redline-dev/redline/internal/calendar"
	"github.com/redline-dev/redline/internal/fleet"
	"github.com/redline-dev/redline/internal/keyscheme"
	"github.com/redline-dev/redline/internal/limiter"
	"github.com/redline-dev/redline/internal/policydoc"
	"github.com/redline-dev/redline/internal/redisconn"
	"github.com/redline-dev/redline/internal/sidecar/decide"
	"github.com/redline-dev/redline/internal/sidecar/ruleset"
	"github.com/redline-dev/redline/internal/testutil/redistest"
)

// usageSet is one policy "api" with an in-flight rule "slots" (4 per X-Key, values reported)
// and a monthly quota "monthly" (100 per X-Key, calendar month in Berlin).
func usageSet(t *testing.T) *ruleset.Set {
	t.Helper()
	key := []policydoc.KeyPart{{Header: "x-key"}}
	return buildSet(t, "ns", []policydoc.Policy{{Name: "api", Generation: 1, FailureMode: "Closed", Rules: []policydoc.Rule{
		{Name: "slots", Key: key, InFlight: 4, Mode: "Enforce", ReportValues: true},
		{Name: "monthly", Key: key, Algorithm: "FixedWindow", Requests: 100, WindowMS: 2685600000, Mode: "Enforce",
			Calendar: &policydoc.Calendar{Unit: "Month", Zone: "Europe/Berlin"}, ReportValues: true},
	}}})
}

func rule(t *testing.T, s fleet.PolicySummary, name string) fleet.RuleSummary {
	t.Helper()
	for _, r := range s.Rules {
		if r.Rule == name {
			return r
		}
	}
	t.Fatalf("no rule %s in summary %+v", name, s)
	return fleet.RuleSummary{}
}

func summary(t *testing.T, set *ruleset.Set) fleet.PolicySummary {
	t.Helper()
	out := set.Summaries(time.Second)
	if len(out) != 1 || out[0] == nil {
		t.Fatalf("summaries %q", out)
	}
	s, err := fleet.DecodeSummary(out[0])
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// usageEngine is an engine on a real Redis, without leases (each decision asks Redis).
func usageEngine(t *testing.T) *decide.Engine {
	t.Helper()
	srv, err := redistest.Start()
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
	return &decide.Engine{Limiter: lim}
}

func keyRequest(key string) *decide.Request {
	return &decide.Request{Method: "GET", Path: "/", Header: http.Header{"X-Key": {key}}, RemoteAddr: "10.0.0.1:1"}
}

// TestSummariesSayWhoHoldsSlots: on a real Redis, the heartbeat's summary says how many slots
// the sidecar holds now and which keys hold them, and the most held at once since the last
// summary; what goes back shows in the next summary.
func TestSummariesSayWhoHoldsSlots(t *testing.T) {
	ctx := context.Background()
	set, e, req := usageSet(t), usageEngine(t), keyRequest
	hash := func(key string) string { return keyscheme.Hash(keyscheme.Key("ns", "api", "slots", key)) }

	// Slots: three of "alice", one of "bob"; alice's fifth is refused (4 per key).
	var held []*decide.Slots
	for _, k := range []string{"alice", "alice", "alice", "bob", "alice"} {
		s := acquireReq(ctx, e, set, req(k))
		if s.Refused != nil {
			t.Fatalf("slot of %s refused", k)
		}
		held = append(held, s)
	}
	if s := acquireReq(ctx, e, set, req("alice")); s.Refused == nil {
		t.Fatal("a fifth slot of alice was taken: the rule allows 4")
	}
	s := summary(t, set)
	f := rule(t, s, "slots").InFlight
	if f == nil || f.Held != 5 || f.Peak != 5 || len(f.Top.Top) != 2 {
		t.Fatalf("in flight %+v, want 5 held, peak 5, two keys", f)
	}
	if top := f.Top.Top[0]; top.Key != hash("alice") || top.Count != 4 || top.Label != "alice" {
		t.Fatalf("top holder %+v, want alice with 4", top)
	}
	if r := rule(t, s, "slots"); r.Decisions != 6 || r.Refused.Total != 1 {
		t.Fatalf("slot decisions %d, refused %d: want 6 and 1", r.Decisions, r.Refused.Total)
	}
	// Two of alice's end: the next summary holds 3, its peak starts from what was held.
	held[0].Release(ctx)
	held[1].Release(ctx)
	f = rule(t, summary(t, set), "slots").InFlight
	if f == nil || f.Held != 3 || f.Peak != 5 || f.Top.Top[0].Count != 2 {
		t.Fatalf("after two releases: %+v, want 3 held, peak 5 (the interval's), alice 2", f)
	}
	f = rule(t, summary(t, set), "slots").InFlight
	if f.Held != 3 || f.Peak != 3 {
		t.Fatalf("next interval: %+v, want 3 held, peak 3", f)
	}
	for _, h := range held[2:] {
		h.Release(ctx)
	}
	// Every slot back: the slots are none.
	if f := rule(t, summary(t, set), "slots").InFlight; f.Held != 0 || len(f.Top.Top) != 0 {
		t.Fatalf("all released: %+v", f)
	}
}

// TestSummariesSayHowMuchOfTheMonthKeysUsed: for a calendar month, the summary says how much of
// the month each key used as Redis counted it, with the month's end, in every summary of the
// month (it is a state, not an interval's count).
func TestSummariesSayHowMuchOfTheMonthKeysUsed(t *testing.T) {
	ctx := context.Background()
	set, e := usageSet(t), usageEngine(t)
	// The month: alice 7 requests, bob 2.
	for _, k := range []string{"alice", "alice", "alice", "alice", "alice", "alice", "alice", "bob", "bob"} {
		if d := decideReq(ctx, e, set, keyRequest(k)); !d.Allowed {
			t.Fatalf("request of %s refused", k)
		}
	}
	s := summary(t, set)
	q := rule(t, s, "monthly").Quota
	cal, err := calendar.New(calendar.Spec{Unit: calendar.Month, Zone: "Europe/Berlin"})
	if err != nil {
		t.Fatal(err)
	}
	_, end := cal.PeriodMS(time.Now().UnixMilli())
	if q == nil || len(q.Top) != 2 || q.Top[0].Count != 7 || q.Top[0].Label != "alice" || q.Top[1].Count != 2 {
		t.Fatalf("quota %+v, want alice 7 and bob 2", q)
	}
	if q.EndMS != end && time.Until(time.UnixMilli(end)) > time.Minute {
		t.Fatalf("quota period ends %v, want %v", time.UnixMilli(q.EndMS), time.UnixMilli(end))
	}

	for range 2 {
		if q := rule(t, summary(t, set), "monthly").Quota; q == nil || q.Top[0].Count != 7 {
			t.Fatalf("the month's use went with the interval: %+v", q)
		}
	}
}
