package decide

// A refused in-flight start owes its stream-done call (see debts.go): EndOne pays refusals
// back first, so a negative hit ends a slot only beyond the refusals owed. A refusal is
// forgotten after one lease, as a slot is.

// Owe records that a start call under key was refused: the next stream-done call under key
// ends no slot.
func (g *SlotRegistry) Owe(key string) {
	now := g.now()
	g.owed.add(key, now, now.Add(g.Lease), g.Memory)
}

// EndOne is a stream-done call under key: it pays back a refusal owed under key, or else takes
// out the oldest entry put under key for its caller to release. Nil: nothing to release.
func (g *SlotRegistry) EndOne(key string) *Slots {
	if g.owed.pay(key, g.now()) {
		return nil
	}
	return g.TakeOldest(key)
}

// Owed is how many refusals are remembered over all keys.
func (g *SlotRegistry) Owed() int { return g.owed.len() }

// sweepOwed forgets the refusals whose stream-done call did not come within a lease.
func (g *SlotRegistry) sweepOwed() { g.owed.sweep(g.now()) }
