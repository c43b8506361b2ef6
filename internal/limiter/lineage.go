package limiter

import (
	"context"
	"errors"
	"sync"
	"time"
)

// Lineages: which history of writes a Redis node answers from.
//
// A slot call that reaches a node holding less than the node before it (a replica promoted by a
// failover before it received the latest slots, or a master restarted) must not be trusted, even
// when no call failed: go-redis retries a broken connection and follows a cluster's MOVED
// answers by itself, and a Redis Cluster takeover switches in milliseconds, so the first sign
// of the switch is often a reply from the new node. Such a reply could grant a place that a
// running request of another replica held on the old node and has not re-asserted yet.
//
// Redis names the history a master's data comes from: its replication ID (INFO replication's
// master_replid). A master gets a new one when it starts (with or without data loaded from
// disk) and when a replica is promoted, which keeps the ID it replicated from as
// master_replid2. The slot scripts answer both with every reply, and the limiter remembers the
// ID each shard (a cluster master's address as its slot map names it; "all" otherwise) last
// answered with. A reply whose ID differs from the one its shard had when the call was sent,
// or from a shard first heard of whose master_replid2 is an ID this replica knew (a replica of
// a master it talked to, promoted), means the node changed: the call is undone and decided by
// the failure mode, and this replica re-asserts its slots before it takes another and keeps
// new slots on the failure mode for half the expiry, as after a failed call (see slots.go).
//
// What it cannot see: the first call of a replica to a shard it never talked to is trusted
// (a replica that starts, or first uses a key of that shard, while a failover there is being
// re-asserted, may take a place a running request held until its holder re-asserts it, at
// most a quarter of the expiry later). It reads INFO replication in each slot script, which
// the namespace's ACL user may run for that section only.

// maxLineages bounds the IDs remembered: every shard's current one and those replaced (what a
// promoted replica's master_replid2 names), forgetting arbitrary ones past the bound.
const maxLineages = 4 * maxShards

// ErrSlotsNodeChanged is the SlotResult.Err of an Acquire decided by the failure mode because
// the Redis node that answered holds another history of writes than the one before it (a
// failover or a restart): it may lack slots that other replicas' running requests hold.
var ErrSlotsNodeChanged = errors.New("the Redis node of the key changed (a failover or a restart): its in-flight slots are being re-asserted")

// noLineage is master_replid2 of a node that was never a replica.
const noLineage = "0000000000000000000000000000000000000000"

type lineages struct {
	mu      sync.Mutex
	byShard map[string]string   // shard name -> the ID it last answered with
	seen    map[string]struct{} // every ID answered, current or replaced
}

func newLineages() *lineages {
	return &lineages{byShard: map[string]string{}, seen: map[string]struct{}{}}
}

// of returns the ID shard last answered with, "" when it never did.
func (ls *lineages) of(shard string) string {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	return ls.byShard[shard]
}

// observe records that shard answered with id (and id2, its master_replid2) to a call sent when
// the shard's ID was before. It says whether the node changed under the call; when it did,
// onChange runs before the new ID is recorded, so that a call that reads the new ID afterwards
// finds what onChange set (the fence, the suspicion).
func (ls *lineages) observe(shard, before, id, id2 string, onChange func()) bool {
	if id == "" {
		return false // a reply without one is rejected as a bad reply by its caller
	}
	ls.mu.Lock()
	defer ls.mu.Unlock()
	cur := ls.byShard[shard]
	var changed bool
	switch {
	case before != "":
		changed = id != before
	case cur != "":
		changed = id != cur
	default:
		_, changed = ls.seen[id2]
		changed = changed && id2 != noLineage
	}
	if changed {
		onChange()
	}
	if shard != shardOther { // "other" of a cluster is several nodes: only master_replid2 tells
		remember(ls.byShard, shard, id)
	}
	remember(ls.seen, id, struct{}{})
	return changed
}

// remember sets m[k] = v, dropping an arbitrary entry when m is at maxLineages.
func remember[V any](m map[string]V, k string, v V) {
	if _, ok := m[k]; !ok && len(m) >= maxLineages {
		for old := range m {
			delete(m, old)
			break
		}
	}
	m[k] = v
}

// slotShard names the shard a slot call of key goes to, for its lineage.
func (l *Limiter) slotShard(ctx context.Context, key string) string {
	return l.breakers.of(ctx, key).name
}

// slotNodeChanged runs when a slot call's reply came from a node with another history than the
// one its shard had: new slots wait for the other replicas to re-assert theirs (the fence
// first, then the suspicion that makes the next Acquire renew this replica's slots).
func (l *Limiter) slotNodeChanged() {
	l.slotStats.nodeChanges.Add(1)
	l.fenceSlots(time.Now())
	l.markSlotsSuspect()
}
