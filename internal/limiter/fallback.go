package limiter

import (
	"math"
	"sync"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"
)

// fallback holds the local limiters LocalFallback enforces while Redis is unreachable: per key,
// a sliding window counter that admits the limit divided by the live replica count, so that all
// replicas together admit about what the shared limit would. The LRU bounds its memory.
//
// A sliding window rather than a token bucket: a bucket that starts full and refills admits up
// to twice its share in the first window of an outage, which is exactly when the shared limit
// is no longer watching.
type fallback struct {
	cache *lru.Cache[string, *localWindow]
}

func newFallback(size int) (*fallback, error) {
	c, err := lru.New[string, *localWindow](size)
	if err != nil {
		return nil, err
	}
	return &fallback{cache: c}, nil
}

// degraded decides without Redis, by the limit's failure mode. cause says why Redis was not asked.
// h, a Reserve's, hears how many units the failure mode holds: want when it fails open, what the
// local window affords up to want under LocalFallback.
func (l *Limiter) degraded(key string, limit Limit, cost int64, now time.Time, cause error, h *holdAsk) Result {
	l.stats.degraded.Add(1)
	switch limit.FailureMode {
	case FailureModeOpen:
		if h != nil {
			h.degradedUnits = h.want
		}
		return Result{Allowed: true, Remaining: limit.Capacity(), Source: SourceFailOpen, Err: cause}
	case FailureModeClosed:
		return Result{
			OverLimit:  true,
			RetryAfter: l.opts.breakerOpenFor,
			ResetAfter: l.opts.breakerOpenFor,
			Source:     SourceFailClosed,
			Err:        cause,
		}
	}
	replicas := limit.Replicas
	if replicas < 1 {
		replicas = l.opts.FallbackReplicas // no heartbeat heard yet: the workload's own count
	}
	if h == nil {
		return l.fallback.allow(key, limit, cost, replicas, now, cause)
	}
	res, w, granted := l.fallback.take(key, limit, cost, h.want, replicas, now, cause)
	if granted > 0 {
		h.degradedUnits, h.local = granted, w
	}
	return res
}

// allow decides cost units against the local share of the limit. Local counters live on after
// Redis returns, so a flapping Redis does not hand out a fresh share on every outage.
// An admitted Result says what it counted, for GiveBack.
func (f *fallback) allow(key string, limit Limit, cost, replicas int64, now time.Time, cause error) Result {
	r, w, granted := f.take(key, limit, cost, cost, replicas, now, cause)
	if granted > 0 {
		r.spent = spent{units: granted, local: w, localAt: w.startOf(now)}
	}
	return r
}

// take is allow granting up to want units (at least cost) when cost fits, for a hold: it returns
// the window it counted them in, and how many.
func (f *fallback) take(key string, limit Limit, cost, want, replicas int64, now time.Time, cause error) (Result, *localWindow, int64) {
	replicas = max(replicas, 1)
	limit.Peers = 0 // a hold's business, not the local window's
	w, ok := f.cache.Get(key)
	if !ok || w.limit != limit || w.replicas != replicas {
		nw := &localWindow{
			limit:    limit,
			replicas: replicas,
			share:    max(1, limit.Capacity()/replicas),
			window:   limit.Window,
		}
		if limit.Window > longWindow && limit.Window <= maxLongWindow {
			// A long window (a month's quota, a calendar period) kept locally for its whole
			// length would hand each replica its share of the whole quota again on every
			// outage, on top of what Redis already counted: locally it is enforced at its
			// daily pace instead, a day's share of the quota per day of outage. Up to the
			// longest window the API has (a month); longer ones are the engine's own.
			nw.window = longWindow
			nw.share = max(1, int64(float64(limit.Capacity())*float64(longWindow)/float64(limit.Window))/replicas)
		}
		if prev, found, _ := f.cache.PeekOrAdd(key, nw); found && prev.limit == limit && prev.replicas == replicas {
			nw = prev // another caller created it first
		} else if found {
			f.cache.Add(key, nw)
		}
		w = nw
	}
	res := Result{Source: SourceFallback, Err: cause}
	var granted int64
	granted, res.Remaining, res.RetryAfter, res.ResetAfter = w.allow(now, cost, want)
	res.Allowed = granted > 0
	res.OverLimit = !res.Allowed
	return res, w, granted
}

// localWindow is an in-memory sliding window counter: the previous window's count weighted by
// its overlap with the sliding window, plus the current window's count. It never admits more
// than share in any window.
type localWindow struct {
	limit    Limit
	replicas int64
	share    int64
	window   time.Duration

	mu        sync.Mutex
	start     time.Time // start of the current window
	cur, prev int64
}

// roll moves the window to the one now is in; w.mu is held.
func (w *localWindow) roll(now time.Time) {
	switch elapsed := now.Sub(w.start); {
	case w.start.IsZero() || elapsed >= 2*w.window:
		w.start, w.cur, w.prev = now, 0, 0
	case elapsed >= w.window:
		w.start, w.prev, w.cur = w.start.Add(w.window), w.cur, 0
	}
}

// adjust settles a hold the window granted: delta units more (a debt, counted now) or fewer
// (given back to the window they were counted in, if it still weighs).
func (w *localWindow) adjust(now time.Time, counted time.Time, delta int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.roll(now)
	switch {
	case delta > 0:
		w.cur += delta
	case counted.Equal(w.start):
		w.cur = max(w.cur+delta, 0)
	case counted.Equal(w.start.Add(-w.window)):
		w.prev = max(w.prev+delta, 0)
	}
}

// startOf returns the start of the window now is in.
func (w *localWindow) startOf(now time.Time) time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.roll(now)
	return w.start
}

// allow grants between cost and want units when cost fits (granted 0 when it does not).
func (w *localWindow) allow(now time.Time, cost, want int64) (granted, remaining int64, retry, reset time.Duration) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.roll(now)
	elapsed := now.Sub(w.start)
	weight := float64(w.window-elapsed) / float64(w.window)
	estimate := float64(w.prev)*weight + float64(w.cur)
	reset = 2*w.window - elapsed
	if cost > w.share {
		return 0, remainingOf(w.share, estimate), -1, reset
	}
	if estimate+float64(cost) > float64(w.share) {
		room := float64(w.share - cost - w.cur)
		if room >= 0 && w.prev > 0 {
			// Wait in this window until prev's weight has shrunk enough.
			retry = time.Duration(math.Ceil(float64(w.window)*(1-room/float64(w.prev)))) - elapsed
		} else {
			// Wait for the next window, where cur becomes the weighted previous count.
			retry = w.window - elapsed
			if w.cur > 0 {
				retry += time.Duration(math.Ceil(float64(w.window) * (1 - float64(w.share-cost)/float64(w.cur))))
			}
		}
		return 0, remainingOf(w.share, estimate), max(retry, time.Millisecond), reset
	}
	granted = max(min(want, int64(math.Floor(float64(w.share)-estimate))), cost)
	w.cur += granted
	return granted, remainingOf(w.share, estimate+float64(granted)), 0, reset
}

func remainingOf(share int64, estimate float64) int64 {
	return max(int64(math.Floor(float64(share)-estimate)), 0)
}
