package limiter

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sony/gobreaker/v2"
)

// flushers is how many pipelines may be in flight at once. While they are all busy, new
// decisions queue up and leave together in the next pipeline, so round trips per decision fall
// as concurrency rises.
const flushers = 4

// fallbackSize bounds the local limiters kept for LocalFallback (keys).
const fallbackSize = 65536

func (o Options) withDefaults() Options {
	if o.maxDetached <= 0 {
		o.maxDetached = 256
	}
	if o.MaxBatch <= 0 {
		o.MaxBatch = 128
	}
	if o.PrecheckSize == 0 {
		o.PrecheckSize = 65536
	}
	if o.breakerFailures == 0 {
		o.breakerFailures = 5
	}
	if o.breakerOpenFor <= 0 {
		o.breakerOpenFor = time.Second
	}
	if o.LeaseHorizon == 0 {
		o.LeaseHorizon = 2 * time.Second
	}
	if o.LeaseSize <= 0 {
		o.LeaseSize = 16384
	}
	if o.maxLease <= 0 {
		o.maxLease = 10000
	}
	if o.ShareKeys <= 0 {
		o.ShareKeys = 65536
	}
	if o.maxHolds <= 0 {
		o.maxHolds = 65536
	}
	if o.maxOpenHolds <= 0 {
		o.maxOpenHolds = defaultMaxOpenHolds
	}
	o.maxOpenHolds = min(o.maxOpenHolds, maxOpenHoldsBound)
	if o.now == nil {
		o.now = time.Now
	}
	if o.SlotExpiry <= 0 {
		o.SlotExpiry = DefaultSlotExpiry
	}
	o.SlotExpiry = min(max(o.SlotExpiry, minSlotExpiry), maxSlotExpiry)
	return o
}

// Errors a Result.Err or Allow can carry.
var (
	// ErrCircuitOpen is the Result.Err of decisions made while the circuit breaker of their
	// key's shard was open.
	ErrCircuitOpen = errors.New("redis circuit breaker open")
	// ErrClosed is returned by Allow after Close.
	ErrClosed = errors.New("limiter closed")
)

// Limiter decides rate limits shared by every instance that talks to the same Redis.
// It is safe for concurrent use.
type Limiter struct {
	client    redis.UniversalClient
	opts      Options
	queue     chan *call
	slots     chan struct{} // one per pipeline in flight, held by flushers and inline callers
	detached  chan struct{} // one per detached ask in flight (Options.maxDetached)
	quit      chan struct{}
	wg        sync.WaitGroup
	closed    atomic.Bool
	breakers  *breakers // one per shard: a cluster's masters, or the one Redis
	precheck  *precheck
	fallback  *fallback
	leases    *leases // nil when leases are off
	clock     *redisClock
	stats     counters
	calls     sync.Pool
	shares    *shares       // nil without a ReplicaID
	reassert  chan struct{} // a re-assertion of every share is due
	holdTag   string        // names this limiter's holds beside their sequence (see hold.go)
	holdSeq   atomic.Uint64
	slotBook  *slotBook  // the in-flight slots this replica holds (see slots.go)
	local     localSlots // LocalFallback's slots, per key (see slots_fallback.go)
	slotStats slotCounters
	// slotMarks counts what made Redis suspect for slots (a failed call, a loss another
	// replica signalled); with Options.NodeChanges it is the suspicion's generation, and
	// slotCleared the generation the last complete renewal started at: Redis is suspect while
	// they differ (see reassertSlots). A count, not a flag, so that a renewal never clears a
	// suspicion raised while it ran. slotRenewMu lets one renewal run at a time.
	slotMarks   atomic.Uint64
	slotCleared atomic.Uint64
	slotRenewMu sync.Mutex
	// slotFence is when new slots may be taken again after a renewal that followed a failure
	// (UnixNano on the local clock).
	slotFence atomic.Int64
	// durability counts acknowledged and unacknowledged grants; waitClients read long enough
	// for a wait (durability.go).
	durability  durabilityCounters
	waitClients waitClients
	// waitSem bounds the pipelines waiting for an acknowledgement at once (waitConcurrency),
	// and so the goroutines they run on; durableRuns lets Close wait for them.
	waitSem     chan struct{}
	durableRuns durableRuns
	stopped     chan struct{} // closed once Close has waited for every goroutine of the limiter
}

// New returns a Limiter over client. The client stays the caller's to close.
func New(client redis.UniversalClient, opts Options) (*Limiter, error) {
	if client == nil {
		return nil, errors.New("creating limiter: nil redis client")
	}
	o := opts.withDefaults()
	// The id names a field of the window state beside s, c, p and the hold's @<id> marks.
	if id := o.ReplicaID; id != "" && (len(id) < 2 || len(id) > 64 || id[0] == '@') {
		return nil, fmt.Errorf("creating limiter: replica id %q: want 2-64 bytes, not starting with @ (NewReplicaID makes one)", id)
	}
	l := &Limiter{
		client:   client,
		opts:     o,
		queue:    make(chan *call, o.MaxBatch*flushers),
		slots:    make(chan struct{}, flushers),
		detached: make(chan struct{}, o.maxDetached),
		quit:     make(chan struct{}),
		clock:    newRedisClock(),
		holdTag:  NewReplicaID(),
		slotBook: newSlotBook(MaxSlots),
		waitSem:  make(chan struct{}, waitConcurrency(client)),
		stopped:  make(chan struct{}),
	}
	l.wg.Go(l.slotRenewer)
	if o.ReplicaID != "" {
		l.shares = newShares(o.ReplicaID, o.ShareKeys, o.RestoreHold, o.maxHolds, o.now)
		l.reassert = make(chan struct{}, 1)
		l.wg.Go(l.reasserter)
	}
	var err error
	if l.precheck, err = newPrecheck(o.PrecheckSize); err != nil {
		return nil, fmt.Errorf("creating pre-check cache: %w", err)
	}
	if l.fallback, err = newFallback(fallbackSize); err != nil {
		return nil, fmt.Errorf("creating fallback cache: %w", err)
	}
	if o.LeaseHorizon > 0 {
		if l.leases, err = newLeases(o.LeaseSize, o.LeaseHorizon, o.maxLease, o.now); err != nil {
			return nil, fmt.Errorf("creating lease cache: %w", err)
		}
		l.leases.shares, l.leases.onRestore = l.shares, l.restored
		l.wg.Go(func() { l.leases.run(client, l.quit) })
	}
	l.breakers = newBreakers(clusterOf(client), o.breakerFailures, o.breakerOpenFor)
	if l.breakers.topo != nil {
		l.wg.Go(func() { l.breakers.run(l.quit) })
	}
	l.calls.New = func() any { return &call{done: make(chan struct{}, 1), args: make([]any, 0, 13)} }
	for range flushers {
		l.wg.Add(1)
		go l.flusher()
	}
	return l, nil
}

// Close stops the limiter's goroutines. Decisions in flight end with a failure-mode result,
// but for grants waiting for an acknowledgement: Close waits for those pipelines (each reads
// for at most the client's read timeout plus its wait plus a second) so that none of them uses
// the client after Close returns.
func (l *Limiter) Close() {
	if l.closed.CompareAndSwap(false, true) {
		close(l.quit)
		l.wg.Wait()
		l.stopDurable()
		close(l.stopped)
	} else {
		<-l.stopped
	}
}

// Allow decides whether cost units of key may pass under limit. key comes from Key.
// A cost above limit.Capacity() is refused with RetryAfter -1 without a Redis call.
// A Redis failure does not make Allow fail: the limit's failure mode decides, and Result.Err
// says why. Allow returns an error only for an invalid limit or cost, or after Close.
func (l *Limiter) Allow(ctx context.Context, key string, limit Limit, cost int64) (Result, error) {
	return l.allow(ctx, key, limit, cost, nil)
}

// allow is Allow, as a member m of a gather when m is not nil (see AllowAll): m arrives once,
// with its Redis call or without one, before allow blocks on anything but that call.
func (l *Limiter) allow(ctx context.Context, key string, limit Limit, cost int64, m *member) (Result, error) {
	defer m.pass(l) // every way out that did not arrive
	if err := limit.Validate(); err != nil {
		return Result{}, err
	}
	if cost < 1 {
		return Result{}, fmt.Errorf("%w: cost must be at least 1, got %d", ErrInvalidLimit, cost)
	}
	if l.closed.Load() {
		return Result{}, ErrClosed
	}
	if cost > limit.Capacity() {
		// Never admissible, whatever Redis holds: answering here keeps a caller-chosen cost from
		// reaching a script at all, and costs no round trip.
		return finish(Result{OverLimit: true, RetryAfter: -1, Source: SourceCapacity}, limit), nil
	}
	sk := limitKey(key, limit)
	now := l.opts.now()
	if l.leases == nil || !limit.Algorithm.leases() || limit.Calendar != nil {
		res, g, answered, err := l.ask(ctx, sk, limit, cost, cost, now, m, nil)
		return finish(counted(res, limit, g, cost, answered), limit), err
	}
	for waited := false; ; waited = true {
		r, ok, want, wait, e := l.leases.take(sk, limit, cost, now)
		if ok {
			l.stats.leased.Add(1)
			return finish(r, limit), nil
		}
		if wait == nil {
			res, g, answered, err := l.ask(ctx, sk, limit, cost, want, now, m, nil)
			l.leases.settle(sk, e, limit, res, g, cost, now, l.opts.now(), answered)
			if answered && g.units > cost {
				l.stats.grants.Add(1)
			}
			return finish(counted(res, limit, g, cost, answered), limit), err
		}
		if waited {
			// Another caller is asking for this key again: ask for this cost alone rather
			// than queue behind a second round trip.
			res, g, answered, err := l.ask(ctx, sk, limit, cost, cost, now, nil, nil)
			return finish(counted(res, limit, g, cost, answered), limit), err
		}
		// Waiting for another caller's grant: the rest of the gather goes without this one.
		m.pass(l)
		select {
		case <-wait:
		case <-ctx.Done():
			return finish(l.degraded(sk, limit, cost, now, ctx.Err(), nil), limit), nil
		case <-l.quit:
			return Result{}, ErrClosed
		}
		now = l.opts.now()
	}
}

// ask decides cost units of sk in Redis, asking a leasing script for want units, or by the
// failure mode when Redis cannot answer. answered says Redis decided (g is then its grant). h,
// when not nil, makes it a Reserve's: a hold of up to h.want units.
func (l *Limiter) ask(ctx context.Context, sk string, limit Limit, cost, want int64, now time.Time, m *member, h *holdAsk) (Result, grant, bool, error) {
	if limit.Calendar != nil {
		return l.askCalendar(ctx, sk, limit, cost, want, now, m, h)
	}
	return l.askAt(ctx, sk, limit, cost, want, now, m, h, 0)
}

// askAt is ask, for a calendar limit around atMS on Redis's clock (see askCalendar).
func (l *Limiter) askAt(ctx context.Context, sk string, limit Limit, cost, want int64, now time.Time, m *member, h *holdAsk, atMS int64) (Result, grant, bool, error) {
	if r, ok := l.precheck.check(sk, limit, cost, now); ok {
		l.stats.precheck.Add(1)
		return r, grant{}, false, nil
	}
	// Only the breaker of the key's shard: one master of a cluster down sends its own keys to
	// the failure mode, not every key.
	sh := l.breakers.of(ctx, sk)
	if sh.cb.State() == gobreaker.StateOpen {
		return l.degraded(sk, limit, cost, now, ErrCircuitOpen, h), grant{}, false, nil
	}

	c := l.calls.Get().(*call)
	c.prepare(sk, limit, cost, want, l.shares, h)
	if limit.Calendar != nil {
		c.prepareCalendar(sk, limit, cost, atMS, l.shares)
	}
	c.shard = sh
	if m != nil && !m.arrived && ctx.Err() != nil {
		// Given up before its batch left: decided here, never sent (as a queued call is).
		c.reset()
		l.calls.Put(c)
		m.pass(l)
		return l.degraded(sk, limit, cost, now, ctx.Err(), h), grant{}, false, nil
	}
	switch {
	case m.join(l, c):
		// In the gather's batch: whoever arrives last sends it.
	case l.tryInline(c):
		return l.finishCall(c, sk, limit, cost, now, h)
	default:
		select {
		case l.queue <- c:
		case <-l.quit:
			return Result{}, grant{}, false, ErrClosed
		case <-ctx.Done():
			c.reset()
			l.calls.Put(c)
			return l.degraded(sk, limit, cost, now, ctx.Err(), h), grant{}, false, nil
		}
	}
	select {
	case <-c.done:
	case <-ctx.Done():
		// The flusher still owns c. Once c is abandoned, the flusher gives back whatever Redis
		// grants it (see answer); if the flusher answered first, its answer stands.
		if c.state.CompareAndSwap(callPending, callAbandoned) {
			return l.degraded(sk, limit, cost, now, ctx.Err(), h), grant{}, false, nil
		}
		<-c.done
	case <-l.quit:
		// c may have been queued after the flushers drained the queue; once they and the
		// durable pipelines are gone, nobody else will answer it.
		<-l.stopped
		if c.state.CompareAndSwap(callPending, callAbandoned) {
			return l.degraded(sk, limit, cost, now, ErrClosed, h), grant{}, false, nil
		}
		<-c.done
	}
	return l.finishCall(c, sk, limit, cost, now, h)
}

// tryInline decides c on the caller's goroutine when nothing is queued and a pipeline slot is
// free: at low concurrency a hand-off to a flusher would only add latency.
func (l *Limiter) tryInline(c *call) bool {
	if len(l.queue) > 0 {
		return false
	}
	select {
	case l.slots <- struct{}{}:
	default:
		return false
	}
	c.self[0] = c
	l.run(c.self[:], c.cmd[:0])
	<-l.slots
	<-c.done
	return true
}

// finishCall turns a finished call into its Result and grant and recycles it.
func (l *Limiter) finishCall(c *call, sk string, limit Limit, cost int64, now time.Time, h *holdAsk) (Result, grant, bool, error) {
	res, g, err := c.res, c.g, c.err
	c.reset()
	l.calls.Put(c)
	if errors.Is(err, errCalendarMiss) {
		return Result{}, g, false, err // askCalendar asks again around g's clock
	}
	if err != nil {
		return l.degraded(sk, limit, cost, now, err, h), grant{}, false, nil
	}
	l.stats.redis.Add(1)
	if limit.Calendar != nil {
		start, end := limit.Calendar.PeriodMS(g.nowUS / 1000)
		res.Period = time.Duration(end-start) * time.Millisecond
	}
	if res.OverLimit && res.RetryAfter > 0 {
		// now was taken before the call, so the local refusal ends no later than Redis's would.
		// Where leases run, units another replica gives back can free the window before its
		// end: the refusal is repeated for one lease horizon at most, then Redis is asked again.
		var repeatFor time.Duration
		if l.leases != nil && limit.Algorithm.leases() && limit.Calendar == nil {
			repeatFor = l.opts.LeaseHorizon
		}
		if limit.Calendar != nil || limit.Window > longWindow {
			// A refusal of a long window lasts to its end, days away, while units other
			// replicas give back (a request another rule refused) may free it any time:
			// repeated a second at most, which still spares Redis all but one call a second.
			repeatFor = min(cmp.Or(repeatFor, longRefusalRepeat), longRefusalRepeat)
		}
		if h != nil {
			// Holds go back whenever a request ends, on any replica: a refused hold is
			// repeated briefly (this replica's own settles forget it at once).
			repeatFor = min(cmp.Or(repeatFor, holdRefusalRepeat), holdRefusalRepeat)
		}
		l.precheck.refuse(sk, limit, cost, res, now, repeatFor)
	}
	return res, g, true, nil
}

// counted records in res what a decision of cost counted, when Redis answered and admitted it
// (see GiveBack); a degraded decision says so itself.
func counted(res Result, limit Limit, g grant, cost int64, answered bool) Result {
	if answered && res.Allowed && g.units > 0 {
		res.spent = spentOf(limit, g, cost)
	}
	return res
}

// finish applies shadow mode: the decision stands in OverLimit, the request passes.
func finish(r Result, limit Limit) Result {
	if limit.Shadow {
		r.Allowed = true
	}
	return r
}
