package redisconn

import (
	"context"
	"errors"
	"net"
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
//   - Sentinel: go-redis closes its connections to a master the sentinels replaced, and the
//     next command dials the new one.
//   - One server behind a name (a Service): a new pod answers at a new address.
//
// The node that answers may lack the last writes of the one before. What depends on every
// write being there (in-flight slots: a place a running request holds) asks NodeChanges and
// treats a change as a failed call. Counted: a MOVED reply and a failed attempt on a Cluster
// node (ASK is not: a slot being migrated moves its keys with their data), and a new connection
// of a client of one server or a Sentinel master that reaches another address than the last.
// Not seen: a server restarted in place at the same address whose connections had all closed
// as idle before, and a client's first connection, which has nothing to compare with.

// NodeChanges is the number of node changes the client saw (see above).
func (s *ConnStats) NodeChanges() uint64 { return s.nodeChanges.Load() }

// watchNodes makes c count node changes into stats.
func watchNodes(c redis.UniversalClient, stats *ConnStats) {
	if cc, ok := c.(*redis.ClusterClient); ok {
		// Before any command: OnNewNode runs for nodes created from now on only.
		cc.OnNewNode(func(n *redis.Client) { n.AddHook(clusterNodeWatch{stats}) })
		return
	}
	c.AddHook(&addrWatch{stats: stats})
}

// clusterNodeWatch counts, on one Cluster node's client, the attempts that tell the slot map
// changed: a MOVED reply, or the node not answering.
type clusterNodeWatch struct{ stats *ConnStats }

func (clusterNodeWatch) DialHook(next redis.DialHook) redis.DialHook { return next }

func (w clusterNodeWatch) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if nodeChanged(err) {
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
// by another node now.
func nodeChanged(err error) bool {
	if rerr, ok := errors.AsType[redis.Error](err); ok && strings.HasPrefix(rerr.Error(), "MOVED ") {
		return true
	}
	return nodeLost(err)
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
