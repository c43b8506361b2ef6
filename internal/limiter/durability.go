package limiter

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redline-dev/redline/internal/limiter/scripts"
)

// Durability: what a grant waits for before it is answered.
//
// A script counts a grant in the master's memory. A restart without persistence loses it, and
// so does a failover for the writes the replica had not received yet; the shares (shares.go)
// repair what live replicas admitted, but over a long window pods come and go. A rule may ask
// its grants to wait for an acknowledgement instead: a replica's (WAIT 1 <timeout>) or the
// master's fsynced append-only file (WAITAOF 1 0 <timeout>, Redis 7.2+). Scripts cannot call
// either, so the command follows the EVALSHAs in the same pipeline, one connection, one round
// trip (scripts.ExecThen), and answers for every write of that connection so far.
//
// The choices made here:
//   - A grant whose acknowledgement does not come (the timeout passed, the server does not know
//     WAITAOF, appendonly is off, no replica) still stands: Redis counted it, a refusal now
//     would cost the client a unit it was never given, and a replica or a disk that lags would
//     turn into refusals for every client. The request is admitted, later by at most the
//     timeout (plus one tick of Redis's event loop), and Stats.Unacknowledged counts it by
//     reason; the manager's RedisDurability condition says when a Redis cannot give it at all.
//     Nothing falls back to a weaker command in silence: WAITAOF is sent as asked, and Redis
//     7.0's "unknown command" is counted as unsupported.
//   - Calls with durability leave in a pipeline of their own, on a goroutine of their own
//     (runShard), so that a lagging replica slows neither the batch's other calls nor the
//     flusher: only the rules that asked to wait for it. Those goroutines are as many as the
//     waits allowed at once, at most (startDurable); Close waits for them.
//   - A pipeline with a WAIT reads its replies for up to the client's read timeout plus the
//     longest wait plus one second (an idle Redis at hz 1 notices a timed-out wait a second
//     late), through a clone of the client that shares its connection pool.
//   - On a Redis Cluster the pipeline goes to the key's master's own client: a WAIT has no key
//     for the cluster client to route it by.

// maxDurabilityTimeout bounds Durability.Timeout.
const maxDurabilityTimeout = 5 * time.Second

func (d Durability) valid() error {
	switch d.Mode {
	case "":
		if d.Timeout != 0 {
			return fmt.Errorf("%w: durability timeout without a mode", ErrInvalidLimit)
		}
		return nil
	case DurabilityReplica, DurabilityAppendOnlyFile:
	default:
		return fmt.Errorf("%w: durability mode %q", ErrInvalidLimit, d.Mode)
	}
	if d.Timeout < time.Millisecond || d.Timeout > maxDurabilityTimeout || d.Timeout%time.Millisecond != 0 {
		return fmt.Errorf("%w: durability timeout %s must be whole milliseconds in 1ms..%s", ErrInvalidLimit, d.Timeout, maxDurabilityTimeout)
	}
	return nil
}

// durabilityCounters count grants whose acknowledgement did not come, by reason.
type durabilityCounters struct {
	acked, timeout, unsupported, failed, busy atomic.Uint64
}

// waitConcurrency is how many pipelines may wait for an acknowledgement at once: a quarter of
// the connection pool (at least 1). A wait holds its connection up to its timeout: unbounded,
// a lagging or missing replica would have the waits take every connection, and every rule of
// the sidecar, durable or not, would wait for one and trip the breaker.
func waitConcurrency(client redis.UniversalClient) int {
	pool := 0
	switch c := client.(type) {
	case *redis.Client:
		pool = c.Options().PoolSize
	case *redis.ClusterClient:
		pool = c.Options().PoolSize
	case *redis.Ring:
		pool = c.Options().PoolSize
	}
	if pool <= 0 {
		pool = 10 * runtime.GOMAXPROCS(0) // go-redis's default
	}
	return max(pool/4, 1)
}

// waits is the strongest wait of each mode a pipeline's calls ask for.
type waits struct{ replica, aof time.Duration }

func waitsOf(batch []*call) waits {
	var w waits
	for _, c := range batch {
		switch c.dur.Mode {
		case DurabilityReplica:
			w.replica = max(w.replica, c.dur.Timeout)
		case DurabilityAppendOnlyFile:
			w.aof = max(w.aof, c.dur.Timeout)
		}
	}
	return w
}

// commands are the wait commands of one round trip.
func (w waits) commands(ctx context.Context) []redis.Cmder {
	cmds := make([]redis.Cmder, 0, 2)
	if w.replica > 0 {
		cmds = append(cmds, redis.NewIntCmd(ctx, "wait", 1, w.replica.Milliseconds()))
	}
	if w.aof > 0 {
		cmds = append(cmds, redis.NewIntSliceCmd(ctx, "waitaof", 1, 0, w.aof.Milliseconds()))
	}
	return cmds
}

// outcome reads what the round trips' waits said of mode: "" when every one acknowledged.
func outcome(rounds [][]redis.Cmder, mode DurabilityMode) string {
	name := "wait"
	if mode == DurabilityAppendOnlyFile {
		name = "waitaof"
	}
	for _, round := range rounds {
		for _, cmd := range round {
			if cmd.Name() != name {
				continue
			}
			if err := cmd.Err(); err != nil {
				if redis.HasErrorPrefix(err, "unknown command") {
					return UnackedUnsupported
				}
				return UnackedError
			}
			switch cmd := cmd.(type) {
			case *redis.IntCmd: // WAIT: the replicas that acknowledged
				if cmd.Val() < 1 {
					return UnackedTimeout
				}
			case *redis.IntSliceCmd: // WAITAOF: [local fsynced, replicas fsynced]
				if v := cmd.Val(); len(v) < 1 || v[0] < 1 {
					return UnackedTimeout
				}
			}
		}
	}
	return ""
}

// splitDurable orders batch with the calls that wait for nothing first and says where the
// others begin.
func splitDurable(batch []*call) int {
	slices.SortStableFunc(batch, func(a, b *call) int {
		return boolInt(a.dur.Mode != "") - boolInt(b.dur.Mode != "")
	})
	return slices.IndexFunc(batch, func(c *call) bool { return c.dur.Mode != "" })
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// waitClients are clones of the limiter's client (or of a cluster master's) that read long
// enough for a wait, sharing its connections: one per master and timeout up to
// maxWaitClients, and past it one more per master that reads as long as the longest wait.
type waitClients struct {
	mu sync.Mutex
	m  map[string]*redis.Client
}

const maxWaitClients = 64

// clientFor returns the client a pipeline of batch waiting w goes through.
func (l *Limiter) waitClient(ctx context.Context, batch []*call, w waits) (redis.UniversalClient, error) {
	base, ok := l.client.(*redis.Client)
	if cc, isCluster := l.client.(*redis.ClusterClient); isCluster {
		node, err := cc.MasterForKey(ctx, batch[0].args[3].(string))
		if err != nil {
			return nil, fmt.Errorf("finding the master to wait on: %w", err)
		}
		base, ok = node, true
	}
	if !ok {
		return l.client, nil // a client of another kind: its own read timeout applies
	}
	wait := max(w.replica, w.aof)
	read := base.Options().ReadTimeout
	if read <= 0 {
		read = 3 * time.Second // go-redis's default
	}
	name := base.Options().Addr + "/" + strconv.FormatInt(wait.Milliseconds(), 10)
	l.waitClients.mu.Lock()
	defer l.waitClients.mu.Unlock()
	if c, ok := l.waitClients.m[name]; ok {
		return c, nil
	}
	if len(l.waitClients.m) >= maxWaitClients {
		// Full: further waits share their master's clone that reads as long as the longest
		// wait allowed, one per master (the masters are bounded too, see breakers).
		wait, name = maxDurabilityTimeout, base.Options().Addr+"/max"
		if c, ok := l.waitClients.m[name]; ok {
			return c, nil
		}
	}
	c := base.WithTimeout(read + wait + time.Second)
	if l.waitClients.m == nil {
		l.waitClients.m = map[string]*redis.Client{}
	}
	l.waitClients.m[name] = c
	return c, nil
}

// durableRuns are the goroutines of waiting pipelines in flight (see startDurable).
type durableRuns struct {
	mu      sync.Mutex
	closing bool // set by Close: no more runs start
	wg      sync.WaitGroup
}

type durableStart int

const (
	durableStarted durableStart = iota // on a goroutine of its own, which answers the calls
	durableBusy                        // every token is taken: the caller sends them without a wait
	durableClosed                      // the limiter is closing: the caller answers ErrClosed
)

// startDurable runs the calls of group, which all wait for an acknowledgement, in a pipeline on
// a goroutine of their own, if a token of waitSem is free. The token is held for the
// goroutine's whole run: a flood of durable decisions starts at most waitConcurrency of them,
// whatever the number of callers, and the rest leave at once without their wait (busy).
func (l *Limiter) startDurable(group []*call) durableStart {
	l.durableRuns.mu.Lock()
	defer l.durableRuns.mu.Unlock()
	if l.durableRuns.closing {
		return durableClosed
	}
	select {
	case l.waitSem <- struct{}{}:
	default:
		return durableBusy
	}
	group = slices.Clone(group) // the flusher reuses its batch
	l.durableRuns.wg.Go(func() {
		defer func() { <-l.waitSem }()
		l.runShard1(group, make([]redis.Cmder, 0, len(group)))
	})
	return durableStarted
}

// stopDurable starts no more waiting pipelines and waits for those in flight.
func (l *Limiter) stopDurable() {
	l.durableRuns.mu.Lock()
	l.durableRuns.closing = true
	l.durableRuns.mu.Unlock()
	l.durableRuns.wg.Wait()
}

// execDurable runs cmds, the EVALSHAs of batch, followed by its waits, and records on each
// granted call whether its grant was acknowledged. The caller holds a token of waitSem.
func (l *Limiter) execDurable(ctx context.Context, batch []*call, cmds []redis.Cmder) scripts.Counts {
	w := waitsOf(batch)
	c, err := l.waitClient(ctx, batch, w)
	if err != nil {
		for _, cmd := range cmds {
			cmd.SetErr(err)
		}
		return scripts.Counts{}
	}
	n, rounds := scripts.ExecThen(ctx, c, cmds, decisionScripts, func() []redis.Cmder { return w.commands(ctx) })
	results := map[DurabilityMode]string{}
	for _, m := range []DurabilityMode{DurabilityReplica, DurabilityAppendOnlyFile} {
		results[m] = outcome(rounds, m)
	}
	for i, call := range batch {
		if cmds[i].Err() != nil {
			continue
		}
		call.unacked = results[call.dur.Mode]
	}
	return n
}

// countAck counts what c's grant waited for, once it is known to have granted units.
func (l *Limiter) countAck(c *call) {
	if c.dur.Mode == "" || c.g.units <= 0 {
		return
	}
	switch c.unacked {
	case "":
		l.durability.acked.Add(1)
	case UnackedTimeout:
		l.durability.timeout.Add(1)
	case UnackedUnsupported:
		l.durability.unsupported.Add(1)
	case UnackedBusy:
		l.durability.busy.Add(1)
	default:
		l.durability.failed.Add(1)
	}
}
