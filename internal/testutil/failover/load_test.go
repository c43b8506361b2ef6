package failover

import "testing"

// DegradedShare weighs only the slices from its start on, and says how long they lasted: a
// failure mode that decides to the end reads as most of the decisions, one stray failure-mode
// decision in a stretch of Redis decisions as few, and a stretch the demand never reached as
// nothing to weigh.
func TestDegradedShare(t *testing.T) {
	slices := func(counts ...SliceCount) *Cell { return &Cell{AfterKill: [][]SliceCount{counts}} }
	stuck := slices(SliceCount{10, 10}, SliceCount{10, 10}, SliceCount{10, 9}, SliceCount{10, 10})
	if share, over := stuck.DegradedShare(0, 2*Slice); share < 0.9 || over != 2*Slice {
		t.Errorf("a failure mode deciding to the end: share %.2f over %s, want at least 0.9 over %s", share, over, 2*Slice)
	}
	recovered := slices(SliceCount{10, 10}, SliceCount{10, 10}, SliceCount{10, 0}, SliceCount{10, 1}, SliceCount{0, 0})
	if share, over := recovered.DegradedShare(0, 2*Slice); share != 0.05 || over != 2*Slice {
		t.Errorf("one stray failure-mode decision after the switch: share %.2f over %s, want 0.05 over %s", share, over, 2*Slice)
	}
	if share, over := recovered.DegradedShare(0, 10*Slice); share != 0 || over != 0 {
		t.Errorf("a stretch after the demand ended: share %.2f over %s, want nothing", share, over)
	}
	if share, over := recovered.DegradedShare(0, 0); share != 0.525 || over != 4*Slice {
		t.Errorf("from the kill: share %.2f over %s, want 0.525 over %s", share, over, 4*Slice)
	}
}
