package limiter

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sony/gobreaker/v2"

	"github.com/redline-dev/redline/internal/limiter/scripts"
)

// ErrPeekHeld is the error of a dry run while grants of the key wait for the replicas to
// restore what Redis lost (see shares.go): the decision would fall to the failure mode.
var ErrPeekHeld = errors.New("grants of this key wait while the replicas restore what Redis lost; a decision now is the failure mode's")

// Peek answers what Allow of cost units of key under limit would answer now, and counts
// nothing: no unit is taken from Redis nor from a lease, no lease is asked for, no key is
// written (the algorithms' read-only twins, lua/peek_*.lua, on Redis's clock and on the key
// the decision would use, so Cluster routes them alike). Its answer is the next decision's:
// from this limiter's unspent lease of the key when that covers cost, from its cache of
// refused keys while that refuses, and otherwise from Redis as a decision of exactly cost
// (a lease the decision might ask for beyond cost is not counted in Remaining).
//
// Unlike Allow, Peek does not decide by the failure mode: where Redis cannot answer (the
// breaker open, an error, a key whose grants wait) it returns the error, and nothing was
// counted anywhere.
func (l *Limiter) Peek(ctx context.Context, key string, limit Limit, cost int64) (Result, error) {
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
		return finish(Result{OverLimit: true, RetryAfter: -1, Source: SourceCapacity}, limit), nil
	}
	sk := limitKey(key, limit)
	now := l.opts.now()
	if l.leases != nil && limit.Algorithm.leases() {
		if r, ok := l.leases.peek(sk, limit, cost, now); ok {
			return finish(r, limit), nil
		}
	}
	if r, ok := l.precheck.check(sk, limit, cost, now); ok {
		return finish(r, limit), nil
	}
	if l.breakers.of(ctx, sk).cb.State() == gobreaker.StateOpen {
		return Result{}, ErrCircuitOpen
	}
	if limit.Calendar != nil {
		return l.peekCalendar(ctx, sk, limit, cost)
	}
	s, ok := scripts.PeekFor(string(limit.Algorithm))
	if !ok {
		return Result{}, fmt.Errorf("%w: no dry run for algorithm %q", ErrInvalidLimit, limit.Algorithm)
	}
	cmd := scripts.EvalSha(ctx, s, []string{sk}, limit.scriptArgs(nil, cost, cost)...)
	scripts.Exec(ctx, l.client, []redis.Cmder{cmd}, scripts.Peeks())
	n, err := cmd.Int64Slice()
	if err != nil {
		return Result{}, fmt.Errorf("dry run of %s on Redis: %w", limit.Algorithm, err)
	}
	res, _, err := decodeReply(n)
	if errors.Is(err, errHeld) {
		return Result{}, ErrPeekHeld
	}
	if err != nil {
		return Result{}, fmt.Errorf("dry run of %s on Redis: %w", limit.Algorithm, err)
	}
	return finish(res, limit), nil
}

// peek is what take would admit cost units of key from, without taking them: ok when the
// key's lease, granted under limit and in its window still, holds cost units.
func (ls *leases) peek(key string, limit Limit, cost int64, now time.Time) (Result, bool) {
	e, found := ls.cache.Peek(key)
	if !found {
		return Result{}, false
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if !sameLimit(e.limit, limit) || !now.Before(e.deadline) || e.units < cost {
		return Result{}, false
	}
	return Result{Allowed: true, Remaining: e.remaining + e.units - cost, ResetAfter: e.deadline.Sub(now), Source: SourceLease}, true
}
