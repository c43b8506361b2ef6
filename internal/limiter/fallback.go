package limiter

import (
	"math"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"
	"golang.org/x/time/rate"
)

// fallback holds the local limiters LocalFallback enforces while Redis is unreachable: per key,
// a token bucket of the limit's rate divided by the live replica count, so that all replicas
// together admit about what the shared limit would. The LRU bounds its memory.
type fallback struct {
	cache *lru.Cache[string, *localLimit]
}

type localLimit struct {
	limit    Limit
	replicas int64
	lim      *rate.Limiter
}

func newFallback(size int) (*fallback, error) {
	c, err := lru.New[string, *localLimit](size)
	if err != nil {
		return nil, err
	}
	return &fallback{cache: c}, nil
}

// degraded decides without Redis, by the limit's failure mode. cause says why Redis was not asked.
func (l *Limiter) degraded(key string, limit Limit, cost int64, now time.Time, cause error) Result {
	l.stats.degraded.Add(1)
	switch limit.FailureMode {
	case FailOpen:
		return Result{Allowed: true, Remaining: limit.capacity(), Source: SourceFailOpen, Err: cause}
	case FailClosed:
		return Result{
			OverLimit:  true,
			RetryAfter: l.opts.BreakerOpenFor,
			ResetAfter: l.opts.BreakerOpenFor,
			Source:     SourceFailClosed,
			Err:        cause,
		}
	}
	return l.fallback.allow(key, limit, cost, l.replicas.Load(), now, cause)
}

// allow decides against the local share of the limit. Local limiters live on after Redis
// returns, so a flapping Redis does not refill them on every outage.
func (f *fallback) allow(key string, limit Limit, cost, replicas int64, now time.Time, cause error) Result {
	replicas = max(replicas, 1)
	ll, ok := f.cache.Get(key)
	if !ok || ll.limit != limit || ll.replicas != replicas {
		share := float64(limit.Requests) / float64(replicas)
		burst := int(math.Max(1, math.Floor(float64(limit.capacity())/float64(replicas))))
		ll = &localLimit{
			limit:    limit,
			replicas: replicas,
			lim:      rate.NewLimiter(rate.Limit(share/limit.Window.Seconds()), burst),
		}
		if prev, found, _ := f.cache.PeekOrAdd(key, ll); found && prev.limit == limit && prev.replicas == replicas {
			ll = prev // another caller created it first
		} else if found {
			f.cache.Add(key, ll)
		}
	}
	res := Result{Source: SourceFallback, Err: cause}
	if cost > int64(ll.lim.Burst()) {
		res.OverLimit = true
		res.RetryAfter = -1
		return res
	}
	if ll.lim.AllowN(now, int(cost)) {
		res.Allowed = true
		res.Remaining = int64(ll.lim.TokensAt(now))
		res.ResetAfter = tokenWait(ll.lim, float64(ll.lim.Burst()), now)
		return res
	}
	res.OverLimit = true
	res.RetryAfter = tokenWait(ll.lim, float64(cost), now)
	res.ResetAfter = tokenWait(ll.lim, float64(ll.lim.Burst()), now)
	return res
}

// tokenWait is how long until lim holds n tokens.
func tokenWait(lim *rate.Limiter, n float64, now time.Time) time.Duration {
	missing := n - lim.TokensAt(now)
	if missing <= 0 {
		return 0
	}
	return time.Duration(math.Ceil(missing / float64(lim.Limit()) * float64(time.Second)))
}
