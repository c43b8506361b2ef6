package limiter

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"github.com/redis/go-redis/v9"
)

// fakeTopology is a slot map in memory: which master serves a key, and the masters serving slots.
type fakeTopology struct {
	mu      sync.Mutex
	owner   map[string]string // key -> master address
	live    []string
	failMap bool // masters fails, as when no node answers CLUSTER SLOTS
	during  func()
}

func (f *fakeTopology) masterOf(_ context.Context, key string) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	a, ok := f.owner[key]
	if !ok {
		return "", errors.New("no slot map")
	}
	return a, nil
}

func (f *fakeTopology) masters(context.Context) ([]string, error) {
	f.mu.Lock()
	live, fail, during := slices.Clone(f.live), f.failMap, f.during
	f.mu.Unlock()
	if during != nil {
		during() // something the limiter does while the slot map is read
	}
	if fail {
		return nil, errors.New("reading the slot map: every node down")
	}
	return live, nil
}

// set makes the slot map: key "k-<addr>" is served by addr, and addrs are the masters.
func (f *fakeTopology) set(addrs ...string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.owner == nil {
		f.owner = map[string]string{}
	}
	for _, a := range addrs {
		f.owner["k-"+a] = a
	}
	f.live = addrs
}

func names(b *breakers) []string {
	var out []string
	for _, s := range b.states() {
		out = append(out, s.Name)
	}
	return out
}

func trip(s *shard) {
	for range 3 {
		_, _ = s.cb.Execute(func() (struct{}, error) { return struct{}{}, errors.New("timeout") })
	}
}

// Without a cluster there is one breaker, whatever the key.
func TestOneBreakerWithoutACluster(t *testing.T) {
	g := NewWithT(t)
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	t.Cleanup(func() { _ = c.Close() })
	b := newBreakers(clusterOf(c), 3, time.Second)
	g.Expect(b.topo).To(BeNil())
	s := b.of(context.Background(), "rl:{a}:swc")
	g.Expect(b.of(context.Background(), "rl:{b}:swc")).To(BeIdenticalTo(s))
	g.Expect(b.states()).To(Equal([]ShardState{{Name: shardAll}}))
	trip(s)
	g.Expect(b.states()).To(Equal([]ShardState{{Name: shardAll, Open: true}}))
}

// One breaker per master, so that one tripping leaves the others closed; never more than the
// bound, and addresses that left the slot map go at the next prune.
func TestBreakersPerMasterAreBounded(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	topo := &fakeTopology{}
	b := newBreakers(topo, 3, time.Minute)
	b.max = 3
	topo.set("a:1", "b:1", "c:1")
	a := b.of(ctx, "k-a:1")
	g.Expect(b.of(ctx, "k-a:1")).To(BeIdenticalTo(a), "one breaker per address")
	g.Expect(b.of(ctx, "k-b:1")).NotTo(BeIdenticalTo(a))
	b.of(ctx, "k-c:1")
	g.Expect(names(b)).To(Equal([]string{"a:1", "b:1", "c:1"}), `"other" shows only once used`)
	g.Expect(b.changed).To(HaveLen(1), "a new address asks for a prune")

	trip(a)
	g.Expect(b.states()).To(ConsistOf(ShardState{Name: "a:1", Open: true}, ShardState{Name: "b:1"}, ShardState{Name: "c:1"}))

	// A slot map naming more masters than the bound: the addresses beyond share "other".
	topo.set("a:1", "b:1", "c:1", "d:1", "e:1")
	d := b.of(ctx, "k-d:1")
	g.Expect(d).To(BeIdenticalTo(b.other))
	g.Expect(b.of(ctx, "k-e:1")).To(BeIdenticalTo(b.other))
	g.Expect(b.of(ctx, "unmapped")).To(BeIdenticalTo(b.other), "a key of no known master")
	g.Expect(names(b)).To(Equal([]string{"a:1", "b:1", "c:1", shardOther}))
	g.Expect(*b.byAddr.Load()).To(HaveLen(3))

	// c:1 leaves the slot map (resharded away, or failed over to d:1): its breaker goes, the
	// open one of a:1, still a master, stays open.
	topo.set("a:1", "b:1", "d:1")
	b.prune(ctx)
	g.Expect(slices.Sorted(maps.Keys(*b.byAddr.Load()))).To(Equal([]string{"a:1", "b:1"}))
	g.Expect(b.states()).To(ContainElement(ShardState{Name: "a:1", Open: true}))
	g.Expect(b.of(ctx, "k-d:1")).NotTo(BeIdenticalTo(b.other), "room again for the new master")

	// A slot map that cannot be read drops nothing.
	topo.mu.Lock()
	topo.failMap, topo.live = true, nil
	topo.mu.Unlock()
	b.prune(ctx)
	g.Expect(*b.byAddr.Load()).To(HaveLen(3))
	topo.mu.Lock()
	topo.failMap = false
	topo.mu.Unlock()

	// A breaker added while the slot map is read stays, even if that read predates its
	// address; the next prune decides.
	topo.set("a:1", "b:1")
	topo.mu.Lock()
	topo.owner["k-f:1"] = "f:1"
	topo.during = func() { b.of(ctx, "k-f:1") }
	topo.mu.Unlock()
	b.max = 4
	b.prune(ctx)
	g.Expect(slices.Sorted(maps.Keys(*b.byAddr.Load()))).To(Equal([]string{"a:1", "b:1", "f:1"}))
}

// Failover after failover, every address new: the breakers never outgrow the masters of the
// slot map and those that joined since the last prune.
func TestBreakersStayBoundedThroughFailovers(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	topo := &fakeTopology{}
	b := newBreakers(topo, 3, time.Minute)
	for round := range 1000 {
		addrs := []string{fmt.Sprint("a:", round), fmt.Sprint("b:", round), fmt.Sprint("c:", round)}
		topo.set(addrs...)
		for _, a := range addrs {
			trip(b.of(ctx, "k-"+a))
		}
		g.Expect(len(*b.byAddr.Load())).To(BeNumerically("<=", 6))
		b.prune(ctx)
		g.Expect(slices.Sorted(maps.Keys(*b.byAddr.Load()))).To(Equal(addrs))
	}
	g.Expect(b.states()).To(HaveLen(3))
}
