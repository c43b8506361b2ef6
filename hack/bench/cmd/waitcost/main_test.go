package main

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redline-dev/redline/internal/limiter/scripts"
	"github.com/redline-dev/redline/internal/testutil/redistest"

	"github.com/redline-dev/redline/hack/bench/internal/machine"
)

// TestWaitSeesTheReplicaUntilItStalls checks what the cells rest on: a grant followed by WAIT
// on the same connection is acknowledged by a healthy replica, and not by a stopped one, and
// the grant is counted either way.
func TestWaitSeesTheReplicaUntilItStalls(t *testing.T) {
	master, err := redistest.Start()
	if err != nil {
		t.Fatalf("starting the master: %v", err)
	}
	defer func() { _ = master.Close() }()
	replica, err := redistest.Start("--replicaof", "127.0.0.1", strconv.Itoa(master.Port))
	if err != nil {
		t.Fatalf("starting the replica: %v", err)
	}
	defer func() { _ = replica.Resume(); _ = replica.Close() }()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := redis.NewClient(&redis.Options{Addr: master.Addr()})
	defer func() { _ = c.Close() }()
	if err := waitInSync(ctx, c); err != nil {
		t.Fatal(err)
	}
	s, _ := scripts.For("FixedWindow")
	if err := c.ScriptLoad(ctx, s.Source).Err(); err != nil {
		t.Fatal(err)
	}
	g := &granter{sha: s.SHA}
	healthy := mode{name: "wait", wait: 500 * time.Millisecond}
	if unacked, err := g.decide(ctx, c, healthy, 7); err != nil || unacked {
		t.Fatalf("healthy replica: unacked %v, err %v", unacked, err)
	}
	if err := replica.Pause(); err != nil {
		t.Fatal(err)
	}
	if unacked, err := g.decide(ctx, c, mode{name: "stalled", wait: 10 * time.Millisecond}, 7); err != nil || !unacked {
		t.Fatalf("stopped replica: unacked %v, err %v", unacked, err)
	}
	if got := g.known[7].Load(); got != 2 {
		t.Errorf("known share of key 7 after two grants: %d, want 2", got)
	}
	cpu, err := machine.RedisCPU(ctx, c)
	if err != nil || cpu <= 0 {
		t.Errorf("masterCPU: %v, %v", cpu, err)
	}
}

func TestSummarizeTakesMedians(t *testing.T) {
	rs := []result{{perSec: 10, p50: 3, cpuPerOp: 5000, ops: 1, unacked: 1}, {perSec: 30, p50: 1, cpuPerOp: 1000, ops: 2}, {perSec: 20, p50: 2, cpuPerOp: 3000, ops: 3, unacked: 2}}
	s := summarize(rs)
	if s.perSec != 20 || s.p50 != 2 || s.cpuUs != 3 || s.ops != 6 || s.unacked != 3 || s.runs != 3 {
		t.Errorf("summarize = %+v", s)
	}
}
