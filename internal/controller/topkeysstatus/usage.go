package topkeysstatus

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/redline-dev/redline/api/v1alpha1"
	"github.com/redline-dev/redline/internal/fleet"
	"github.com/redline-dev/redline/internal/topkeys"
)

// What the replicas report of in-flight slots and quota use is what their tenant can write:
// every count is added saturated and only compared, never used to size anything, and what is
// kept of a rule is v1alpha1.MaxTopKeys keys whatever the replicas sent (each replica's lists
// are SummaryEntries long at most, fleet.DecodeSummary).

// maxPeriodAhead bounds how far ahead a reported period may end: the longest calendar period
// (31 days, an hour more on a DST change), with a day to spare. A report beyond it is not a
// period's end, and is left out.
const maxPeriodAhead = 32 * 24 * time.Hour

// mergeInFlight sums the replicas' in-flight reports of a rule whose limit is n per key: the
// slots held, the peaks and the waiting requests, and the keys holding the most, merged as
// top lists are (a key's count over-estimates its slots by at most its error).
func mergeInFlight(n int64, flights []*fleet.InFlightSummary, values bool) *v1alpha1.InFlightStatus {
	st := &v1alpha1.InFlightStatus{Limit: n}
	var held, peak, queued uint64
	parts := make([]topkeys.Snapshot, 0, len(flights))
	for _, f := range flights {
		held, queued = addSat(held, f.Held), addSat(queued, f.Queued)
		peak = addSat(peak, max(f.Peak, f.Held))
		parts = append(parts, f.Top.Snapshot())
	}
	st.Held, st.Peak, st.Queued = toInt64(held), toInt64(peak), toInt64(queued)
	st.TopHolders = topKeys(topkeys.Merge(v1alpha1.MaxTopKeys, parts...), values)
	if len(st.TopHolders) > 0 {
		k := st.TopHolders[0]
		st.Use = fmt.Sprintf("%d of %d slots (%s)", k.Count, n, ratio(uint64(k.Count), uint64(max(n, 1))))
	}
	return st
}

// mergeQuota merges the replicas' reports of a long window's heaviest users: of a calendar
// period, those of the latest period not yet ended at now (a replica still reporting the
// previous one, or one whose clock is ahead, is left out); each key's count is the most a
// replica saw (the shared counter only grows in a period, and the replicas saw it at
// different times). Nil when no report is of the period.
func mergeQuota(lim v1alpha1.Limit, quotas []*fleet.QuotaSummary, values bool, now time.Time) *v1alpha1.QuotaStatus {
	var end int64
	if lim.Calendar != nil {
		lo, hi := now.UnixMilli(), now.Add(maxPeriodAhead).UnixMilli()
		for _, q := range quotas {
			if q.EndMS > lo && q.EndMS <= hi {
				end = max(end, q.EndMS)
			}
		}
		if end == 0 {
			return nil
		}
	}
	type user struct {
		used  uint64
		label string
	}
	byKey := map[string]*user{}
	for _, q := range quotas {
		if q.EndMS != end {
			continue
		}
		for _, e := range q.Top {
			u := byKey[e.Key]
			if u == nil {
				u = &user{}
				byKey[e.Key] = u
			}
			u.used = max(u.used, e.Count)
			if u.label == "" {
				u.label = e.Label
			}
		}
	}
	if len(byKey) == 0 {
		return nil
	}
	limit := uint64(max(lim.Requests, 1))
	st := &v1alpha1.QuotaStatus{Period: period(lim), Limit: lim.Requests}
	if end != 0 {
		t := metav1.NewTime(time.UnixMilli(end).UTC())
		st.ResetsAt = &t
	}
	for key, u := range byKey {
		qu := v1alpha1.QuotaUser{Key: key, Used: toInt64(u.used), Share: ratio(u.used, limit)}
		if values {
			qu.Value = topkeys.Label(u.label)
		}
		st.TopUsers = append(st.TopUsers, qu)
	}
	slices.SortFunc(st.TopUsers, func(a, b v1alpha1.QuotaUser) int {
		if c := cmp.Compare(b.Used, a.Used); c != 0 {
			return c
		}
		return strings.Compare(a.Key, b.Key)
	})
	st.TopUsers = st.TopUsers[:min(len(st.TopUsers), v1alpha1.MaxTopKeys)]
	top := st.TopUsers[0]
	st.Used = fmt.Sprintf("used %d of %d %s (%s)", top.Used, lim.Requests, periodPhrase(lim), top.Share)
	return st
}

// longWindow says whether a rule's limit counts a calendar period or a window over a day.
func longWindow(lim v1alpha1.Limit) bool {
	return lim.InFlight == nil && (lim.Calendar != nil || lim.Window.Duration > 24*time.Hour)
}

// period names a long window: "Month in Europe/Berlin", "72h0m0s rolling".
func period(lim v1alpha1.Limit) string {
	if c := lim.Calendar; c != nil {
		return fmt.Sprintf("%s in %s", c.Unit, cmp.Or(c.TimeZone, "UTC"))
	}
	return lim.Window.Duration.String() + " rolling"
}

// periodPhrase ends "used 812 of 1000 ...": "this month", "over the last 72h0m0s".
func periodPhrase(lim v1alpha1.Limit) string {
	if c := lim.Calendar; c != nil {
		if c.Unit == v1alpha1.CalendarDay {
			return "today"
		}
		return "this " + strings.ToLower(string(c.Unit))
	}
	return "over the last " + lim.Window.Duration.String()
}

// share is one key's use of its limit, compared as a fraction.
type share struct{ n, of uint64 }

// max is the fuller of s and o.
func (s share) max(o share) share {
	if o.of == 0 {
		return s
	}
	// As floats: a product of two counts could overflow, and a share is shown to a tenth of a
	// percent.
	if s.of == 0 || float64(o.n)/float64(o.of) > float64(s.n)/float64(s.of) {
		return o
	}
	return s
}

// most is the fuller of s and the busiest of keys under limit n.
func (s share) most(keys []v1alpha1.TopKey, n int64) share {
	if len(keys) == 0 || n <= 0 {
		return s
	}
	return s.max(share{uint64(max(keys[0].Count, 0)), uint64(n)})
}

// String is the share as a percentage, "" for none.
func (s share) String() string { return ratio(s.n, s.of) }
