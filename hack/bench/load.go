package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Bounds cap every load loop in count and in time, whichever comes first.
type Bounds struct {
	// MaxOps is the most operations a cell runs.
	MaxOps int64
	// MaxTime is the longest a cell runs.
	MaxTime time.Duration
	// Warmup operations run before measuring (connections, scripts, caches).
	Warmup int
}

// Cell is the outcome of one closed-loop run at one concurrency.
type Cell struct {
	Concurrency int           `json:"concurrency"`
	Ops         int64         `json:"ops"`
	Errors      int64         `json:"errors"`
	Elapsed     time.Duration `json:"elapsedNs"`
	PerSec      float64       `json:"perSec"`
	P50         time.Duration `json:"p50Ns"`
	P99         time.Duration `json:"p99Ns"`
}

// op is one operation of a load loop; i numbers the operations from 0.
type op func(ctx context.Context, i int64) error

// closedLoop runs fn from conc goroutines, each starting its next operation when the previous
// ends, until b.MaxOps operations have started or b.MaxTime has passed. A failing operation is
// counted, not retried; more than 1% failures fail the cell.
func closedLoop(ctx context.Context, conc int, b Bounds, fn op) (Cell, error) {
	for i := range b.Warmup {
		if err := fn(ctx, -1-int64(i)); err != nil {
			return Cell{}, fmt.Errorf("warm-up: %w", err)
		}
	}
	deadline := time.Now().Add(b.MaxTime)
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	// Past the deadline, some clients fail at once (before ctx's timer fires): not failures.
	over := func() bool { return ctx.Err() != nil || !time.Now().Before(deadline) }
	lat := make([][]time.Duration, conc)
	var next, errs atomic.Int64
	var firstErr atomic.Pointer[error]
	var wg sync.WaitGroup
	start := time.Now()
	for g := range conc {
		wg.Go(func() {
			for !over() {
				i := next.Add(1) - 1
				if i >= b.MaxOps {
					return
				}
				t0 := time.Now()
				if err := fn(ctx, i); err != nil {
					if over() {
						return // cut by the time bound, not a failure
					}
					errs.Add(1)
					firstErr.CompareAndSwap(nil, &err)
					continue
				}
				lat[g] = append(lat[g], time.Since(t0))
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	all := slices.Concat(lat...)
	c := Cell{Concurrency: conc, Ops: int64(len(all)), Errors: errs.Load(), Elapsed: elapsed}
	var first error
	if p := firstErr.Load(); p != nil {
		first = *p
	}
	if first == nil {
		first = errors.New("none finished in time")
	}
	if len(all) == 0 {
		return c, fmt.Errorf("no operation succeeded: %w", first)
	}
	if c.Errors*100 > c.Ops {
		return c, fmt.Errorf("%d of %d operations failed, first: %w", c.Errors, c.Ops+c.Errors, first)
	}
	slices.Sort(all)
	c.PerSec = float64(len(all)) / elapsed.Seconds()
	c.P50 = all[len(all)/2]
	c.P99 = all[min(len(all)-1, len(all)*99/100)]
	return c, nil
}
