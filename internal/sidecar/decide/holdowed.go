package decide

import "time"

// A refused token-budget start of Envoy's apply_on_stream_done owes its stream-done call (see
// debts.go): that call reports no usage (the request never reached the upstream), and
// PayOwed lets it end no hold. A usage above 0 is never a refusal's, and never pays a debt.

// Owe records that a start call under key was refused, for wait (the hold's timeout the start
// would have had); at most MaxOwed are remembered.
func (g *Registry) Owe(key string, wait time.Duration) {
	now := g.now()
	g.owed.add(key, now, now.Add(wait), g.Memory)
}

// PayOwed pays back a refusal owed under key: true when there was one, and the stream-done
// call that paid it settles no hold.
func (g *Registry) PayOwed(key string) bool { return g.owed.pay(key, g.now()) }

// Owed is how many refusals are remembered over all keys.
func (g *Registry) Owed() int { return g.owed.len() }
