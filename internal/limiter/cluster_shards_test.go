package limiter_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"github.com/redis/go-redis/v9"

	"github.com/redline-dev/redline/internal/keyscheme"
	"github.com/redline-dev/redline/internal/limiter"
	"github.com/redline-dev/redline/internal/limiter/scripts"
	"github.com/redline-dev/redline/internal/redisconn"
	"github.com/redline-dev/redline/internal/testutil/redistest"
)

// tally counts decisions by where they came from, for the keys of the healthy shards and for
// those of the shard that is down.
type tally struct {
	mu                       sync.Mutex
	healthy, down            map[limiter.Source]int
	downOpen                 int // decisions of the down shard's keys refused by its open breaker
	healthyOpen, healthyErrs int // healthy keys' decisions that met a breaker or an error
	// slowest healthy decisions: of all, and of those that started once the down shard's breaker
	// had opened (only its probes reach the down master from then on).
	slowest, slowestOpen time.Duration
	opened               time.Time
}

func (t *tally) add(down bool, r limiter.Result, start time.Time) {
	took := time.Since(start)
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.healthy == nil {
		t.healthy, t.down = map[limiter.Source]int{}, map[limiter.Source]int{}
	}
	if down {
		t.down[r.Source]++
		if errors.Is(r.Err, limiter.ErrCircuitOpen) {
			t.downOpen++
			if t.opened.IsZero() {
				t.opened = start
			}
		}
		return
	}
	t.healthy[r.Source]++
	t.slowest = max(t.slowest, took)
	if !t.opened.IsZero() && start.After(t.opened) {
		t.slowestOpen = max(t.slowestOpen, took)
	}
	switch {
	case errors.Is(r.Err, limiter.ErrCircuitOpen):
		t.healthyOpen++
	case r.Err != nil:
		t.healthyErrs++
	}
}

func total(m map[limiter.Source]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

// keysByMaster returns perMaster keys for each master of the cluster, by the master's address.
func keysByMaster(t *testing.T, c *redis.ClusterClient, perMaster int) map[string][]string {
	t.Helper()
	ctx := context.Background()
	var masters []string
	var mu sync.Mutex
	g := NewWithT(t)
	g.Expect(c.ForEachMaster(ctx, func(_ context.Context, m *redis.Client) error {
		mu.Lock() // ForEachMaster runs fn on every master at once
		defer mu.Unlock()
		masters = append(masters, m.Options().Addr)
		return nil
	})).To(Succeed())
	out := map[string][]string{}
	for i := 0; len(out) < 3 || slices.ContainsFunc(masters, func(a string) bool { return len(out[a]) < perMaster }); i++ {
		g.Expect(i).To(BeNumerically("<", 10000), "keys spread over every master")
		k := keyscheme.Key("shop", t.Name(), "per-key", fmt.Sprint("client-", i))
		m, err := c.MasterForKey(ctx, k) // the hash tag places every key of a limit in one slot
		g.Expect(err).NotTo(HaveOccurred())
		if a := m.Options().Addr; len(out[a]) < perMaster {
			out[a] = append(out[a], k)
		}
	}
	return out
}

// One shard's master frozen (SIGSTOP), before any replica could take its slots: the keys of the
// two healthy shards are all still decided in Redis, only the frozen shard's go to the failure
// mode, and its breaker closes again once the master answers. Leases off (every decision asks
// Redis) and on (a decision admitted from a lease was counted in Redis when granted).
func TestClusterShardOutageKeepsTheOtherShardsOnRedis(t *testing.T) {
	g := NewWithT(t)
	cl, err := redistest.StartCluster(3)
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { _ = cl.Close() })
	ctx := context.Background()
	// With cluster-require-full-coverage (Redis's default) the healthy masters refuse every key
	// (CLUSTERDOWN) too once the cluster flags the frozen one as failed, after
	// cluster-node-timeout (2 s on these test clusters, 15 s by default): the whole cluster is
	// down then, by Redis's choice, and every breaker opens. Without it they keep serving their
	// slots, which lets this test hold the outage longer than the node timeout.
	for _, s := range cl.Nodes {
		rc := redis.NewClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1})
		g.Expect(rc.ConfigSet(ctx, "cluster-require-full-coverage", "no").Err()).To(Succeed())
		_ = rc.Close()
	}
	admin := newClient(t, cl.URL()).(*redis.ClusterClient)
	_, err = scripts.Load(ctx, admin)
	g.Expect(err).NotTo(HaveOccurred())

	for _, c := range []struct {
		name    string
		horizon time.Duration
		alg     limiter.Algorithm
	}{{"leases off", -1, limiter.SlidingWindowCounter}, {"leases on", 2 * time.Second, limiter.FixedWindow}} {
		t.Run(c.name, func(t *testing.T) {
			g := NewWithT(t)
			// Timeouts far above a healthy call's on a loaded machine: a healthy shard's call
			// that timed out would open its breaker for a reason other than the frozen shard.
			// Only the frozen master's calls reach them (a probe a breaker period).
			client, err := redisconn.NewClient(cl.URL(), redisconn.Options{
				ReadTimeout: time.Second, WriteTimeout: time.Second,
				DialTimeout: time.Second, PoolTimeout: 5 * time.Second,
			})
			g.Expect(err).NotTo(HaveOccurred())
			t.Cleanup(func() { _ = client.Close() })
			// Shares kept, so that the frozen shard re-asserts them before deciding again; leases
			// of 8 units at most, so that a key spends its lease within the outage and asks again.
			l := newLimiter(t, client, limiter.TestOptions{LeaseHorizon: c.horizon, ReplicaID: limiter.NewReplicaID(),
				MaxLease: 8, BreakerFailures: 3, BreakerOpenFor: 200 * time.Millisecond})
			lim := limiter.Limit{Algorithm: c.alg, Requests: 1_000_000_000, Window: time.Hour, Replicas: 1,
				FailureMode: limiter.FailureModeClosed}
			byMaster := keysByMaster(t, admin, 8)
			masters := make([]string, 0, len(byMaster))
			for a := range byMaster {
				masters = append(masters, a)
			}
			slices.Sort(masters)
			victim := masters[0]
			var node *redistest.Server
			for _, s := range cl.Nodes {
				if s.Addr() == victim {
					node = s
				}
			}
			g.Expect(node).NotTo(BeNil())
			var all []string
			down := map[string]bool{}
			for a, ks := range byMaster {
				all = append(all, ks...)
				for _, k := range ks {
					down[k] = a == victim
				}
			}
			// round makes workers decide every key once each, in its own order, so that
			// concurrent decisions of all three shards share pipelines.
			round := func(workers, rounds int, tl *tally) {
				var wg sync.WaitGroup
				for w := range workers {
					wg.Go(func() {
						rng := rand.New(rand.NewPCG(uint64(w), 1))
						ks := slices.Clone(all)
						for range rounds {
							rng.Shuffle(len(ks), func(i, j int) { ks[i], ks[j] = ks[j], ks[i] })
							for _, k := range ks {
								start := time.Now()
								r, err := l.Allow(ctx, k, lim, 1)
								if err != nil {
									panic(err)
								}
								tl.add(down[k], r, start)
							}
						}
					})
				}
				wg.Wait()
			}
			before := &tally{}
			round(4, 5, before)
			g.Expect(before.healthy[limiter.SourceRedis]+before.down[limiter.SourceRedis]+before.healthy[limiter.SourceLease]+before.down[limiter.SourceLease]).
				To(Equal(total(before.healthy)+total(before.down)), "every decision from Redis before the outage: %v %v", before.healthy, before.down)

			g.Expect(node.Pause()).To(Succeed())
			resumed := false
			t.Cleanup(func() {
				if !resumed {
					_ = node.Resume()
				}
			})
			out := &tally{}
			paused := time.Now()
			round(8, 40, out)
			outage := time.Since(paused)
			states := shardStates(l)
			healthy := total(out.healthy)
			fromRedis := out.healthy[limiter.SourceRedis] + out.healthy[limiter.SourceLease]
			t.Logf("%s, %s frozen for %s: healthy shards' decisions from Redis %d of %d (%.1f%%; %d of them from leases), "+
				"breaker-refused %d, other errors %d, slowest %s (%s once its breaker had opened); the frozen shard's: %v (%d of %d by its open breaker); breakers %v",
				c.name, victim, outage.Round(10*time.Millisecond), fromRedis, healthy, 100*float64(fromRedis)/float64(healthy),
				out.healthy[limiter.SourceLease], out.healthyOpen, out.healthyErrs, out.slowest.Round(time.Millisecond), out.slowestOpen.Round(time.Millisecond), out.down, out.downOpen, total(out.down), states)
			g.Expect(fromRedis).To(Equal(healthy), "every decision of a healthy shard's keys comes from Redis")
			g.Expect(out.down[limiter.SourceRedis]).To(BeZero(), "the frozen master decides nothing")
			g.Expect(out.down[limiter.SourceFailClosed]).To(BeNumerically(">", 0), "the frozen shard's keys go to the failure mode")
			g.Expect(out.downOpen).To(BeNumerically(">", 0), "the frozen shard's breaker opened")
			g.Expect(states).To(HaveKeyWithValue(victim, true))
			g.Expect(states).To(HaveLen(3))
			for _, a := range masters[1:] {
				g.Expect(states).To(HaveKeyWithValue(a, false), "the healthy shards' breakers stay closed")
			}
			g.Expect(l.Stats().BreakerOpen).To(BeTrue(), "some breaker is open")

			g.Expect(node.Resume()).To(Succeed())
			resumed = true
			victimKey := byMaster[victim][0]
			g.Eventually(func() limiter.Source {
				r, _ := l.Allow(ctx, victimKey, lim, 1)
				return r.Source
			}).WithTimeout(10*time.Second).WithPolling(50*time.Millisecond).Should(BeElementOf(limiter.SourceRedis, limiter.SourceLease),
				"the shard's breaker closes once its master answers")
			g.Expect(shardStates(l)).To(HaveKeyWithValue(victim, false))
			g.Expect(l.Stats().BreakerOpen).To(BeFalse())
			after := &tally{}
			round(4, 5, after)
			g.Expect(after.healthy[limiter.SourceRedis]+after.down[limiter.SourceRedis]+after.healthy[limiter.SourceLease]+after.down[limiter.SourceLease]).
				To(Equal(total(after.healthy)+total(after.down)), "every decision from Redis after the outage: %v %v", after.healthy, after.down)
		})
	}
}

// shardStates is the limiter's breakers, open or not, by shard.
func shardStates(l *limiter.Limiter) map[string]bool {
	out := map[string]bool{}
	for _, s := range l.Stats().Shards {
		out[s.Name] = s.Open
	}
	return out
}
