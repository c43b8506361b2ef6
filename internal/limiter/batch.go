package limiter

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"
	"github.com/sony/gobreaker/v2"
)

// call is one decision on its way through a flusher. Calls are pooled: a decision should cost
// the garbage collector as little as possible.
type call struct {
	alg  Algorithm
	args []any // the whole EVALSHA command
	cmd  *redis.IntSliceCmd
	res  Result
	err  error
	done chan struct{}
	self [1]*call // a batch of one, for deciding inline without allocating
}

// shaArgs holds each script's SHA already boxed, so that building a command does not allocate it.
var shaArgs = func() map[Algorithm]any {
	m := make(map[Algorithm]any, len(Algorithms))
	for alg, sha := range ScriptSHAs() {
		m[alg] = sha
	}
	return m
}()

func (c *call) prepare(stateKey string, limit Limit, cost int64) {
	c.alg = limit.Algorithm
	c.args = append(c.args[:0], "evalsha", shaArgs[limit.Algorithm], 1, stateKey)
	c.args = limit.scriptArgs(c.args, cost)
}

func (c *call) reset() {
	clear(c.args)
	c.args = c.args[:0]
	c.cmd, c.res, c.err, c.self[0] = nil, Result{}, nil, nil
}

// flusher sends queued decisions to Redis. It takes whatever has queued up while the previous
// pipeline was in flight, up to MaxBatch, so batches grow with concurrency and a lone caller
// waits for no timer.
func (l *Limiter) flusher() {
	defer l.wg.Done()
	batch := make([]*call, 0, l.opts.MaxBatch)
	retry := make([]*call, 0, l.opts.MaxBatch)
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
			retry = l.run(batch, retry[:0])
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
			c.done <- struct{}{}
		default:
			return
		}
	}
}

// run decides one batch through the circuit breaker and wakes its callers.
func (l *Limiter) run(batch, retry []*call) []*call {
	_, err := l.breaker.Execute(func() (struct{}, error) {
		var err error
		retry, err = l.pipeline(batch, retry)
		return struct{}{}, err
	})
	if errors.Is(err, gobreaker.ErrOpenState) || errors.Is(err, gobreaker.ErrTooManyRequests) {
		for _, c := range batch {
			c.err = ErrCircuitOpen
		}
	}
	for _, c := range batch {
		c.done <- struct{}{}
	}
	return retry
}

// pipeline sends the batch's EVALSHAs in one pipeline (one per node on a cluster). Calls that
// meet NOSCRIPT (Redis restarted, failed over, or SCRIPT FLUSH) get their scripts loaded and are
// sent once more. It returns the first error that says Redis itself is in trouble, for the breaker.
func (l *Limiter) pipeline(batch, retry []*call) ([]*call, error) {
	ctx := context.Background()
	l.exec(ctx, batch)
	for _, c := range batch {
		if isNoScript(c.cmd.Err()) {
			retry = append(retry, c)
		}
	}
	if len(retry) > 0 {
		if err := l.loadScripts(ctx, retry); err != nil {
			for _, c := range retry {
				c.err = err
			}
		} else {
			l.exec(ctx, retry)
			l.evalLeftovers(ctx, retry)
		}
	}
	var trip error
	for _, c := range batch {
		if c.err != nil {
			if trip == nil && isOutage(c.err) {
				trip = c.err
			}
			continue
		}
		vals, err := c.cmd.Result()
		if err != nil {
			c.err = fmt.Errorf("running %s script: %w", c.alg, err)
			if trip == nil && isOutage(err) {
				trip = c.err
			}
			continue
		}
		if c.res, err = decodeReply(vals); err != nil {
			c.err = fmt.Errorf("decoding %s script reply: %w", c.alg, err)
		}
	}
	clear(retry)
	return retry[:0], trip
}

// exec sends calls as one pipeline, or as a plain command when there is only one: a lone
// caller should not pay for pipeline bookkeeping.
func (l *Limiter) exec(ctx context.Context, calls []*call) {
	if len(calls) == 1 {
		c := calls[0]
		c.cmd = redis.NewIntSliceCmd(ctx, c.args...)
		c.cmd.SetFirstKeyPos(3)
		_ = l.client.Process(ctx, c.cmd) // the error is read from the command
		l.stats.pipelines.Add(1)
		return
	}
	pipe := l.client.Pipeline()
	for _, c := range calls {
		c.cmd = redis.NewIntSliceCmd(ctx, c.args...)
		c.cmd.SetFirstKeyPos(3)
		_ = pipe.Process(ctx, c.cmd)
	}
	_, _ = pipe.Exec(ctx) // errors are read per command
	l.stats.pipelines.Add(1)
}

// evalLeftovers sends the script body with EVAL for calls that met NOSCRIPT even after SCRIPT
// LOAD, which only happens when scripts are flushed again between the load and the retry. It is
// the last resort that keeps a decision from failing; EVAL also caches the script again.
func (l *Limiter) evalLeftovers(ctx context.Context, calls []*call) {
	var pipe redis.Pipeliner
	for _, c := range calls {
		if !isNoScript(c.cmd.Err()) {
			continue
		}
		if pipe == nil {
			pipe = l.client.Pipeline()
		}
		s, _ := ScriptFor(c.alg)
		args := make([]any, len(c.args))
		copy(args, c.args)
		args[0], args[1] = "eval", s.Source
		c.cmd = redis.NewIntSliceCmd(ctx, args...)
		c.cmd.SetFirstKeyPos(3)
		_ = pipe.Process(ctx, c.cmd)
	}
	if pipe != nil {
		_, _ = pipe.Exec(ctx)
		l.stats.pipelines.Add(1)
	}
}

// loadScripts loads the scripts of calls that met NOSCRIPT; SCRIPT LOAD reaches every master
// of a cluster.
func (l *Limiter) loadScripts(ctx context.Context, calls []*call) error {
	var seen [8]Algorithm
	n := 0
	for _, c := range calls {
		dup := false
		for _, a := range seen[:n] {
			dup = dup || a == c.alg
		}
		if dup || n == len(seen) {
			continue
		}
		seen[n] = c.alg
		n++
		s, _ := ScriptFor(c.alg)
		if err := l.client.ScriptLoad(ctx, s.Source).Err(); err != nil {
			return fmt.Errorf("loading script %s after NOSCRIPT: %w", c.alg, err)
		}
		l.stats.scriptLoads.Add(1)
	}
	return nil
}

func isNoScript(err error) bool {
	return err != nil && redis.HasErrorPrefix(err, "NOSCRIPT")
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
