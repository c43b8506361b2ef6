package sidecartest

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/redline-dev/redline/internal/limiter"
)

// FakeLimiter is an engine for unit tests of the decision's pure logic (decide.Limiter),
// answering every decision with Decide and nothing else: AllowAll asks Decide for each limit
// concurrently, a Detached ask on its own afterwards; a dry run, a hold, a charge and a slot
// fail (ErrFake), as a limiter whose Redis is down would, so their failure modes decide; a
// give-back gives nothing back. Tests of the limiter's own work use Limiter (a real one).
type FakeLimiter struct {
	Decide func(ctx context.Context, key string, l limiter.Limit, cost int64) (limiter.Result, error)
}

// ErrFake is the error of what a FakeLimiter does not do.
var ErrFake = errors.New("the fake limiter only decides")

// Allow decides with Decide.
func (f FakeLimiter) Allow(ctx context.Context, key string, l limiter.Limit, cost int64) (limiter.Result, error) {
	return f.Decide(ctx, key, l, cost)
}

// AllowAll decides every ask with Decide, concurrently; Detached asks go to detached without
// holding up the others.
func (f FakeLimiter) AllowAll(ctx context.Context, asks []limiter.Ask, detached func(int, limiter.Result, error)) ([]limiter.Result, []error) {
	res, errs := make([]limiter.Result, len(asks)), make([]error, len(asks))
	var wg sync.WaitGroup
	for i, a := range asks {
		if a.Detached {
			dctx := context.WithoutCancel(ctx)
			go func() {
				r, err := f.Decide(dctx, a.Key, a.Limit, a.Cost)
				detached(i, r, err)
			}()
			continue
		}
		wg.Go(func() { res[i], errs[i] = f.Decide(ctx, a.Key, a.Limit, a.Cost) })
	}
	wg.Wait()
	return res, errs
}

// Peek fails: a fake cannot tell without counting.
func (FakeLimiter) Peek(context.Context, string, limiter.Limit, int64) (limiter.Result, error) {
	return limiter.Result{}, ErrFake
}

// GiveBack gives nothing back.
func (FakeLimiter) GiveBack(context.Context, []limiter.Refund) (int64, error) { return 0, nil }

// Reserve fails.
func (FakeLimiter) Reserve(context.Context, string, limiter.Limit, int64, int64, time.Duration) (limiter.Result, *limiter.Hold, error) {
	return limiter.Result{}, nil, ErrFake
}

// Settle fails.
func (FakeLimiter) Settle(context.Context, *limiter.Hold, int64) (limiter.Settled, error) {
	return limiter.Settled{}, ErrFake
}

// Charge fails.
func (FakeLimiter) Charge(context.Context, string, limiter.Limit, int64) (limiter.Settled, error) {
	return limiter.Settled{}, ErrFake
}

// Acquire fails.
func (FakeLimiter) Acquire(context.Context, string, limiter.InFlight) (limiter.SlotResult, *limiter.Slot, error) {
	return limiter.SlotResult{}, nil, ErrFake
}

// AcquireInTurn fails.
func (FakeLimiter) AcquireInTurn(context.Context, string, limiter.InFlight, *limiter.Waiter) (limiter.SlotResult, *limiter.Slot, error) {
	return limiter.SlotResult{}, nil, ErrFake
}

// LeaveLine does nothing: a fake keeps no line.
func (FakeLimiter) LeaveLine(context.Context, string, *limiter.Waiter) {}

// Release does nothing: a fake gives out no slots.
func (FakeLimiter) Release(context.Context, *limiter.Slot) {}
