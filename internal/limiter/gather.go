package limiter

import (
	"context"
	"sync"

	"github.com/redis/go-redis/v9"
)

// AllowAll decides every ask as Allow decides it, concurrently, and sends the Redis calls they
// need in one batch: one round trip for all of them (one per shard on a cluster), not one each.
// A request that matches several rules, or a rule and its candidate limit, waits for one
// round trip. An ask that needs no Redis call (a lease, the pre-check, an open breaker, a
// refused cost) is answered without waiting for the others' batch; one that waits for another
// caller's grant of its key leaves the batch and decides on its own. It returns the results of
// the asks that are not Detached (zero for those), whose results go to detached, which may be
// nil when there are none. At most Options.maxDetached detached asks are in flight; beyond
// them one is decided with the others, its result still going to detached, before AllowAll
// returns.
func (l *Limiter) AllowAll(ctx context.Context, asks []Ask, detached func(i int, r Result, err error)) ([]Result, []error) {
	res := make([]Result, len(asks))
	errs := make([]error, len(asks))
	if len(asks) == 0 {
		return res, errs
	}
	if len(asks) == 1 && !asks[0].Detached {
		res[0], errs[0] = l.Allow(ctx, asks[0].Key, asks[0].Limit, asks[0].Cost)
		return res, errs
	}
	g := &gather{left: len(asks), batch: make([]*call, 0, len(asks))}
	members := make([]member, len(asks))
	inline := -1 // the first ask waited for, decided on the caller's goroutine
	var wg sync.WaitGroup
	for i, a := range asks {
		members[i].g = g
		switch {
		case a.Detached && l.takeDetached():
			dctx := context.WithoutCancel(ctx)
			go func() {
				defer func() { <-l.detached }()
				r, err := l.allow(dctx, a.Key, a.Limit, a.Cost, &members[i])
				if detached != nil {
					detached(i, r, err)
				}
			}()
		case a.Detached:
			// Every detached slot is taken: decided with the others, the caller waiting.
			wg.Go(func() {
				r, err := l.allow(ctx, a.Key, a.Limit, a.Cost, &members[i])
				if detached != nil {
					detached(i, r, err)
				}
			})
		case inline < 0:
			inline = i
		default:
			wg.Go(func() { res[i], errs[i] = l.allow(ctx, a.Key, a.Limit, a.Cost, &members[i]) })
		}
	}
	if inline >= 0 {
		a := asks[inline]
		res[inline], errs[inline] = l.allow(ctx, a.Key, a.Limit, a.Cost, &members[inline])
	}
	wg.Wait()
	return res, errs
}

// takeDetached takes a slot for a detached ask, if one is free.
func (l *Limiter) takeDetached() bool {
	select {
	case l.detached <- struct{}{}:
		return true
	default:
		return false
	}
}

// gather collects the Redis calls of the decisions of one AllowAll into one batch, which the
// last of them to arrive sends.
type gather struct {
	mu    sync.Mutex
	left  int // members yet to arrive
	batch []*call
}

// member is one decision of a gather. Each arrives exactly once: with its call (join) or
// without one (pass). A nil member belongs to no gather.
type member struct {
	g       *gather
	arrived bool
}

// pass arrives without a call, when m has not arrived yet.
func (m *member) pass(l *Limiter) {
	if m == nil || m.arrived {
		return
	}
	m.arrived = true
	l.arrive(m.g, nil)
}

// join arrives with c and reports whether it did: false when m is nil or arrived already,
// and c is then the caller's to send.
func (m *member) join(l *Limiter, c *call) bool {
	if m == nil || m.arrived {
		return false
	}
	m.arrived = true
	l.arrive(m.g, c)
	return true
}

// arrive records one member's arrival; the last sends the batch, holding a pipeline slot as a
// flusher does, and its callers are answered as a flusher answers them (answer).
func (l *Limiter) arrive(g *gather, c *call) {
	g.mu.Lock()
	if c != nil {
		g.batch = append(g.batch, c)
	}
	g.left--
	last := g.left == 0
	batch := g.batch
	g.mu.Unlock()
	if !last || len(batch) == 0 {
		return
	}
	select {
	case l.slots <- struct{}{}:
	case <-l.quit:
		for _, c := range batch {
			c.err = ErrClosed
			l.answer(c)
		}
		return
	}
	l.run(batch, make([]redis.Cmder, 0, len(batch)))
	<-l.slots
}
