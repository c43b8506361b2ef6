package metrics

import (
	"errors"
	"fmt"
	"io"
	"os"
	"testing"

	. "github.com/onsi/gomega"
	"github.com/redis/go-redis/v9"

	"github.com/redline-dev/redline/internal/limiter"
)

// What redis_errors_total's kinds mean to an operator: a refused connection is told apart from
// a full pool, a slow Redis, a dead one and an error reply.
func TestRedisErrorKind(t *testing.T) {
	g := NewWithT(t)
	for err, want := range map[error]string{
		nil:                  "",
		redis.Nil:            "",
		redis.ErrPoolTimeout: RedisErrPoolTimeout,
		fmt.Errorf("running script: %w", redis.ErrPoolTimeout): RedisErrPoolTimeout,
		errors.New("ERR max number of clients reached"):        RedisErrMaxClients,
		os.ErrDeadlineExceeded:                                 RedisErrTimeout,
		io.EOF:                                                 RedisErrNetwork,
		redis.ErrClosed:                                        RedisErrNetwork,
	} {
		g.Expect(RedisErrorKind(err)).To(Equal(want), "%v", err)
	}
}

// Which shard's breaker is open shows by shard, every known shard at 0 or 1, and the overall
// gauge says some shard's is.
func TestShardBreakers(t *testing.T) {
	g := NewWithT(t)
	stats := limiter.Stats{BreakerOpen: true, Shards: []limiter.ShardState{
		{Name: "10.0.0.1:6379", Open: true}, {Name: "10.0.0.2:6379"}, {Name: "10.0.0.3:6379"},
	}}
	m := New(func() limiter.Stats { return stats }, nil)
	g.Expect(gauges(t, m, "redline_sidecar_breaker_open")).To(Equal(map[string]float64{"": 1}))
	g.Expect(gauges(t, m, "redline_sidecar_shard_breaker_open")).To(Equal(map[string]float64{
		"10.0.0.1:6379": 1, "10.0.0.2:6379": 0, "10.0.0.3:6379": 0,
	}))

	// A failover replaced the first master: its series goes with its breaker.
	stats = limiter.Stats{Shards: []limiter.ShardState{{Name: "10.0.0.2:6379"}, {Name: "10.0.0.3:6379"}, {Name: "10.0.0.4:6379"}}}
	g.Expect(gauges(t, m, "redline_sidecar_breaker_open")).To(Equal(map[string]float64{"": 0}))
	g.Expect(gauges(t, m, "redline_sidecar_shard_breaker_open")).To(Equal(map[string]float64{
		"10.0.0.2:6379": 0, "10.0.0.3:6379": 0, "10.0.0.4:6379": 0,
	}))

	// Without a cluster: one shard.
	stats = limiter.Stats{Shards: []limiter.ShardState{{Name: "all"}}}
	g.Expect(gauges(t, m, "redline_sidecar_shard_breaker_open")).To(Equal(map[string]float64{"all": 0}))
}

// gauges gathers the gauge name from m, by the value of its shard label ("" without one).
func gauges(t *testing.T, m *Metrics, name string) map[string]float64 {
	t.Helper()
	mfs, err := m.Registry.Gather()
	if err != nil {
		t.Fatalf("gathering: %v", err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, mt := range mf.GetMetric() {
			shard := ""
			for _, lp := range mt.GetLabel() {
				if lp.GetName() == labelShard {
					shard = lp.GetValue()
				}
			}
			out[shard] = mt.GetGauge().GetValue()
		}
	}
	return out
}
