package redisconn

import (
	"context"
	"errors"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
)

// Node changes: the Redis a client speaks to may change under it without any command failing.
//
//   - Redis Cluster: a replica promoted by CLUSTER FAILOVER (TAKEOVER switches in milliseconds)
//     answers the next command for its slots, and the old master, now its replica, answers
//     MOVED, which go-redis follows by itself; a master that died fails an attempt, and go-redis
//     retries the command on the node the reloaded slot map names. The caller sees a reply.
//     A node that stopped answering (a partition: timeouts) and was replaced shows in the
//     next slot map the client loads.
//   - Sentinel: go-redis closes its connections to a master the sentinels replaced, and the
//     next command dials the new one.
//   - One server behind a name that resolves to the pod (a headless Service): a new pod
//     answers at a new address.
//
// The node that answers may lack the last writes of the one before. What depends on every
// write being there (in-flight slots: a place a running request holds) asks NodeChanges and
// treats a change as a failed call. Counted: a MOVED reply, a refused, reset or closed
// connection, CLUSTERDOWN, MASTERDOWN or LOADING on an attempt on a Cluster node, and a slot
// map loaded that differs from the one before (ASK is not counted: a slot being migrated
// moves its keys with their data; nor is a timeout: a busy node is not a new one), and a new
// connection of a client of one server or a Sentinel master that reaches another address than
// the last. Not seen: a server restarted in place at the same address (behind a Service's
// cluster IP, a new pod has the old address; the client redials in silence), and a client's
// first connection, which has nothing to compare with. The in-flight slots find the first by
// their next renewal, which re-asserts what Redis lost, and the heartbeats by their own.

// NodeChanges is the number of node changes the client saw (see above).
func (s *ConnStats) NodeChanges() uint64 { return s.nodeChanges.Load() }

// watchNodes makes c count node changes into stats.
func watchNodes(c redis.UniversalClient, stats *ConnStats) {
	if cc, ok := c.(*redis.ClusterClient); ok {
		// Before any command: OnNewNode runs for nodes created from now on only.
		maps := &slotMaps{}
		cc.OnNewNode(func(n *redis.Client) { n.AddHook(clusterNodeWatch{stats: stats, maps: maps}) })
		return
	}
	c.AddHook(&addrWatch{stats: stats})
}

// clusterNodeWatch counts, on one Cluster node's client, the attempts that tell the slot map
// changed (nodeChanged), and the slot maps loaded through it that differ from the last one.
type clusterNodeWatch struct {
	stats *ConnStats
	maps  *slotMaps // shared by the client's nodes
}

func (clusterNodeWatch) DialHook(next redis.DialHook) redis.DialHook { return next }

func (w clusterNodeWatch) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		changed := nodeChanged(err)
		if sc, ok := cmd.(*redis.ClusterSlotsCmd); ok && err == nil {
			changed = w.maps.changed(sc.Val()) || changed
		}
		if changed {
			w.stats.nodeChanges.Add(1)
		}
		return err
	}
}

func (w clusterNodeWatch) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		changed := nodeChanged(err)
		for _, cmd := range cmds {
			changed = changed || nodeChanged(cmd.Err())
		}
		if changed {
			w.stats.nodeChanges.Add(1)
		}
		return err
	}
}

// nodeChanged says whether err, one attempt's on a Cluster node, means its slots may be served
// by another node now: a MOVED reply, a cluster that says it is down or a node loading its data
// (a restart), or a connection the node refused, reset or closed. A timeout is not one: a slow
// answer under load says nothing of the node, and counting it would fence in-flight limits
// whenever Redis is busy (a node that stopped answering and was replaced shows in the slot
// map's next reload, clusterSlotsChanged).
func nodeChanged(err error) bool {
	if err == nil || errors.Is(err, redis.Nil) || errors.Is(err, context.Canceled) ||
		errors.Is(err, context.DeadlineExceeded) || errors.Is(err, redis.ErrPoolTimeout) {
		return false
	}
	if rerr, ok := errors.AsType[redis.Error](err); ok {
		msg := rerr.Error()
		return strings.HasPrefix(msg, "MOVED ") || strings.HasPrefix(msg, "CLUSTERDOWN") ||
			strings.HasPrefix(msg, "MASTERDOWN") || strings.HasPrefix(msg, "LOADING")
	}
	if nerr, ok := errors.AsType[net.Error](err); ok && nerr.Timeout() {
		return false
	}
	return true
}

// slotMap is a canonical text of a CLUSTER SLOTS reply: each range and its master.
func slotMap(slots []redis.ClusterSlot) string {
	parts := make([]string, 0, len(slots))
	for _, s := range slots {
		master := ""
		if len(s.Nodes) > 0 {
			master = s.Nodes[0].Addr
		}
		parts = append(parts, strconv.Itoa(s.Start)+"-"+strconv.Itoa(s.End)+"="+master)
	}
	slices.Sort(parts)
	return strings.Join(parts, ",")
}

// slotMaps keeps the last slot map a cluster client loaded, to count a change of it.
type slotMaps struct {
	mu   sync.Mutex
	last string
}

// changed records the map of a CLUSTER SLOTS reply and says whether it differs from the one
// before (a failover, a reshard): the client may have reloaded it after a node stopped
// answering, and its next commands go to the new node without a MOVED.
func (m *slotMaps) changed(slots []redis.ClusterSlot) bool {
	now := slotMap(slots)
	m.mu.Lock()
	defer m.mu.Unlock()
	was := m.last
	m.last = now
	return was != "" && was != now
}

// addrWatch counts the new connections of one server's client (or a Sentinel master's) that
// reach another address than the connection dialed before.
type addrWatch struct {
	stats *ConnStats
	mu    sync.Mutex
	last  string
}

func (w *addrWatch) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		cn, err := next(ctx, network, addr)
		if err != nil {
			return cn, err
		}
		remote := cn.RemoteAddr().String()
		w.mu.Lock()
		if w.last != "" && w.last != remote {
			w.stats.nodeChanges.Add(1)
		}
		w.last = remote
		w.mu.Unlock()
		return cn, nil
	}
}

func (*addrWatch) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (*addrWatch) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
