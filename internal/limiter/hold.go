package limiter

import "time"

// Hold is units reserved for one request whose cost is known only after it (a rule whose cost
// comes from its response): counted in the key's window state like any grant when Reserve
// answers, and ended by Settle with what the request really used. A hold not settled by its
// deadline goes back by itself, in Redis, so a crashed replica or a lost settle cannot leak
// budget.
type Hold struct {
	// Units is what the hold reserved, between the least and the most asked for.
	Units int64
	// Degraded says the failure mode decided the hold: nothing is held in Redis.
	Degraded bool
	// Deadline is when the hold goes back by itself (local clock, a little before Redis's).
	Deadline time.Time
}

// Settled is what a Settle did.
type Settled struct {
	// Returned is how many of the hold's units went back (it used fewer).
	Returned int64
	// Debt is how many units were charged beyond the hold (it used more): counted past the
	// limit, so its key is refused until they are repaid.
	Debt int64
	// Expired says the hold had gone back by itself before the settle, which charged what was
	// used in full.
	Expired bool
}
