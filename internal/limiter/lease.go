package limiter

import (
	"context"
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"
	"github.com/redis/go-redis/v9"

	"github.com/redline-dev/redline/internal/limiter/scripts"
)

// Leases take Redis off the path of most admitted requests without giving up the shared limit.
//
// A decision that has to ask Redis asks the script for a lease of several units instead of one;
// the script grants them only if they fit (used + granted <= limit) and counts them at once. The
// limiter then admits from the lease locally until it is spent or its window ends. Every unit a
// replica admits was counted in the one shared counter first, so all replicas together never
// admit more than the limit: leases can only cost under-admission, units leased to one replica
// while another is refused. To keep that small:
//
//   - a cold key asks for one unit, today's exact path, and so does every key until the live
//     replicas are known (a heartbeat answered); a warm key asks for its recent local rate
//     times the horizon (16 units at least), never more than the shared budget left at its
//     last grant divided by twice the live replicas, so near the limit leases shrink to one
//     unit again, and never more than a twentieth of the limit divided by the live replicas,
//     so all the units held at any moment are at most 5% of the limit; on a window of
//     longWindowLease or longer a thousandth, or 16 units if that is more (see leaseCap);
//   - a lease ends with the window its units were counted in: its deadline is the time the
//     request left plus what was left of that window when the script ran on Redis's clock, so
//     it ends no later than the window does, for a SlidingWindowCounter too, whose state lives
//     a window longer; a paused process that resumes finds it ended on its monotonic clock;
//   - a grant answers the limit it was asked under: one still in flight when the rule changes,
//     or granted to a caller that stopped waiting, goes back; unused units of an idle lease, of
//     a rule that changed and of every lease on Close go back too, while their window stands;
//   - the table holds at most size keys and never evicts a key in use to add one: a key beyond
//     the bound asks Redis per decision (see add);
//   - one caller per key asks Redis at a time; the others wait for its answer and take from it.
//
// Only FixedWindow and SlidingWindowCounter lease (see Algorithm.leases).
type leases struct {
	cache   *lru.Cache[string, *lease]
	size    int
	addMu   sync.Mutex // serialises adding keys, so that a full table never evicts to add one
	horizon time.Duration
	max     int64
	returns chan leaseReturn
	now     func() time.Time
	// warm remembers, by hash, keys whose idle lease went back, so that a key used again after
	// a pause asks for a warm lease at once instead of one unit and then a lease: a key paused
	// for longer than the horizon costs one Redis call to resume, not two. It holds no units
	// and no pointers (8 bytes a slot); a collision only makes a key cold, today's exact path.
	warm     []atomic.Uint64
	warmSeed maphash.Seed
	// shares, when kept, go with every return (a replica gives back only what the Redis it
	// returns to holds of its share), and onRestore hears of what they restored.
	shares    *shares
	onRestore func(policy string, units int64)
}

// minWarmLease is the least a key that was granted before asks for.
const minWarmLease = 16

// lease is one key's local budget.
type lease struct {
	mu          sync.Mutex
	limit       Limit     // the limit it was granted under (Replicas and modes aside)
	units       int64     // unspent
	deadline    time.Time // local time by which its window has surely ended
	windowStart int64
	remaining   int64 // what Redis had left after the last grant
	grantedAt   time.Time
	served      int64 // units admitted since grantedAt, the grant's own cost included
	lastUse     time.Time
	fetching    chan struct{} // closed when the caller asking Redis for this key has its answer
	gone        bool          // evicted: units granted to it from now on go straight back
	leased      bool          // was granted more than one decision's cost at least once
	// holds are the holds taken from it in the window starting at holdsStart and not settled
	// yet: at most Options.maxOpenHolds (see hold_lease.go).
	holds, holdsStart int64
}

// leaseReturn is units to give back to one window.
type leaseReturn struct {
	key         string
	policy      string // the limit's Policy, for onRestore
	window      time.Duration
	windowStart int64
	units       int64
	lowered     int64 // what the share was lowered by before the return was sent
}

func newLeases(size int, horizon time.Duration, maxUnits int64, now func() time.Time) (*leases, error) {
	ls := &leases{size: size, horizon: horizon, max: maxUnits, returns: make(chan leaseReturn, 4096), now: now,
		warm: make([]atomic.Uint64, warmSlots(size)), warmSeed: maphash.MakeSeed()}
	c, err := lru.NewWithEvict[string, *lease](size, func(key string, e *lease) { ls.drop(key, e, true) })
	if err != nil {
		return nil, err
	}
	ls.cache = c
	return ls, nil
}

// warmSlots is the power of two at least size, so that a slot is a mask away.
func warmSlots(size int) int {
	n := 1
	for n < size {
		n <<= 1
	}
	return n
}

// warmHash is key's hash in the warm table, never 0 (an empty slot).
func (ls *leases) warmHash(key string) uint64 {
	return maphash.String(ls.warmSeed, key) | 1
}

// rememberWarm records that key held a lease.
func (ls *leases) rememberWarm(key string) {
	h := ls.warmHash(key)
	ls.warm[h&uint64(len(ls.warm)-1)].Store(h)
}

// wasWarm says whether key held a lease before it was swept, and forgets it.
func (ls *leases) wasWarm(key string) bool {
	h := ls.warmHash(key)
	return ls.warm[h&uint64(len(ls.warm)-1)].CompareAndSwap(h, 0)
}

// sameLimit says whether a lease granted under a still holds under b: the live replica count
// and the failure mode may change, the counted quantity may not.
func sameLimit(a, b Limit) bool {
	return a.Algorithm == b.Algorithm && a.Requests == b.Requests && a.Window == b.Window && a.Burst == b.Burst
}

// take admits cost units of key from its lease. Otherwise it returns how many units to ask
// Redis for, and then the caller must settle e with the answer; or, when another caller is
// already asking for this key, a channel to wait on before taking again. e is nil for a key
// the table has no room for: it asks Redis for cost alone.
func (ls *leases) take(key string, limit Limit, cost int64, now time.Time) (r Result, ok bool, want int64, wait <-chan struct{}, e *lease) {
	e, found := ls.cache.Get(key)
	if !found {
		if e = ls.add(key, limit, now); e == nil {
			return Result{}, false, cost, nil, nil
		}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if !sameLimit(e.limit, limit) {
		// The rule changed (a reload): what was leased under the old limit is not admitted
		// under the new one, and goes back.
		ls.giveBack(key, e, now)
		e.limit, e.deadline, e.windowStart, e.remaining = limit, time.Time{}, 0, 0
		e.grantedAt, e.served = time.Time{}, 0
	}
	if e.units > 0 && !now.Before(e.deadline) {
		e.units = 0 // its window has ended, and its units with it
	}
	if e.units >= cost {
		e.units -= cost
		e.served += cost
		e.lastUse = now
		return Result{
			Allowed: true, Remaining: e.remaining + e.units, ResetAfter: e.deadline.Sub(now), Source: SourceLease,
			spent: spent{units: cost, startMS: e.windowStart, lease: e},
		}, true, 0, nil, e
	}
	if e.fetching != nil {
		return Result{}, false, 0, e.fetching, e
	}
	e.fetching = make(chan struct{})
	return Result{}, false, ls.want(e, limit, cost, now), nil, e
}

// add puts a new key in the table if there is room. A full table never evicts a key to make
// room: every key in it was used within a horizon (the sweep gives back the others), and an
// evicted key that comes back evicts another, leases again and strands what it was granted
// until the next return. A key beyond the bound asks Redis per decision instead, exactly,
// until the sweep frees a slot.
func (ls *leases) add(key string, limit Limit, now time.Time) *lease {
	ls.addMu.Lock()
	defer ls.addMu.Unlock()
	if e, ok := ls.cache.Peek(key); ok {
		return e
	}
	if ls.cache.Len() >= ls.size {
		return nil
	}
	e := &lease{limit: limit}
	if ls.wasWarm(key) {
		// Resuming after a pause: size the lease as a warm key's, at its floor (no rate
		// yet); a lease granted at least a window ago has nothing in remaining to cap it,
		// so the limit stands in, and the script never grants more than fits.
		e.grantedAt = now.Add(-limit.Window)
		e.remaining = limit.Requests
	}
	ls.cache.Add(key, e)
	return e
}

// want sizes the next lease of e: its local rate over the horizon, within a fair share of what
// is left, at least cost, and cost alone for a key never granted before.
func (ls *leases) want(e *lease, limit Limit, cost int64, now time.Time) int64 {
	if e.grantedAt.IsZero() || limit.Replicas < 1 {
		// Never granted, or the live replicas are not known yet (no heartbeat answered): a
		// replica that sized leases as if it were alone would hold the whole fleet's share.
		return cost
	}
	elapsed := max(now.Sub(e.grantedAt), time.Millisecond)
	w := int64(float64(e.served) * float64(ls.horizon) / float64(elapsed))
	// A warm key asks for a few units at least, so that a key used about once a horizon is not
	// a round trip per decision: the cap below still shrinks it to one near the limit.
	w = max(w, minWarmLease)
	// Two caps. Half of what is left, shared among the replicas: near the end of a window
	// leases shrink to one unit. And a twentieth of the limit per replica: all the units every
	// replica holds come to 5% of the limit at most, so however demand stops, the replicas
	// admit at least 95% of what the limit allows.
	replicas := max(limit.Replicas, 1)
	w = min(w, e.remaining/(2*replicas), leaseCap(limit, replicas), ls.max)
	return max(w, cost)
}

// longWindowLease is the window from which leases shrink to a thousandth of the limit.
const longWindowLease = time.Hour

// leaseCap is the most one replica's lease holds: a twentieth of the limit shared among the
// replicas, so that all of them hold 5% of it at most; from longWindowLease on, a thousandth
// (0.1% in all), or minWarmLease units if that is more, and never more than the twentieth.
//
// A sidecar killed without giving its lease back (SIGKILL, a node lost) strands its units until
// the window ends: on a minute that is soon, but over a day or a month pods come and go many
// times, and each death would strand up to 5% of the period's quota divided by the replicas. On
// a long window a death strands at most 0.1% of the limit divided by the live replicas (or 16
// units, for a limit too small for a thousandth to be a lease), a hundred deaths in the period
// at most 10%, and a failover or restart of Redis strands nothing: the shares restore every
// unit a live replica holds.
func leaseCap(limit Limit, replicas int64) int64 {
	short := limit.Requests / (20 * replicas)
	if limit.Window < longWindowLease {
		return short
	}
	return max(limit.Requests/(1000*replicas), min(minWarmLease, short))
}

// settle records what the fetching caller got from Redis for limit and wakes the waiters. sent
// is when the request left, so that the deadline is no later than the window's end on Redis's
// clock. A grant answers the limit it was asked under: when the rule changed while it was in
// flight, or the key left the table, what it granted beyond the caller's cost goes back.
func (ls *leases) settle(key string, e *lease, limit Limit, res Result, g grant, cost int64, sent, now time.Time, answered bool) {
	if e == nil {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if answered && res.Allowed && g.units > 0 {
		start, left := g.window(limit.Window)
		switch {
		case e.gone || !sameLimit(e.limit, limit):
			ls.queueReturn(leaseReturn{key: key, policy: limit.Policy, window: limit.Window, windowStart: start, units: g.units - cost})
		default:
			if start != e.windowStart {
				e.units = 0
			}
			e.units += g.units - cost
			// The lease ends with the window its units were counted in: in the next one they
			// would weigh on a SlidingWindowCounter only as the previous window's share.
			e.deadline = sent.Add(left)
			e.windowStart = start
			e.remaining = res.Remaining
			e.grantedAt, e.served, e.lastUse = now, cost, now
			e.leased = e.leased || g.units > cost
		}
	}
	if e.fetching != nil {
		close(e.fetching)
		e.fetching = nil
	}
}

// queueReturn queues units for return to their window.
func (ls *leases) queueReturn(r leaseReturn) {
	if r.units <= 0 {
		return
	}
	select {
	case ls.returns <- r:
	default: // the returner is behind: the units stay counted, which only under-admits
	}
}

// giveBack queues e's unspent units for return to their window; e.mu is held.
func (ls *leases) giveBack(key string, e *lease, now time.Time) {
	if now.Before(e.deadline) {
		ls.queueReturn(leaseReturn{key: key, policy: e.limit.Policy, window: e.limit.Window, windowStart: e.windowStart, units: e.units})
	}
	e.units = 0
}

// drop is the eviction callback: the key's lease goes back.
func (ls *leases) drop(key string, e *lease, evicted bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	ls.giveBack(key, e, ls.now())
	e.gone = evicted
}

// sweep gives back the leases idle for longer than the horizon, oldest first, and stops at the
// first one in use: the cache's order is the order of last use.
func (ls *leases) sweep(now time.Time) {
	for range 1024 {
		key, e, ok := ls.cache.GetOldest()
		if !ok {
			return
		}
		e.mu.Lock()
		idle := e.fetching == nil && now.Sub(e.lastUse) > ls.horizon
		leased := e.leased
		e.mu.Unlock()
		if !idle {
			return
		}
		ls.cache.Remove(key) // the eviction callback gives its units back
		if leased {
			// A key that was used enough to lease resumes warm; a key used once (a
			// per-user key seen once a window, say) stays cold, so a pause does not cost it a
			// lease and a return of what it did not use.
			ls.rememberWarm(key)
		}
	}
}

// run sweeps idle leases and sends returns until quit closes, then gives back every lease.
func (ls *leases) run(client redis.UniversalClient, quit <-chan struct{}) {
	t := time.NewTicker(max(ls.horizon/4, 50*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-quit:
			ls.cache.Purge() // every lease to the return queue
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			ls.send(ctx, client)
			cancel()
			return
		case <-t.C:
			ls.sweep(ls.now())
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			ls.send(ctx, client)
			cancel()
		}
	}
}

// send gives queued units back in one pipeline. A return that fails leaves its units counted:
// the window admits less, never more. With shares, each return says what this replica knows of
// its share, so that the script restores it first, gives back no more than the Redis holds of
// it, and the share shrinks by what went back.
func (ls *leases) send(ctx context.Context, client redis.UniversalClient) {
	var cmds []redis.Cmder
	var sent []leaseReturn
	for {
		select {
		case r := <-ls.returns:
			args := []any{r.window.Milliseconds(), r.windowStart, r.units}
			if ls.shares != nil {
				// The units leave the share before the call, as a settle's and a give-back's
				// do: a decision of this key in flight that read the share before would
				// otherwise find Redis short of it once they went back, restore them and hold
				// every grant of the key for a heartbeat (a reload that changes the rule
				// returns every lease at once). The call says what this replica knew before
				// its own lowering, stamped, and the script writes the stamp.
				r.lowered = ls.shares.lower(r.key, r.window, r.windowStart, r.units)
				start, cur, prev, lv := ls.shares.knownBefore(r.key, r.window, r.windowStart, r.lowered)
				args = append(args, ls.shares.id, start, cur, prev, lv)
			}
			cmds = append(cmds, scripts.EvalSha(ctx, scripts.LeaseReturn(), []string{r.key}, args...))
			sent = append(sent, r)
			if len(cmds) < 256 {
				continue
			}
		default:
		}
		if len(cmds) == 0 {
			return
		}
		scripts.Exec(ctx, client, cmds, []scripts.Script{scripts.LeaseReturn()})
		for i, cmd := range cmds {
			if ls.shares == nil {
				break
			}
			r := sent[i]
			vals, err := cmd.(*redis.Cmd).Int64Slice()
			ok := err == nil && len(vals) == 2 && vals[0] >= 0 && vals[0] <= r.units
			var back int64
			if ok {
				back = vals[0]
			}
			// The share ends lowered by what went back: what was lowered and did not go back
			// (an ended window, units this Redis never counted, an error that may have come
			// after the script ran) is in it again, and never more than was lowered (a share
			// above what this replica knows it was granted would restore units in Redis).
			if d := r.lowered - back; d != 0 {
				ls.shares.add(r.key, "", "", r.window, 0, r.windowStart, d)
			}
			if ok && vals[1] > 0 && ls.onRestore != nil {
				ls.onRestore(r.policy, vals[1])
			}
		}
		cmds, sent = cmds[:0], sent[:0]
	}
}
