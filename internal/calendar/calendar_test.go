package calendar

import (
	"testing"
	"time"
)

func mustNew(t *testing.T, s Spec) *Calendar {
	t.Helper()
	c, err := New(s)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestPeriods walks the periods users bill by: DST days of 23 and 25 hours, weeks from a
// chosen weekday, months of 28 to 31 days, a leap day and billing days past a month's end.
func TestPeriods(t *testing.T) {
	cases := []struct {
		name       string
		spec       Spec
		at         string // RFC 3339
		start, end string // RFC 3339, in the zone
		hours      float64
	}{
		{"UTC day", Spec{Unit: Day}, "2028-02-29T23:59:59Z", "2028-02-29T00:00:00Z", "2028-03-01T00:00:00Z", 24},
		{"Berlin spring day is 23h", Spec{Unit: Day, Zone: "Europe/Berlin"}, "2028-03-26T12:00:00+02:00", "2028-03-26T00:00:00+01:00", "2028-03-27T00:00:00+02:00", 23},
		{"Berlin autumn day is 25h", Spec{Unit: Day, Zone: "Europe/Berlin"}, "2028-10-29T02:30:00+01:00", "2028-10-29T00:00:00+02:00", "2028-10-30T00:00:00+01:00", 25},
		{"New York spring day", Spec{Unit: Day, Zone: "America/New_York"}, "2028-03-12T00:00:00-05:00", "2028-03-12T00:00:00-05:00", "2028-03-13T00:00:00-04:00", 23},
		{"Shanghai day starts at 16:00 UTC", Spec{Unit: Day, Zone: "Asia/Shanghai"}, "2028-01-01T16:00:00Z", "2028-01-02T00:00:00+08:00", "2028-01-03T00:00:00+08:00", 24},
		{"Santiago day starts at 01:00 after a skipped midnight", Spec{Unit: Day, Zone: "America/Santiago"}, "2028-09-03T12:00:00-03:00", "2028-09-03T01:00:00-03:00", "2028-09-04T00:00:00-03:00", 23},
		{"week from Monday", Spec{Unit: Week, FirstWeekday: time.Monday}, "2028-03-05T10:00:00Z", "2028-02-28T00:00:00Z", "2028-03-06T00:00:00Z", 168},
		{"week from Sunday over spring DST", Spec{Unit: Week, Zone: "America/New_York", FirstWeekday: time.Sunday}, "2028-03-12T12:00:00-04:00", "2028-03-12T00:00:00-05:00", "2028-03-19T00:00:00-04:00", 167},
		{"February of a leap year", Spec{Unit: Month}, "2028-02-29T12:00:00Z", "2028-02-01T00:00:00Z", "2028-03-01T00:00:00Z", 29 * 24},
		{"Berlin March has 743h", Spec{Unit: Month, Zone: "Europe/Berlin"}, "2028-03-31T23:59:59+02:00", "2028-03-01T00:00:00+01:00", "2028-04-01T00:00:00+02:00", 31*24 - 1},
		{"billing day 15, before it", Spec{Unit: Month, BillingDay: 15}, "2028-03-14T23:00:00Z", "2028-02-15T00:00:00Z", "2028-03-15T00:00:00Z", 29 * 24},
		{"billing day 31 clamps to Feb 29", Spec{Unit: Month, BillingDay: 31}, "2028-03-01T00:00:00Z", "2028-02-29T00:00:00Z", "2028-03-31T00:00:00Z", 31 * 24},
		{"billing day 31 in April", Spec{Unit: Month, BillingDay: 31}, "2028-04-30T00:00:00Z", "2028-04-30T00:00:00Z", "2028-05-31T00:00:00Z", 31 * 24},
		{"billing day 30 before Feb's clamp", Spec{Unit: Month, BillingDay: 30}, "2027-02-27T00:00:00Z", "2027-01-30T00:00:00Z", "2027-02-28T00:00:00Z", 29 * 24},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := mustNew(t, tc.spec)
			at, _ := time.Parse(time.RFC3339, tc.at)
			s, e := c.Period(at)
			ws, _ := time.Parse(time.RFC3339, tc.start)
			we, _ := time.Parse(time.RFC3339, tc.end)
			if !s.Equal(ws) || !e.Equal(we) {
				t.Fatalf("Period(%s) = [%s, %s), want [%s, %s)", tc.at, s, e, ws, we)
			}
			if got := e.Sub(s).Hours(); got != tc.hours {
				t.Fatalf("period of %vh, want %vh", got, tc.hours)
			}
			if e.Sub(s) > c.MaxLength() {
				t.Fatalf("period %s longer than MaxLength %s", e.Sub(s), c.MaxLength())
			}
		})
	}
}

// TestPeriodsTile checks over two years in several zones that periods follow each other
// without gap or overlap and every instant lies in the period Period gives: what replicas
// agree on is a partition of time.
func TestPeriodsTile(t *testing.T) {
	for _, z := range []string{"UTC", "Europe/Berlin", "America/Santiago", "Australia/Lord_Howe", "Asia/Kolkata"} {
		for _, s := range []Spec{{Unit: Day, Zone: z}, {Unit: Week, Zone: z, FirstWeekday: time.Wednesday}, {Unit: Month, Zone: z, BillingDay: 31}} {
			c := mustNew(t, s)
			at := time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC)
			_, end := c.Period(at)
			for end.Before(time.Date(2029, 1, 1, 0, 0, 0, 0, time.UTC)) {
				s2, e2 := c.Period(end)
				if !s2.Equal(end) || !e2.After(s2) || e2.Sub(s2) > c.MaxLength() {
					t.Fatalf("%+v: after a period ending %s comes [%s, %s)", s, end, s2, e2)
				}
				if s3, _ := c.Period(e2.Add(-time.Millisecond)); !s3.Equal(s2) {
					t.Fatalf("%+v: the last ms of [%s, %s) is in the period from %s", s, s2, e2, s3)
				}
				end = e2
			}
		}
	}
}

func TestNewRefuses(t *testing.T) {
	for _, s := range []Spec{
		{Unit: "Year"},
		{Unit: Day, Zone: "Mars/Olympus"},
		{Unit: Day, Zone: "Local"},
		{Unit: Day, BillingDay: 3},
		{Unit: Month, BillingDay: 32},
		{Unit: Week, FirstWeekday: 7},
	} {
		if _, err := New(s); err == nil {
			t.Errorf("New(%+v) accepted", s)
		}
	}
}
