package topkeys

import "testing"

func TestTrackerCountsAnIntervalAndStartsAgain(t *testing.T) {
	tr := NewTracker()
	for range 5 {
		tr.Observe("a", "alice", true)
	}
	tr.Observe("b", "", false)
	tr.Observe("b", "", false)
	if p := tr.Peek(); p.Decisions != 7 || p.Refused.Total != 5 || p.Admitted.Total != 2 {
		t.Fatalf("Peek = %+v, want 7 decisions, 5 refused, 2 admitted", p)
	}
	iv := tr.Take()
	if iv.Decisions != 7 || len(iv.Refused.Entries) != 1 || iv.Refused.Entries[0] != (Entry{Key: "a", Label: "alice", Count: 5}) {
		t.Fatalf("Take = %+v", iv)
	}
	if iv := tr.Take(); iv.Decisions != 0 || iv.Refused.Total != 0 || iv.Admitted.Total != 0 {
		t.Fatalf("a Take after a Take = %+v, want nothing", iv)
	}
}
