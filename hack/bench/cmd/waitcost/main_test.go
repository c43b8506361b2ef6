package main

import (
	"testing"
)

func TestSummarizeTakesMedians(t *testing.T) {
	rs := []result{{perSec: 10, p50: 3, cpuPerOp: 5000, procPerOp: 1000, ops: 1, unacked: 1}, {perSec: 30, p50: 1, cpuPerOp: 1000, procPerOp: 3000, ops: 2}, {perSec: 20, p50: 2, cpuPerOp: 3000, procPerOp: 2000, ops: 3, unacked: 2}}
	s := summarize(rs)
	if s.perSec != 20 || s.p50 != 2 || s.cpuUs != 3 || s.procUs != 2 || s.ops != 6 || s.unacked != 3 || s.runs != 3 {
		t.Errorf("summarize = %+v", s)
	}
}
