package limiter

import (
	"time"

	lru "github.com/hashicorp/golang-lru/v2"
)

// precheck remembers keys Redis refused and until when, so that a client hammering a refused
// key costs no Redis call until its retry-after has passed. It is never the source of truth:
// it only repeats a refusal Redis made, and only for the same limit and at least the same cost.
// The LRU bounds its memory whatever the number of distinct keys.
type precheck struct {
	cache *lru.Cache[string, refusal]
}

type refusal struct {
	until   time.Time // the refusal is repeated until then
	retryAt time.Time // when Redis said the cost would fit again
	limit   Limit
	cost    int64
	res     Result
}

func newPrecheck(size int) (*precheck, error) {
	if size < 0 {
		return &precheck{}, nil
	}
	c, err := lru.New[string, refusal](size)
	if err != nil {
		return nil, err
	}
	return &precheck{cache: c}, nil
}

// check returns a local refusal if Redis refused this key, limit and no larger cost, and its
// retry-after has not passed.
func (p *precheck) check(key string, limit Limit, cost int64, now time.Time) (Result, bool) {
	if p.cache == nil {
		return Result{}, false
	}
	r, ok := p.cache.Get(key)
	if !ok {
		return Result{}, false
	}
	if !now.Before(r.until) || r.limit != sharedPart(limit) {
		p.cache.Remove(key)
		return Result{}, false
	}
	if cost < r.cost {
		return Result{}, false
	}
	left := r.retryAt.Sub(now)
	res := r.res
	res.RetryAfter = left
	res.ResetAfter = max(res.ResetAfter-r.res.RetryAfter+left, left)
	res.Source = SourcePrecheck
	return res, true
}

// refuse records a refusal from Redis.
// It is repeated for at most repeatFor (0: until its retry-after).
func (p *precheck) refuse(key string, limit Limit, cost int64, res Result, now time.Time, repeatFor time.Duration) {
	if p.cache == nil {
		return
	}
	r := refusal{until: now.Add(res.RetryAfter), retryAt: now.Add(res.RetryAfter), limit: sharedPart(limit), cost: cost, res: res}
	if repeatFor > 0 && repeatFor < res.RetryAfter {
		r.until = now.Add(repeatFor)
	}
	p.cache.Add(key, r)
}

// sharedPart is what of a limit Redis decided by: a change of the local replica count does not
// make a refusal from Redis stale.
func sharedPart(l Limit) Limit {
	l.Replicas = 0
	return l
}

// forget drops key's refusal: units went back to it (a hold's settle), so Redis may admit
// what it refused.
func (p *precheck) forget(key string) {
	if p.cache != nil {
		p.cache.Remove(key)
	}
}
