package decide

import "time"

// Envoy sends the stream-done call of apply_on_stream_done for every request whose start call
// it made, refused ones included: a refused request took no slot, and its stream-done call
// must end none, or it would end the oldest slot of a request still running and let the key
// past its limit. Owe records each refused start call under its key, and EndOne pays those
// back first: a negative hit ends a slot only beyond the refusals owed.
//
// That never ends more slots than admitted requests have ended: every stream-done call of a
// refused request comes after its start call, so when one finds nothing owed, every refusal
// so far has been paid back. When a refusal's stream-done call comes before an admitted
// request's, the admitted request's slot is kept until the refusal's call comes: a short
// under-admission, never an excess. A refusal whose stream-done call never comes (an Envoy
// restarted, a route without apply_on_stream_done) is forgotten after one lease, as a slot is.

// MaxOwed bounds the refusals remembered over all keys (24 bytes each). Past it a refusal is
// not remembered, and its stream-done call ends a running request's slot as if none were owed.
const MaxOwed = 65_536

// Owe records that a start call under key was refused: the next stream-done call under key
// ends no slot.
func (g *SlotRegistry) Owe(key string) {
	now := g.now()
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.owedN >= MaxOwed {
		return
	}
	if g.owed == nil {
		g.owed = map[string][]time.Time{}
	}
	g.owed[key] = append(g.owed[key], now.Add(g.Lease))
	g.owedN++
}

// EndOne is a stream-done call under key: it pays back a refusal owed under key, or else takes
// out the oldest entry put under key for its caller to release. Nil: nothing to release.
func (g *SlotRegistry) EndOne(key string) *Slots {
	now := g.now()
	g.mu.Lock()
	q := g.payable(key, now)
	if len(q) > 0 {
		g.setOwed(key, q[1:])
		g.mu.Unlock()
		return nil
	}
	g.mu.Unlock()
	return g.TakeOldest(key)
}

// payable is what is owed under key, its expired refusals dropped; g.mu is held.
func (g *SlotRegistry) payable(key string, now time.Time) []time.Time {
	q := g.owed[key]
	i := 0
	for i < len(q) && !now.Before(q[i]) {
		i++
	}
	if i > 0 {
		q = q[i:]
		g.setOwed(key, q)
	}
	return q
}

// setOwed makes q what is owed under key, keeping owedN; g.mu is held.
func (g *SlotRegistry) setOwed(key string, q []time.Time) {
	g.owedN += len(q) - len(g.owed[key])
	if len(q) == 0 {
		delete(g.owed, key)
		return
	}
	g.owed[key] = q
}

// Owed is how many refusals are remembered over all keys.
func (g *SlotRegistry) Owed() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.owedN
}

// sweepOwed forgets the refusals whose stream-done call did not come within a lease.
func (g *SlotRegistry) sweepOwed() {
	now := g.now()
	g.mu.Lock()
	defer g.mu.Unlock()
	for key := range g.owed {
		g.payable(key, now)
	}
}
