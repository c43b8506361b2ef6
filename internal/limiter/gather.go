package limiter

import (
	"context"
	"sync"

	"github.com/redis/go-redis/v9"
)

// Ask is one decision of AllowAll.
type Ask struct {
	Key   string
	Limit Limit
	Cost  int64
}

// AllowAll decides every ask as Allow decides it, concurrently, and sends the Redis calls they
// need in one batch: one round trip for all of them (one per shard on a cluster), not one each.
// A request that matches several rules, or a rule and its candidate limit, waits for one
// round trip, and a candidate costs the rule it shadows no round trip of its own. An ask that
// needs no Redis call (a lease, the pre-check, an open breaker, a refused cost) is answered
// without waiting for the others' batch; one that waits for another caller's grant of its key
// leaves the batch and decides on its own.
func (l *Limiter) AllowAll(ctx context.Context, asks []Ask) ([]Result, []error) {
	res := make([]Result, len(asks))
	errs := make([]error, len(asks))
	switch len(asks) {
	case 0:
		return res, errs
	case 1:
		res[0], errs[0] = l.Allow(ctx, asks[0].Key, asks[0].Limit, asks[0].Cost)
		return res, errs
	}
	g := &gather{left: len(asks), batch: make([]*call, 0, len(asks))}
	members := make([]member, len(asks))
	var wg sync.WaitGroup
	for i := 1; i < len(asks); i++ {
		members[i].g = g
		wg.Go(func() { res[i], errs[i] = l.allow(ctx, asks[i].Key, asks[i].Limit, asks[i].Cost, &members[i]) })
	}
	members[0].g = g
	res[0], errs[0] = l.allow(ctx, asks[0].Key, asks[0].Limit, asks[0].Cost, &members[0])
	wg.Wait()
	return res, errs
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
