package main

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redline-dev/redline/internal/redisconn"
	"github.com/redline-dev/redline/internal/sidecar/contract"
	"github.com/redline-dev/redline/internal/testutil/sidecarproc"
)

// Conns is the sidecars' Redis connections, at rest and under load: one sidecar's from its own
// metrics (sockets open), the fleet's from Redis (CLIENT LIST, by the sidecars' client name).
// Under load is the largest of samples 100ms apart, so a shorter peak can be missed.
type Conns struct {
	Pool int `json:"pool"`
	// First sidecar: after start, during the face cells (64 clients at most), right after them.
	FirstAtRest     float64 `json:"firstAtRest"`
	FirstUnderLoad  float64 `json:"firstUnderLoadPeak"`
	FirstAfterLoad  float64 `json:"firstAfterLoad"`
	Replicas        int     `json:"replicas"`
	FleetAtRest     int     `json:"fleetAtRest"`
	FleetUnderLoad  int     `json:"fleetUnderLoadPeak"`
	FleetAfterLoad  int     `json:"fleetAfterLoad"`
	IdleTimeoutSecs float64 `json:"idleTimeoutSeconds"`
}

// sidecarConns reads a sidecar's open Redis sockets and its pool.
func sidecarConns(ctx context.Context, s *Sidecar) (open, pool float64, err error) {
	m, err := sidecarproc.Scrape(ctx, "http://"+s.Admin+"/metrics", "redline_sidecar_redis_connections", "redline_sidecar_redis_pool_max_connections")
	if err != nil {
		return 0, 0, err
	}
	return m["redline_sidecar_redis_connections"], m["redline_sidecar_redis_pool_max_connections"], nil
}

// fleetConns counts the connections Redis holds for sidecars.
type fleetConns struct{ c redis.UniversalClient }

func newFleetConns(url string) (*fleetConns, error) {
	c, err := redisconn.NewClient(url, redisconn.Options{PoolSize: 1, ReadTimeout: 5 * time.Second, WriteTimeout: 5 * time.Second, PoolTimeout: 5 * time.Second})
	if err != nil {
		return nil, fmt.Errorf("connecting to count connections: %w", err)
	}
	return &fleetConns{c: c}, nil
}

func (f *fleetConns) count(ctx context.Context) (int, error) {
	list, err := f.c.ClientList(ctx).Result()
	if err != nil {
		return 0, fmt.Errorf("CLIENT LIST: %w", err)
	}
	return strings.Count(list, " name="+contract.RedisClientName+" "), nil
}

func (f *fleetConns) close() { _ = f.c.Close() }

// samplePeak calls read every 100ms until the returned stop function is called, which returns
// the largest value read.
func samplePeak(read func() (float64, error)) func() float64 {
	var peak float64
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			if v, err := read(); err == nil {
				peak = max(peak, v)
			}
			select {
			case <-done:
				return
			case <-t.C:
			}
		}
	})
	return func() float64 {
		close(done)
		wg.Wait()
		return peak
	}
}

func connsMarkdown(c Conns) string {
	var b strings.Builder
	fmt.Fprintf(&b, "\n## Redis connections per sidecar\n\n")
	fmt.Fprintf(&b, "Sockets a sidecar holds open to Redis (its `redline_sidecar_redis_connections`; the fleet's from Redis's `CLIENT LIST`, by client name `%s`), against its pool of %d, the bound the controller's connection budget counts. Connections open on first use and stay while used; those idle for %.0f s close (not waited for here). Under load: the largest of samples 100 ms apart.\n\n",
		contract.RedisClientName, c.Pool, c.IdleTimeoutSecs)
	fmt.Fprintf(&b, "| sidecars | when | connections per sidecar | all sidecars | pool bound |\n| ---: | --- | ---: | ---: | ---: |\n")
	fmt.Fprintf(&b, "| 1 | at rest, after start (heartbeats only) | %.0f | – | %d |\n", c.FirstAtRest, c.Pool)
	fmt.Fprintf(&b, "| 1 | under load: the face cells, up to 64 clients | %.0f | – | %d |\n", c.FirstUnderLoad, c.Pool)
	fmt.Fprintf(&b, "| 1 | right after the face cells | %.0f | – | %d |\n", c.FirstAfterLoad, c.Pool)
	if c.Replicas > 0 {
		per := func(n int) string { return fmt.Sprintf("%.1f", float64(n)/float64(c.Replicas)) }
		fmt.Fprintf(&b, "| %d | at rest, before the accuracy cells (bench-0 still holds its idle connections from the face cells) | %s | %d | %d |\n", c.Replicas, per(c.FleetAtRest), c.FleetAtRest, c.Replicas*c.Pool)
		fmt.Fprintf(&b, "| %d | under load: the accuracy cells, 16 clients | %s | %d | %d |\n", c.Replicas, per(c.FleetUnderLoad), c.FleetUnderLoad, c.Replicas*c.Pool)
		fmt.Fprintf(&b, "| %d | right after the accuracy cells | %s | %d | %d |\n", c.Replicas, per(c.FleetAfterLoad), c.FleetAfterLoad, c.Replicas*c.Pool)
	}
	return b.String()
}
