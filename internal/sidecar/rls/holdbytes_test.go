package rls_test

import (
	"fmt"
	"runtime"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/redline-dev/redline/internal/limiter"
	"github.com/redline-dev/redline/internal/policydoc"
	"github.com/redline-dev/redline/internal/redisconn"
	"github.com/redline-dev/redline/internal/sidecar/decide"
	"github.com/redline-dev/redline/internal/sidecar/rls"
	"github.com/redline-dev/redline/internal/testutil/redistest"
	"github.com/redline-dev/redline/internal/testutil/sidecartest"
)

// replicaLimiter is a limiter on a redis-server of its own with a replica id, as the sidecar
// runs it: its shares keep a table of the open holds.
func replicaLimiter(t *testing.T) *limiter.Limiter {
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
	lim, err := limiter.New(c, limiter.Options{ReplicaID: limiter.NewReplicaID()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(lim.Close)
	return lim
}

// heapBytes is the live heap after a collection.
func heapBytes() int64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapAlloc)
}

// The size a hold draws from the memory budget covers what it keeps: streams started on as
// many keys, each kept open in the registry and in the limiter's table of open holds, grow
// the live heap by less than decide.HoldBytes each.
func TestHoldBytesCoversAHold(t *testing.T) {
	rule := sidecartest.BudgetRule("tokens", "x-user", "FixedWindow", 1_000_000, 100, 1, policydoc.OnErrorUsed)
	rule.WindowMS = time.Hour.Milliseconds()
	doc := sidecartest.DocumentRules("ns", "llm", "web", rule)
	lim := replicaLimiter(t)
	s := &rls.Server{Engine: &decide.Engine{Limiter: lim}, Store: sidecartest.StoreOf(t, doc),
		Holds: &decide.Registry{}}
	// Warm up: the first streams build the limiter's pools and tables.
	for i := range 200 {
		if stream(t, s, "tokens", fmt.Sprintf("warm-%d", i), 0).OverallCode != rlsv3.RateLimitResponse_OK {
			t.Fatal("a warm-up stream was refused")
		}
	}
	const n = 5000
	before := heapBytes()
	for i := range n {
		if stream(t, s, "tokens", fmt.Sprintf("user-%d", i), 0).OverallCode != rlsv3.RateLimitResponse_OK {
			t.Fatalf("stream %d refused", i)
		}
	}
	per := (heapBytes() - before) / n
	t.Logf("%d bytes of live heap per open hold and its key", per)
	if s.Holds.Open() != n+200 {
		t.Fatalf("%d holds open, want %d", s.Holds.Open(), n+200)
	}
	if st := lim.Stats(); st.HoldsOpen < n {
		t.Fatalf("the limiter's table keeps %d open holds, want at least %d", st.HoldsOpen, n)
	}
	if per > decide.HoldBytes {
		t.Errorf("an open hold keeps %d bytes, more than the %d it draws", per, decide.HoldBytes)
	}
}
