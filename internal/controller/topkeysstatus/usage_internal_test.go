package topkeysstatus

import (
	"fmt"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/redline-dev/redline/api/v1alpha1"
	"github.com/redline-dev/redline/internal/fleet"
)

func hexKey(i int) string { return fmt.Sprintf("%032x", i) }

// What a tenant's sidecar reports is bounded and compared, never trusted: a forged period far
// ahead or of a past month is left out, counts saturate, a share never passes 100%.
func TestMergeQuotaTakesThePeriodInForceAndTheReplicasMost(t *testing.T) {
	now := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	end := time.Date(2026, 12, 31, 23, 0, 0, 0, time.UTC).UnixMilli() // midnight in Berlin
	lim := v1alpha1.Limit{Requests: 1000, Calendar: &v1alpha1.CalendarWindow{Unit: v1alpha1.CalendarMonth, TimeZone: "Europe/Berlin"}}
	entry := func(k int, n uint64) fleet.TopEntry {
		return fleet.TopEntry{Key: hexKey(k), Count: n, Label: fmt.Sprint("v", k)}
	}
	quotas := []*fleet.QuotaSummary{
		{EndMS: end, Top: []fleet.TopEntry{entry(1, 800), entry(2, 10)}},
		{EndMS: end, Top: []fleet.TopEntry{entry(1, 812), entry(3, 1<<63+5)}},
		{EndMS: now.Add(-time.Hour).UnixMilli(), Top: []fleet.TopEntry{entry(4, 999)}},        // a period that ended
		{EndMS: now.Add(40 * 24 * time.Hour).UnixMilli(), Top: []fleet.TopEntry{entry(5, 1)}}, // no period ends that far ahead
		{EndMS: 0, Top: []fleet.TopEntry{entry(6, 5)}},                                        // not of a calendar
	}
	st := mergeQuota(lim, quotas, false, now)
	if st == nil {
		t.Fatal("no quota merged")
	}
	if st.ResetsAt == nil || !st.ResetsAt.Time.Equal(time.UnixMilli(end)) || st.Period != "Month in Europe/Berlin" {
		t.Fatalf("period %q resets at %v", st.Period, st.ResetsAt)
	}
	want := []v1alpha1.QuotaUser{
		{Key: hexKey(3), Used: 1<<63 - 1, Share: "100.0%"},
		{Key: hexKey(1), Used: 812, Share: "81.2%"},
		{Key: hexKey(2), Used: 10, Share: "1.0%"},
	}
	if fmt.Sprint(st.TopUsers) != fmt.Sprint(want) {
		t.Fatalf("users %+v, want %+v", st.TopUsers, want)
	}
	if st.Used != fmt.Sprintf("used %d of 1000 this month (100.0%%)", int64(1<<63-1)) {
		t.Fatalf("used %q", st.Used)
	}
	// Only ended or forged periods: nothing to say.
	if st := mergeQuota(lim, quotas[2:4], false, now); st != nil {
		t.Fatalf("merged %+v from periods not in force", st)
	}
	// A rolling window takes the reports of no period.
	rolling := v1alpha1.Limit{Requests: 50, Window: metav1.Duration{Duration: 72 * time.Hour}}
	st = mergeQuota(rolling, quotas, true, now)
	if st == nil || st.ResetsAt != nil || len(st.TopUsers) != 1 || st.TopUsers[0].Value != "v6" || st.Used != "used 5 of 50 over the last 72h0m0s (10.0%)" {
		t.Fatalf("rolling: %+v", st)
	}
}

func TestMergeInFlightSumsTheReplicasSaturated(t *testing.T) {
	f := func(held, peak uint64, keys ...uint64) *fleet.InFlightSummary {
		s := &fleet.InFlightSummary{Held: held, Peak: peak}
		s.Top.Total = held
		for i, n := range keys {
			s.Top.Top = append(s.Top.Top, fleet.TopEntry{Key: hexKey(i), Count: n})
		}
		return s
	}
	st := mergeInFlight(8, []*fleet.InFlightSummary{f(3, 5, 2, 1), f(4, 0, 4)}, false)
	if st.Held != 7 || st.Peak != 9 || st.Use != "6 of 8 slots (75.0%)" || st.TopHolders[0].Count != 6 {
		t.Fatalf("merged %+v", st)
	}
	st = mergeInFlight(8, []*fleet.InFlightSummary{f(1<<63, 1<<63, 1<<63), f(1<<63, 0, 1<<63)}, false)
	if st.Held != 1<<63-1 || st.Peak != 1<<63-1 || st.Use != fmt.Sprintf("%d of 8 slots (100.0%%)", int64(1<<63-1)) {
		t.Fatalf("saturated %+v", st)
	}
}
