package limiter_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redline-dev/redline/internal/limiter"
)

func gatherAsks(t *testing.T, n int) []limiter.Ask {
	algs := []limiter.Algorithm{limiter.SlidingWindowCounter, limiter.FixedWindow, limiter.TokenBucket, limiter.SlidingWindowLog}
	asks := make([]limiter.Ask, n)
	for i := range asks {
		asks[i] = limiter.Ask{Key: uniqueKey(t), Limit: limiter.Limit{Algorithm: algs[i%len(algs)], Requests: 5, Window: time.Minute}, Cost: 1}
	}
	return asks
}

// A request that matches several rules (or a rule and its candidate) makes one round trip.
func TestAllowAllSendsOneBatch(t *testing.T) {
	ctx := context.Background()
	l := newLimiter(t, newClient(t, shared.URL()), limiter.TestOptions{})
	asks := gatherAsks(t, 4)
	l.AllowAll(ctx, gatherAsks(t, 4), nil) // the scripts are loaded: no NOSCRIPT round trip below
	for i := range 6 {
		before := l.Stats().Pipelines
		res, errs := l.AllowAll(ctx, asks, nil)
		if trips := l.Stats().Pipelines - before; trips != 1 {
			t.Fatalf("decision %d: %d asks took %d round trips, want 1", i, len(asks), trips)
		}
		for j, r := range res {
			if errs[j] != nil || r.Err != nil {
				t.Fatalf("decision %d ask %d: %v %v", i, j, errs[j], r.Err)
			}
			if want := i < 5; r.Allowed != want {
				t.Fatalf("decision %d ask %d (%s): allowed %v, want %v (limit 5)", i, j, asks[j].Limit.Algorithm, r.Allowed, want)
			}
			if r.Source != limiter.SourceRedis {
				t.Fatalf("decision %d ask %d: source %s, want redis", i, j, r.Source)
			}
		}
	}
	// Refused once by Redis, the keys are refused by the pre-check: no round trip at all.
	before := l.Stats().Pipelines
	res, _ := l.AllowAll(ctx, asks, nil)
	if trips := l.Stats().Pipelines - before; trips != 0 {
		t.Fatalf("over the limit: %d round trips, want 0 (the pre-check answers)", trips)
	}
	for j, r := range res {
		if r.Allowed || r.Source != limiter.SourcePrecheck {
			t.Fatalf("over the limit, ask %d: %+v, want refused by the pre-check", j, r)
		}
	}
	// Beside it, the same asks made by concurrent Allow calls: each caller inlines its own.
	var trips uint64
	for range 5 {
		asks := gatherAsks(t, 4)
		before := l.Stats().Pipelines
		var wg sync.WaitGroup
		for _, a := range asks {
			wg.Go(func() { _, _ = l.Allow(ctx, a.Key, a.Limit, a.Cost) })
		}
		wg.Wait()
		trips += l.Stats().Pipelines - before
	}
	t.Logf("4 rules per request: AllowAll 1 round trip per request; concurrent Allow calls %.1f", float64(trips)/5)
}

// What needs no Redis call is answered without the others: a refused cost, an invalid limit.
func TestAllowAllAnswersWhatNeedsNoRedisOnItsOwn(t *testing.T) {
	ctx := context.Background()
	l := newLimiter(t, newClient(t, shared.URL()), limiter.TestOptions{})
	asks := gatherAsks(t, 3)
	asks[1].Cost = 6                       // over the capacity: refused without a call
	asks[2].Limit.Requests = 0             // invalid
	l.AllowAll(ctx, gatherAsks(t, 1), nil) // scripts loaded
	before := l.Stats().Pipelines
	res, errs := l.AllowAll(ctx, asks, nil)
	if trips := l.Stats().Pipelines - before; trips != 1 {
		t.Fatalf("%d round trips, want 1 (only the first ask needs Redis)", trips)
	}
	if !res[0].Allowed || res[1].Allowed || res[1].Source != limiter.SourceCapacity || !errors.Is(errs[2], limiter.ErrInvalidLimit) {
		t.Fatalf("results %+v errors %v", res, errs)
	}
}

// Leases answer from memory inside a gather too: a leased key does not wait for the batch.
func TestAllowAllWithLeases(t *testing.T) {
	ctx := context.Background()
	l := newLimiter(t, newClient(t, shared.URL()), limiter.TestOptions{LeaseHorizon: 2 * time.Second})
	leased := limiter.Ask{Key: uniqueKey(t), Limit: limiter.Limit{Algorithm: limiter.FixedWindow, Requests: 100000, Window: time.Hour, Replicas: 1}, Cost: 1}
	// Warm the lease: a key leases once it is seen more than once in its horizon.
	for range 50 {
		if _, err := l.Allow(ctx, leased.Key, leased.Limit, 1); err != nil {
			t.Fatal(err)
		}
	}
	before := l.Stats()
	var admitted int
	for range 20 {
		res, _ := l.AllowAll(ctx, []limiter.Ask{leased, leased}, nil)
		for _, r := range res {
			if r.Allowed {
				admitted++
			}
		}
	}
	after := l.Stats()
	if admitted != 40 {
		t.Fatalf("admitted %d of 40 under a limit of 100000", admitted)
	}
	if after.LeaseDecisions-before.LeaseDecisions < 30 {
		t.Fatalf("%d of 40 decisions from leases: a gather must not bypass them", after.LeaseDecisions-before.LeaseDecisions)
	}
}

// Concurrent gathers on one key admit exactly the limit, with callers that give up midway.
func TestAllowAllIsExactUnderConcurrency(t *testing.T) {
	l := newLimiter(t, newClient(t, shared.URL()), limiter.TestOptions{})
	key := uniqueKey(t)
	other := uniqueKey(t)
	lim := limiter.Limit{Algorithm: limiter.SlidingWindowCounter, Requests: 300, Window: time.Hour}
	var admitted, otherAdmitted atomic.Int64
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Go(func() {
			for i := range 60 {
				ctx, cancel := context.Background(), func() {}
				if (g+i)%7 == 0 {
					ctx, cancel = context.WithCancel(context.Background())
					cancel() // given up before it started: decided by the failure mode
				}
				res, _ := l.AllowAll(ctx, []limiter.Ask{{Key: key, Limit: lim, Cost: 1}, {Key: other, Limit: lim, Cost: 1}}, nil)
				cancel()
				if res[0].Allowed && res[0].Source == limiter.SourceRedis {
					admitted.Add(1)
				}
				if res[1].Allowed && res[1].Source == limiter.SourceRedis {
					otherAdmitted.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if admitted.Load() > 300 || otherAdmitted.Load() > 300 {
		t.Fatalf("admitted by Redis %d and %d, over the limit of 300", admitted.Load(), otherAdmitted.Load())
	}
	// 960 asks per key, 1 in 7 cancelled: well over 300 reached Redis; all of its admits counted.
	if admitted.Load() != 300 || otherAdmitted.Load() != 300 {
		t.Fatalf("admitted by Redis %d and %d, want exactly 300 each", admitted.Load(), otherAdmitted.Load())
	}
}

func TestAllowAllAfterClose(t *testing.T) {
	l := newLimiter(t, newClient(t, shared.URL()), limiter.TestOptions{})
	l.Close()
	_, errs := l.AllowAll(context.Background(), gatherAsks(t, 3), nil)
	for i, err := range errs {
		if !errors.Is(err, limiter.ErrClosed) {
			t.Fatalf("ask %d after Close: %v, want ErrClosed", i, err)
		}
	}
}

// A detached ask (a candidate) rides in the batch when the others need Redis, and holds up no
// one when they do not: the caller returns on the others' answers.
func TestAllowAllDoesNotWaitForDetachedAsks(t *testing.T) {
	ctx := context.Background()
	l := newLimiter(t, newClient(t, shared.URL()), limiter.TestOptions{})
	l.AllowAll(ctx, gatherAsks(t, 2), nil)
	asks := gatherAsks(t, 2)
	asks[1].Detached = true
	got := make(chan limiter.Result, 1)
	before := l.Stats().Pipelines
	res, errs := l.AllowAll(ctx, asks, func(i int, r limiter.Result, err error) {
		if i != 1 || err != nil {
			t.Errorf("detached result of ask %d: %v", i, err)
		}
		got <- r
	})
	if errs[0] != nil || !res[0].Allowed || res[1] != (limiter.Result{}) {
		t.Fatalf("results %+v %v: want the first decided, the detached one zero", res, errs)
	}
	if r := <-got; !r.Allowed || r.Source != limiter.SourceRedis {
		t.Fatalf("detached result %+v", r)
	}
	if trips := l.Stats().Pipelines - before; trips != 1 {
		t.Fatalf("%d round trips, want 1: the detached ask rides in the batch", trips)
	}

	// The first ask answered by the pre-check: its caller returns without waiting for the
	// detached ask at all. Its result function blocks until AllowAll has returned: were
	// AllowAll waiting for it, this would never end.
	over := asks[0]
	for range 6 {
		l.AllowAll(ctx, []limiter.Ask{over}, nil)
	}
	returned := make(chan struct{})
	done := make(chan limiter.Result, 1)
	res, _ = l.AllowAll(ctx, []limiter.Ask{over, {Key: uniqueKey(t), Limit: over.Limit, Cost: 1, Detached: true}}, func(_ int, r limiter.Result, _ error) {
		<-returned
		done <- r
	})
	close(returned)
	if res[0].Source != limiter.SourcePrecheck {
		t.Fatalf("first ask %+v, want refused by the pre-check", res[0])
	}
	if r := <-done; !r.Allowed || r.Source != limiter.SourceRedis {
		t.Fatalf("detached result %+v, want admitted by Redis", r)
	}
}

// Detached asks in flight are bounded: beyond MaxDetached the next one is decided with the
// others, before AllowAll returns, so a flood whose rules answer locally while Redis is slow
// cannot leave a goroutine behind per request.
func TestAllowAllBoundsDetachedAsks(t *testing.T) {
	ctx := context.Background()
	l := newLimiter(t, newClient(t, shared.URL()), limiter.TestOptions{MaxDetached: 1})
	lim := limiter.Limit{Algorithm: limiter.FixedWindow, Requests: 100, Window: time.Minute}
	release := make(chan struct{})
	held := make(chan struct{})
	// The first detached ask holds the only slot until released (its result function blocks).
	l.AllowAll(ctx, []limiter.Ask{{Key: uniqueKey(t), Limit: lim, Cost: 1}, {Key: uniqueKey(t), Limit: lim, Cost: 1, Detached: true}},
		func(int, limiter.Result, error) { close(held); <-release })
	<-held
	// The ask waited for is refused without Redis (a cost over the capacity) and the detached
	// one needs a round trip: only the bound makes AllowAll wait for it.
	var got atomic.Int64
	res, errs := l.AllowAll(ctx, []limiter.Ask{{Key: uniqueKey(t), Limit: lim, Cost: 101}, {Key: uniqueKey(t), Limit: lim, Cost: 1, Detached: true}},
		func(i int, r limiter.Result, err error) {
			if i == 1 && err == nil && r.Allowed {
				got.Add(1)
			}
		})
	if got.Load() != 1 {
		t.Fatalf("with the only detached slot taken, the detached ask's result came %d times before AllowAll returned, want once", got.Load())
	}
	if errs[0] != nil || res[0].Allowed || res[0].Source != limiter.SourceCapacity {
		t.Fatalf("the ask waited for: %+v %v, want refused by its capacity", res[0], errs[0])
	}
	close(release)
}
