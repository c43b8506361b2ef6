package limiter

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sony/gobreaker/v2"

	"github.com/redline-dev/redline/internal/limiter/scripts"
)

// call is one decision on its way through a flusher. Calls are pooled: a decision should cost
// the garbage collector as little as possible.
type call struct {
	alg    Algorithm
	window time.Duration
	hold   int64 // ms grants wait in a state where a share was restored (ARGV[10])
	args   []any // the whole EVALSHA command
	res    Result
	g      grant
	err    error
	state  atomic.Int32 // callPending until a flusher answers it or its caller gives up on it
	done   chan struct{}
	self   [1]*call       // a batch of one, for deciding inline without allocating
	cmd    [1]redis.Cmder // its command buffer
}

// decisionScripts are the algorithms' scripts, for scripts.Exec to load after NOSCRIPT.
var decisionScripts = scripts.All()

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

func (c *call) prepare(stateKey string, limit Limit, cost, want int64, sh *shares) {
	c.alg, c.window = limit.Algorithm, limit.Window
	c.state.Store(callPending)
	c.args = append(c.args[:0], "evalsha", shaArgs[limit.Algorithm], 1, stateKey)
	c.args = limit.scriptArgs(c.args, cost, want)
	c.hold = 0
	if sh != nil && limit.Algorithm.leases() {
		start, cur, prev := sh.known(stateKey)
		var hold any
		c.hold, hold = sh.holdFor(limit)
		c.args = append(c.args, sh.idArg, start, cur, prev, hold, limit.Peers)
	}
}

func (c *call) reset() {
	clear(c.args)
	c.args = c.args[:0]
	c.res, c.g, c.err, c.self[0], c.cmd[0] = Result{}, grant{}, nil, nil, nil
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

// run decides one batch through the circuit breaker and wakes its callers.
func (l *Limiter) run(batch []*call, cmds []redis.Cmder) []redis.Cmder {
	_, err := l.breaker.Execute(func() (struct{}, error) {
		if err := l.resume(); err != nil {
			return struct{}{}, err
		}
		var err error
		cmds, err = l.pipeline(batch, cmds)
		return struct{}{}, err
	})
	switch {
	case errors.Is(err, gobreaker.ErrOpenState) || errors.Is(err, gobreaker.ErrTooManyRequests):
		for _, c := range batch {
			c.err = ErrCircuitOpen
		}
	case err != nil:
		// Only a failure that opened the breaker, not a lone timeout: a failover or a restart
		// fails every call for seconds, and a re-assertion of every share after each stray
		// timeout would stall decisions for no loss. A loss without an outage shows in replies
		// (restored) and in heartbeats.
		if l.shares != nil && l.breaker.State() != gobreaker.StateClosed {
			l.failing.Store(true)
		}
		for _, c := range batch {
			if c.err == nil && c.res == (Result{}) {
				c.err = err // the batch never left: resume failed
			}
		}
	}
	for _, c := range batch {
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
	if c.err == nil && c.g.units > 0 && l.leases != nil && c.alg.leases() {
		start, _ := c.g.window(c.window)
		l.leases.queueReturn(leaseReturn{key: c.args[3].(string), window: c.window, windowStart: start, units: c.g.units})
	}
	c.reset()
	l.calls.Put(c)
}

// pipeline sends the batch's EVALSHAs in one round trip through scripts.Exec, which answers
// NOSCRIPT. It returns the first error that says Redis itself is in trouble, for the breaker.
// cmds is the caller's buffer, returned for reuse so that a batch costs no slice.
func (l *Limiter) pipeline(batch []*call, cmds []redis.Cmder) ([]redis.Cmder, error) {
	ctx := context.Background()
	sent := time.Now()
	deadline := noDeadline
	if l.opts.CallDeadline > 0 {
		if d := l.clock.deadline(sent.Add(l.opts.CallDeadline)); d > 0 {
			deadline = d
		}
	}
	for _, c := range batch {
		c.args[deadlineArg] = deadline
		cmd := redis.NewIntSliceCmd(ctx, c.args...)
		cmd.SetFirstKeyPos(3)
		cmds = append(cmds, cmd)
	}
	n := scripts.Exec(ctx, l.client, cmds, decisionScripts)
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
		c.res, c.g, err = decodeReply(vals)
		l.clock.observe(c.g.nowUS, read)
		if err == nil || errors.Is(err, errHeld) {
			l.recordShare(c)
		}
		switch {
		case errors.Is(err, errHeld):
			l.stats.held.Add(1)
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
	if c.g.units > 0 {
		start, _ := c.g.window(c.window)
		if !l.shares.add(c.args[3].(string), c.alg, c.window, c.hold, start, c.g.units) {
			l.stats.unkept.Add(uint64(c.g.units))
		}
	}
	if c.g.restored > 0 {
		l.restored(c.args[3].(string), c.g.restored)
		l.Reassert()
	}
}

// resume re-asserts every share before the first pipeline after Redis failed: the Redis that
// answers again may be another node, or the same one restarted, holding less than this replica
// was granted, and a grant made before the re-assertion would admit this replica's lost units
// a second time. Flushers wait for the one that re-asserts.
func (l *Limiter) resume() error {
	if !l.failing.Load() {
		return nil
	}
	l.resumeMu.Lock()
	defer l.resumeMu.Unlock()
	if !l.failing.Load() {
		return nil
	}
	if err := l.reassertAll(); err != nil {
		l.stats.reassertErrors.Add(1)
		if isOutage(err) {
			return fmt.Errorf("re-asserting shares before deciding again: %w", err)
		}
		l.Reassert() // some keys refused for another reason: the reasserter retries them
	}
	l.failing.Store(false)
	return nil
}
