package limiter

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sony/gobreaker/v2"

	"github.com/redline-dev/redline/internal/calendar"
	"github.com/redline-dev/redline/internal/limiter/scripts"
)

// call is one decision on its way through a flusher. Calls are pooled: a decision should cost
// the garbage collector as little as possible.
type call struct {
	alg    Algorithm
	policy string // the limit's Policy, for OnRestore
	cal    bool   // a calendar window's (see calendar.go): no lease; a share of its period
	window time.Duration
	hold   int64    // ms grants wait in a state where a share was restored (ARGV[10])
	args   []any    // the whole EVALSHA command
	dlArg  int      // the index in args of the call's deadline (deadlineArg, one more per key a hold adds)
	known  int      // the index in args of the share this replica knows of (0: none), set as it leaves
	ask    *holdAsk // a Reserve's, or nil
	res    Result
	g      grant
	err    error
	state  atomic.Int32 // callPending until a flusher answers it or its caller gives up on it
	shard  *shard       // its key's shard, whose breaker it goes through
	done   chan struct{}
	self   [1]*call       // a batch of one, for deciding inline without allocating
	cmd    [1]redis.Cmder // its command buffer
	dur    Durability     // what its grant waits for (see durability.go)
	// unacked says why the wait that followed the call's script did not acknowledge it, ""
	// when it did or there was none.
	unacked string
	// calendar is a calendar window's, for the period its grant was counted in (recordShare).
	calendar *calendar.Calendar
	skey     string // the state key, which names its share
}

// decisionScripts are the algorithms' scripts, for scripts.Exec to load after NOSCRIPT.
var decisionScripts = append(scripts.All(), scripts.CalendarWindow(), scripts.CalendarReserve())

// shaArgs holds each script's SHA already boxed, so that building a command does not allocate it.
var shaArgs = func() map[Algorithm]any {
	m := make(map[Algorithm]any, len(decisionScripts))
	for _, s := range decisionScripts {
		m[Algorithm(s.Name)] = s.SHA
	}
	return m
}()

// A call's states. The flusher that answers a call and a caller that stops waiting for it race
// to move it out of callPending; whoever loses leaves it to the other.
const (
	callPending int32 = iota
	callAnswered
	callAbandoned
)

func (c *call) prepare(stateKey string, limit Limit, cost, want int64, sh *shares, ask *holdAsk) {
	c.alg, c.policy, c.window, c.cal, c.dur, c.unacked = limit.Algorithm, limit.Policy, limit.Window, false, limit.Durability, ""
	c.skey = stateKey
	c.state.Store(callPending)
	c.ask, c.dlArg, c.known = ask, deadlineArg, 0
	if ask == nil {
		c.args = append(c.args[:0], "evalsha", shaArgs[limit.Algorithm], 1, stateKey)
	} else {
		// A hold names its records' key too (see hold.go), and asks for up to want.
		if limit.Algorithm == SlidingWindowLog {
			// And the units its holds hold, beside the log.
			c.args = append(c.args[:0], "evalsha", shaArgs[limit.Algorithm], 3, stateKey, holdKey(stateKey), heldKey(stateKey))
			c.dlArg++
		} else {
			c.args = append(c.args[:0], "evalsha", shaArgs[limit.Algorithm], 2, stateKey, holdKey(stateKey))
		}
		c.dlArg++
		want = ask.want
	}
	c.args = limit.scriptArgs(c.args, cost, want)
	c.hold = 0
	switch {
	case sh != nil && limit.Algorithm.leases():
		var hold any
		c.hold, hold = sh.holdFor(limit)
		c.known = len(c.args) + 1
		c.args = append(c.args, sh.idArg, nil, nil, nil, hold, limit.Peers, nil)
	case ask != nil && limit.Algorithm.leases():
		c.args = append(c.args, "", 0, 0, 0, 0, 0, 0) // no share: the hold's ARGV stay at 13 and 14
	case ask != nil:
		c.args = append(c.args, want) // TokenBucket's ARGV[6], SlidingWindowLog's ARGV[5]
	}
	if ask != nil {
		c.args = append(c.args, ask.tag, ask.ttlMS, ask.maxOpen)
	}
}

func (c *call) reset() {
	clear(c.args)
	c.args = c.args[:0]
	c.res, c.g, c.err, c.self[0], c.cmd[0], c.shard, c.ask, c.calendar = Result{}, grant{}, nil, nil, nil, nil, nil, nil
}

// flusher sends queued decisions to Redis. It takes whatever has queued up while the previous
// pipeline was in flight, up to MaxBatch, so batches grow with concurrency and a lone caller
// waits for no timer.
func (l *Limiter) flusher() {
	defer l.wg.Done()
	batch := make([]*call, 0, l.opts.MaxBatch)
	cmds := make([]redis.Cmder, 0, l.opts.MaxBatch)
	for {
		select {
		case <-l.quit:
			l.drainClosed()
			return
		case c := <-l.queue:
			batch = append(batch[:0], c)
			l.slots <- struct{}{}
		fill:
			for len(batch) < l.opts.MaxBatch {
				select {
				case c := <-l.queue:
					batch = append(batch, c)
				default:
					break fill
				}
			}
			cmds = l.run(batch, cmds)
			<-l.slots
			clear(batch)
		}
	}
}

// drainClosed answers every queued call with ErrClosed so that no caller waits forever.
func (l *Limiter) drainClosed() {
	for {
		select {
		case c := <-l.queue:
			c.err = ErrClosed
			l.answer(c)
		default:
			return
		}
	}
}

// run decides one batch and wakes its callers. A batch may span shards (the masters of a
// cluster): each shard's calls go through their own breaker, in their own pipeline, all at once,
// and are answered as soon as their shard has answered, so that a shard that does not answer
// holds up only its own keys' callers.
func (l *Limiter) run(batch []*call, cmds []redis.Cmder) []redis.Cmder {
	for _, c := range batch[1:] {
		if c.shard != batch[0].shard {
			return l.runShards(batch, cmds)
		}
	}
	return l.runShard(batch, cmds)
}

// runShards decides a batch that spans shards, one goroutine per shard but the last.
func (l *Limiter) runShards(batch []*call, cmds []redis.Cmder) []redis.Cmder {
	slices.SortFunc(batch, func(a, b *call) int { return cmp.Compare(a.shard.id, b.shard.id) })
	var wg sync.WaitGroup
	for len(batch) > 0 {
		n := 1
		for n < len(batch) && batch[n].shard == batch[0].shard {
			n++
		}
		group := batch[:n]
		if batch = batch[n:]; len(batch) == 0 {
			cmds = l.runShard(group, cmds) // the last one on this goroutine, with its buffer
			break
		}
		// Only the calls of group are touched from now on: once answered, a call may be
		// recycled for another decision.
		wg.Go(func() { l.runShard(group, make([]redis.Cmder, 0, len(group))) })
	}
	wg.Wait()
	return cmds
}

// runShard decides the calls of one shard through its breaker and wakes their callers. Calls
// whose grants wait for an acknowledgement leave in a pipeline of their own, on a goroutine the
// flusher does not wait for: a lagging replica holds up neither the others' answers nor the
// flusher, only the callers of rules that asked to wait (each waits its timeout at most, plus
// the read timeout). Those goroutines hold a token of waitSem for their whole run, so there are
// never more of them than waiting pipelines allowed (waitConcurrency); when none is free the
// calls go with the others, without their wait, counted busy (see startDurable).
func (l *Limiter) runShard(group []*call, cmds []redis.Cmder) []redis.Cmder {
	if i := splitDurable(group); i >= 0 {
		durable := group[i:]
		switch l.startDurable(durable) {
		case durableStarted:
			group = group[:i]
		case durableClosed:
			for _, c := range durable {
				c.err = ErrClosed
				l.answer(c)
			}
			group = group[:i]
		case durableBusy:
			for _, c := range durable {
				c.unacked = UnackedBusy // pipeline sends these without a wait
			}
		}
		if len(group) == 0 {
			return cmds
		}
	}
	return l.runShard1(group, cmds)
}

// runShard1 is runShard for calls that all wait, or all do not.
func (l *Limiter) runShard1(group []*call, cmds []redis.Cmder) []redis.Cmder {
	sh := group[0].shard
	_, err := sh.cb.Execute(func() (struct{}, error) {
		if err := l.resume(sh); err != nil {
			return struct{}{}, err
		}
		var err error
		cmds, err = l.pipeline(group, cmds)
		return struct{}{}, err
	})
	switch {
	case errors.Is(err, gobreaker.ErrOpenState) || errors.Is(err, gobreaker.ErrTooManyRequests):
		for _, c := range group {
			c.err = ErrCircuitOpen
		}
	case err != nil:
		// Only a failure that opened the breaker, not a lone timeout: a failover or a restart
		// fails every call for seconds, and a re-assertion of every share after each stray
		// timeout would stall decisions for no loss. A loss without an outage shows in replies
		// (restored) and in heartbeats.
		if l.shares != nil && sh.cb.State() != gobreaker.StateClosed {
			sh.failing.Store(true)
		}
		for _, c := range group {
			if c.err == nil && c.res == (Result{}) {
				c.err = err // the calls never left: resume failed
			}
		}
	}
	for _, c := range group {
		l.answer(c)
	}
	return cmds
}

// answer wakes c's caller, or, when the caller gave up waiting, gives back what Redis granted
// it: nobody admits those units, and counted they would only under-admit to the window's end.
func (l *Limiter) answer(c *call) {
	if c.state.CompareAndSwap(callPending, callAnswered) {
		c.done <- struct{}{}
		return
	}
	// An abandoned hold is left to expire: its record in Redis gives it back at its deadline, and
	// a return now would give its units back twice.
	if c.err == nil && c.g.units > 0 && l.leases != nil && c.alg.leases() && !c.cal && c.ask == nil {
		start, _ := c.g.window(c.window)
		l.leases.queueReturn(leaseReturn{key: c.args[3].(string), policy: c.policy, window: c.window, windowStart: start, units: c.g.units})
	}
	c.reset()
	l.calls.Put(c)
}

// pipeline sends the batch's EVALSHAs in one round trip through scripts.Exec, which answers
// NOSCRIPT. It returns the first error that says Redis itself is in trouble, for the breaker.
// cmds is the caller's buffer, returned for reuse so that a batch costs no slice.
// A batch whose calls all wait for an acknowledgement (see runShard) sends the waits after them.
func (l *Limiter) pipeline(batch []*call, cmds []redis.Cmder) ([]redis.Cmder, error) {
	ctx := context.Background()
	durable := batch[0].dur.Mode != "" && batch[0].unacked != UnackedBusy
	sent := time.Now()
	deadline := noDeadline
	if l.opts.CallDeadline > 0 {
		if d := l.clock.deadline(sent.Add(l.opts.CallDeadline)); d > 0 {
			deadline = d
		}
	}
	local := l.opts.now() // before the scripts run: a hold's local deadline is never late
	for _, c := range batch {
		c.args[c.dlArg] = deadline
		if c.known > 0 {
			// Read as late as it can be: a share lowered (a settle, a return) after a call read
			// it, and in Redis before the call runs, would have the call restore what went back.
			start, cur, prev, lv := l.shares.known(c.skey)
			c.args[c.known], c.args[c.known+1], c.args[c.known+2], c.args[c.known+5] = start, cur, prev, lv
		}
		cmd := redis.NewIntSliceCmd(ctx, c.args...)
		cmd.SetFirstKeyPos(3)
		cmds = append(cmds, cmd)
	}
	var n scripts.Counts
	if durable {
		n = l.execDurable(ctx, batch, cmds)
	} else {
		n = scripts.Exec(ctx, l.client, cmds, decisionScripts)
	}
	read := time.Now()
	l.stats.pipelines.Add(n.RoundTrips)
	l.stats.scriptLoads.Add(n.Loads)
	var trip error
	for i, c := range batch {
		vals, err := cmds[i].(*redis.IntSliceCmd).Result()
		if err != nil {
			c.err = fmt.Errorf("running %s script: %w", c.alg, err)
			if trip == nil && isOutage(err) {
				trip = c.err
			}
			continue
		}
		if c.ask != nil {
			vals = c.ask.cut(c.alg, vals)
		}
		c.res, c.g, err = decodeReply(vals)
		l.clock.observe(c.g.nowUS, read)
		l.countAck(c)
		if err == nil && c.ask != nil && c.g.units > 0 {
			err = c.ask.granted(c, local)
		}
		if err == nil || errors.Is(err, errHeld) {
			l.recordShare(c)
		}
		switch {
		case errors.Is(err, errHeld):
			l.stats.held.Add(1)
			c.err = fmt.Errorf("running %s script: %w", c.alg, err)
		case errors.Is(err, errCalendarMiss):
			c.err = fmt.Errorf("running %s script: %w", c.alg, err)
		case errors.Is(err, errStale):
			l.stats.stale.Add(1)
			c.err = fmt.Errorf("running %s script: %w", c.alg, err)
		case err != nil:
			c.err = fmt.Errorf("decoding %s script reply: %w", c.alg, err)
		}
	}
	clear(cmds)
	return cmds[:0], trip
}

// isOutage says whether err means Redis cannot serve decisions now (as opposed to one command
// being wrong), so that it counts against the circuit breaker.
func isOutage(err error) bool {
	if rerr, ok := errors.AsType[redis.Error](err); ok {
		msg := strings.TrimPrefix(rerr.Error(), "ERR ")
		for _, p := range []string{"LOADING", "CLUSTERDOWN", "MASTERDOWN", "TRYAGAIN", "BUSY", "READONLY", "NOSCRIPT"} {
			if strings.HasPrefix(msg, p) {
				return true
			}
		}
		return false
	}
	return true // network errors, timeouts, pool exhaustion
}

// recordShare keeps what a call was granted as this replica's share, and starts a re-assertion
// when its reply shows that Redis lacked some of the shares: where one key lost counts, others
// did too.
func (l *Limiter) recordShare(c *call) {
	if l.shares == nil || !c.alg.leases() {
		return
	}
	if c.cal {
		l.recordCalendarShare(c)
		return
	}
	if c.g.units > 0 {
		start, _ := c.g.window(c.window)
		key := c.args[3].(string)
		switch {
		case c.ask != nil && !l.trackHold(c.ask, key, c.window, c.g.units):
			l.stats.unkept.Add(uint64(c.g.units))
		case !l.shares.add(key, c.alg, c.policy, c.window, c.hold, start, c.g.units):
			l.stats.unkept.Add(uint64(c.g.units))
			if c.ask != nil && c.ask.entry != nil {
				l.shares.holds.remove(c.ask.entry)
				c.ask.entry = nil
			}
		}
	}
	if c.g.restored > 0 {
		l.restored(c.policy, c.g.restored)
		l.Reassert()
	}
}

// resume re-asserts this replica's shares of sh's keys before the first pipeline on sh after it
// failed, or on a shard new to the limiter: the node that answers again may be another one (a
// promoted replica), or the same one restarted, holding less than this replica was granted, and
// a grant made before the re-assertion would admit this replica's lost units a second time.
// Flushers with calls for sh wait for the one that re-asserts; other shards' do not.
func (l *Limiter) resume(sh *shard) error {
	if l.shares == nil || !sh.failing.Load() {
		return nil
	}
	sh.resumeMu.Lock()
	defer sh.resumeMu.Unlock()
	if !sh.failing.Load() {
		return nil
	}
	if err := l.reassertShard(sh); err != nil {
		l.stats.reassertErrors.Add(1)
		if isOutage(err) {
			return fmt.Errorf("re-asserting shares before deciding again: %w", err)
		}
		l.Reassert() // some keys refused for another reason: the reasserter retries them
	}
	sh.failing.Store(false)
	return nil
}
