package fleet

import "github.com/redline-dev/redline/internal/topkeys"

// InFlightFrom is what a replica publishes of an in-flight rule's slots: the counts, and the
// SummaryEntries keys holding the most.
func InFlightFrom(f topkeys.InFlight) *InFlightSummary {
	return &InFlightSummary{
		Held: uint64(max(f.Held, 0)), Peak: uint64(max(f.Peak, 0)), Queued: uint64(max(f.Queued, 0)),
		Top: ListFromSnapshot(f.Top),
	}
}

// QuotaFrom is what a replica publishes of a long window's heaviest users (topkeys.Usage's
// Take): the period's end and the SummaryEntries heaviest; nil when it saw none. A key not of
// the limiter's 32 hex digits is left out.
func QuotaFrom(end int64, top []topkeys.Entry) *QuotaSummary {
	q := &QuotaSummary{EndMS: max(end, 0)}
	for _, e := range top {
		if len(q.Top) == SummaryEntries {
			break
		}
		if validKey(e.Key) {
			q.Top = append(q.Top, TopEntry{Key: e.Key, Label: e.Label, Count: e.Count})
		}
	}
	if len(q.Top) == 0 {
		return nil
	}
	return q
}
