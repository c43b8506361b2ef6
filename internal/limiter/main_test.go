package limiter_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redline-dev/redline/internal/keyscheme"
	"github.com/redline-dev/redline/internal/limiter"
	"github.com/redline-dev/redline/internal/redisconn"
	"github.com/redline-dev/redline/internal/testutil/redistest"
	"github.com/redline-dev/redline/internal/testutil/redistest/redisclient"
)

// shared is the redis-server most tests use. Tests that kill Redis start their own.
var shared *redistest.Server

type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}

func TestMain(m *testing.M) {
	redis.SetLogger(quietLogger{}) // tests kill Redis on purpose; dial errors are expected
	os.Exit(run(m))
}

func run(m *testing.M) int {
	if _, err := redistest.Binary(); err != nil {
		fmt.Fprintln(os.Stderr, "FAIL: the limiter tests need a real redis-server:", err)
		return 1
	}
	var err error
	if shared, err = redistest.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "FAIL: starting redis-server:", err)
		return 1
	}
	defer shared.Close()
	code := m.Run()
	if code == 0 {
		if bad := keysWithoutTTL(shared.URL()); len(bad) > 0 {
			fmt.Fprintf(os.Stderr, "FAIL: %d keys without a TTL after the suite: %v\n", len(bad), bad)
			return 1
		}
	}
	return code
}

// keysWithoutTTL scans every key and returns those that would live forever.
func keysWithoutTTL(url string) []string {
	c, err := redisconn.NewClient(url, testClientOptions)
	if err != nil {
		return []string{err.Error()}
	}
	defer c.Close()
	ctx := context.Background()
	var bad []string
	iter := c.Scan(ctx, 0, "*", 1000).Iterator()
	for iter.Next(ctx) {
		if c.PTTL(ctx, iter.Val()).Val() == -1 { // -1: no TTL; -2: expired meanwhile
			bad = append(bad, iter.Val())
		}
	}
	if err := iter.Err(); err != nil {
		bad = append(bad, err.Error())
	}
	return bad
}

// testClientOptions are generous: the test machine is shared and slow, and a timeout would turn
// an exactness test into a failure-mode test.
var testClientOptions = redisconn.Options{
	PoolSize:     8,
	PoolTimeout:  10 * time.Second,
	DialTimeout:  5 * time.Second,
	ReadTimeout:  10 * time.Second,
	WriteTimeout: 10 * time.Second,
}

func newClient(t testing.TB, url string) redis.UniversalClient {
	t.Helper()
	return redisclient.New(t, url, testClientOptions)
}

// newLimiter returns a limiter closed with the test. Leases are off unless o sets a horizon:
// these suites pin down the algorithms' per-request decisions in order, which leases (one
// replica holding units another is refused) trade for fewer round trips; lease_test.go
// holds leases to their own invariants.
func newLimiter(t testing.TB, c redis.UniversalClient, o limiter.TestOptions) *limiter.Limiter {
	t.Helper()
	if o.LeaseHorizon == 0 {
		o.LeaseHorizon = -1
	}
	l, err := limiter.NewWith(c, o)
	if err != nil {
		t.Fatalf("creating limiter: %v", err)
	}
	t.Cleanup(l.Close)
	return l
}

var keySeq atomic.Int64

// uniqueKey returns a key no other test uses.
func uniqueKey(t testing.TB) string {
	name := strings.NewReplacer("/", "_", " ", "_").Replace(t.Name())
	return keyscheme.Key("test", name, "rule", fmt.Sprint(keySeq.Add(1), time.Now().UnixNano()))
}

// evalCounter counts EVALSHA commands a client sends, in pipelines or alone.
type evalCounter struct{ n atomic.Int64 }

func (h *evalCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *evalCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() == "evalsha" {
			h.n.Add(1)
		}
		return next(ctx, cmd)
	}
}

func (h *evalCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, c := range cmds {
			if c.Name() == "evalsha" {
				h.n.Add(1)
			}
		}
		return next(ctx, cmds)
	}
}

// allAlgorithms runs fn as a subtest per algorithm.
func allAlgorithms(t *testing.T, fn func(t *testing.T, alg limiter.Algorithm)) {
	for _, alg := range limiter.Algorithms {
		t.Run(string(alg), func(t *testing.T) { fn(t, alg) })
	}
}
