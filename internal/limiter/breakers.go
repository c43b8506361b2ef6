package limiter

import (
	"cmp"
	"context"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sony/gobreaker/v2"
)

// Circuit breakers, one per shard.
//
// A Redis Cluster is several Redis servers, each master serving its own slots. One breaker for
// the whole client let one master's outage (before its replica takes over, or for good without
// one) open it for every key: each decision of the pod went to the failure mode while the other
// masters answered. So each master has its own breaker, keyed by its address as the client's
// slot map names it, and a key's breaker is its hash slot's master's (every key of a limit is
// in one slot, see Key). A standalone Redis or a Sentinel group is one shard, "all": one
// breaker, as before.
//
// The set is bounded. A breaker exists only for an address the slot map named as a slot's
// master; the addresses that left the slot map (a failover promoted the replica, a resharding
// emptied a master) are dropped as soon as a new address shows up, which is when the topology
// changed, and every pruneEvery anyway. So it holds the cluster's masters and, until the next
// prune, those just replaced. Whatever the slot map says, it never holds more than maxShards:
// the addresses beyond share the breaker "other", as do keys whose master the client cannot
// name (no slot map yet).
type breakers struct {
	topo     topology // nil: one shard
	settings gobreaker.Settings
	max      int
	// other is the one shard without a cluster ("all"); on a cluster, "other".
	other  *shard
	byAddr atomic.Pointer[map[string]*shard] // copied on write: addresses change only with the topology
	mu     sync.Mutex                        // serialises writers of byAddr
	nextID uint32                            // under mu
	// changed says a new address showed up: the topology changed, prune now.
	changed chan struct{}
}

// shard is one shard's breaker.
type shard struct {
	name string
	id   uint32 // orders a batch's calls by shard
	cb   *gobreaker.CircuitBreaker[struct{}]
	// failing says this replica's shares must be re-asserted on the shard before it decides
	// again (see Limiter.resume): its breaker opened, or it is new, a node that may lack them.
	failing  atomic.Bool
	resumeMu sync.Mutex  // held by the flusher re-asserting
	used     atomic.Bool // "other" of a cluster was handed out: it shows in Stats from then on
}

// Names of the shards that are not a cluster master.
const (
	shardAll   = "all"
	shardOther = "other"
)

const (
	// maxShards bounds the breakers of a cluster: Redis Cluster is designed for up to 1000
	// nodes, and one gets this far only with a slot map naming more masters than that.
	maxShards = 1024
	// pruneEvery is how often the breakers of addresses no longer in the slot map go, where no
	// new address prompted it: a resharding that empties a master brings no new one. Each
	// prune reads the slot map once (CLUSTER SLOTS).
	pruneEvery = 30 * time.Second
)

// topology names the masters of a cluster.
type topology interface {
	// masterOf returns the address of the master serving key's slot, from the client's slot map.
	masterOf(ctx context.Context, key string) (string, error)
	// masters returns the address of every master serving slots, after reading the slot map.
	masters(ctx context.Context) ([]string, error)
}

// clusterTopology is go-redis's own slot map: the one its commands are routed by.
type clusterTopology struct{ c *redis.ClusterClient }

func (t clusterTopology) masterOf(ctx context.Context, key string) (string, error) {
	n, err := t.c.MasterForKey(ctx, key)
	if err != nil {
		return "", err
	}
	return n.Options().Addr, nil
}

func (t clusterTopology) masters(ctx context.Context) ([]string, error) {
	var mu sync.Mutex
	var out []string
	err := t.c.ForEachMaster(ctx, func(_ context.Context, m *redis.Client) error {
		mu.Lock() // ForEachMaster runs fn on every master at once
		defer mu.Unlock()
		out = append(out, m.Options().Addr)
		return nil
	})
	return out, err
}

// clusterOf returns the topology of client, nil when it is not a cluster's.
func clusterOf(client redis.UniversalClient) topology {
	if cc, ok := client.(*redis.ClusterClient); ok {
		return clusterTopology{cc}
	}
	return nil
}

// newBreakers returns the breakers of topo's masters, or the one breaker when topo is nil.
func newBreakers(topo topology, failures uint32, openFor time.Duration) *breakers {
	b := &breakers{
		topo: topo,
		settings: gobreaker.Settings{
			MaxRequests: 1,
			Timeout:     openFor,
			ReadyToTrip: func(c gobreaker.Counts) bool { return c.ConsecutiveFailures >= failures },
		},
		max:     maxShards,
		changed: make(chan struct{}, 1),
	}
	name := shardAll
	if topo != nil {
		name = shardOther
	}
	b.other = b.newShard(name, 0)
	b.byAddr.Store(&map[string]*shard{})
	return b
}

func (b *breakers) newShard(name string, id uint32) *shard {
	st := b.settings
	st.Name = name
	s := &shard{name: name, id: id, cb: gobreaker.NewCircuitBreaker[struct{}](st)}
	s.failing.Store(true)
	return s
}

// of returns the shard of key (a state key).
func (b *breakers) of(ctx context.Context, key string) *shard {
	if b.topo == nil {
		return b.other
	}
	addr, err := b.topo.masterOf(ctx, key)
	if err != nil {
		b.other.used.Store(true)
		return b.other
	}
	if s := (*b.byAddr.Load())[addr]; s != nil {
		return s
	}
	return b.add(addr)
}

// add returns the shard of addr, making it if there is room.
func (b *breakers) add(addr string) *shard {
	b.mu.Lock()
	defer b.mu.Unlock()
	cur := *b.byAddr.Load()
	if s := cur[addr]; s != nil {
		return s
	}
	if len(cur) >= b.max {
		b.other.used.Store(true)
		return b.other
	}
	next := make(map[string]*shard, len(cur)+1)
	maps.Copy(next, cur)
	b.nextID++
	s := b.newShard(addr, b.nextID)
	next[addr] = s
	b.byAddr.Store(&next)
	select {
	case b.changed <- struct{}{}:
	default:
	}
	return s
}

// prune drops the breakers of addresses that no longer serve slots. A breaker added while the
// slot map was being read stays: the map read may predate its address.
func (b *breakers) prune(ctx context.Context) {
	before := *b.byAddr.Load()
	addrs, err := b.topo.masters(ctx)
	if err != nil || len(addrs) == 0 {
		return // no slot map: keep what there is
	}
	live := make(map[string]bool, len(addrs))
	for _, a := range addrs {
		live[a] = true
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	cur := *b.byAddr.Load()
	next := make(map[string]*shard, len(cur))
	for a, s := range cur {
		if live[a] || before[a] != s {
			next[a] = s
		}
	}
	if len(next) != len(cur) {
		b.byAddr.Store(&next)
	}
}

// run prunes after each new address and every pruneEvery until quit closes.
func (b *breakers) run(quit <-chan struct{}) {
	t := time.NewTicker(pruneEvery)
	defer t.Stop()
	for {
		select {
		case <-quit:
			return
		case <-t.C:
		case <-b.changed:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		b.prune(ctx)
		cancel()
	}
}

// states returns every breaker's state, by name.
func (b *breakers) states() []ShardState {
	cur := *b.byAddr.Load()
	out := make([]ShardState, 0, len(cur)+1)
	if b.topo == nil || b.other.used.Load() {
		out = append(out, ShardState{Name: b.other.name, Open: b.other.cb.State() == gobreaker.StateOpen})
	}
	for _, s := range cur {
		out = append(out, ShardState{Name: s.name, Open: s.cb.State() == gobreaker.StateOpen})
	}
	slices.SortFunc(out, func(x, y ShardState) int { return cmp.Compare(x.Name, y.Name) })
	return out
}
