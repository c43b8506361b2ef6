package decide

import (
	"context"
	"time"

	"github.com/redline-dev/redline/internal/limiter"
)

// Limiter is the engine a decision runs on: *limiter.Limiter, whose methods these are. Every
// engine has all of them: a decision, a dry run, a give-back, a hold and its settle, and an
// in-flight slot all go to the same limiter, so the engine never asks which it can do.
// (Plan and Explain are the uses of an Engine without a Limiter: they decide nothing.)
type Limiter interface {
	// Allow decides one limit.
	Allow(ctx context.Context, key string, limit limiter.Limit, cost int64) (limiter.Result, error)
	// AllowAll decides several limits with their Redis calls in one batch; the results of
	// Detached asks go to detached.
	AllowAll(ctx context.Context, asks []limiter.Ask, detached func(i int, r limiter.Result, err error)) ([]limiter.Result, []error)
	// Peek answers what Allow would, counting nothing (a dry run).
	Peek(ctx context.Context, key string, limit limiter.Limit, cost int64) (limiter.Result, error)
	// GiveBack gives back what admitted decisions counted.
	GiveBack(ctx context.Context, refunds []limiter.Refund) (int64, error)
	// Reserve holds between min and want units of a limit whose cost is known only after the
	// response; Settle ends the hold with what was used.
	Reserve(ctx context.Context, key string, limit limiter.Limit, min, want int64, ttl time.Duration) (limiter.Result, *limiter.Hold, error)
	Settle(ctx context.Context, h *limiter.Hold, used int64) (limiter.Settled, error)
	// Charge counts units used on a key without a hold for them (past the limit: debt).
	Charge(ctx context.Context, key string, limit limiter.Limit, units int64) (limiter.Settled, error)
	// Acquire takes a slot of an in-flight limit; Release gives it back. AcquireInTurn takes
	// one for a waiter, in its turn among the waiters of every replica; LeaveLine takes a
	// waiter that got none off the line.
	Acquire(ctx context.Context, key string, lim limiter.InFlight) (limiter.SlotResult, *limiter.Slot, error)
	AcquireInTurn(ctx context.Context, key string, lim limiter.InFlight, w *limiter.Waiter) (limiter.SlotResult, *limiter.Slot, error)
	LeaveLine(ctx context.Context, key string, w *limiter.Waiter)
	Release(ctx context.Context, s *limiter.Slot)
}

var _ Limiter = (*limiter.Limiter)(nil)
