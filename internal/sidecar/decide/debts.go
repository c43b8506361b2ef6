package decide

import (
	"sync"
	"time"
)

// Envoy sends the stream-done call of apply_on_stream_done for every request whose start call
// it made, refused ones included: a refused request kept nothing here, and its stream-done
// call must end nothing, or it would end what a request still running keeps (its slot, its
// hold) and let the key past its limit. A registry records each refused start call under its
// key as a debt, and the stream-done calls that could be a refusal's pay those back first.
//
// That never ends more than admitted requests have ended: every stream-done call of a refused
// request comes after its start call, so when one finds nothing owed, every refusal so far has
// been paid back. When a refusal's stream-done call comes after an admitted request's, the
// admitted request's entry is kept until its deadline: a short under-admission, never an
// excess. A refusal whose stream-done call never comes (an Envoy restarted, a route without
// apply_on_stream_done) is forgotten at its deadline.

// MaxOwed bounds the refusals an in-flight registry remembers over all keys, and MaxOwedHolds a
// hold registry's: measured at 120 bytes each on keys of their own, plus the key (a limiter
// key, about 60 bytes), so at most about 11 MiB and 3 MiB. Past it a refusal is not remembered,
// and its stream-done call ends a running request's entry as if none were owed. A refusal's
// stream-done call comes right after its answer, so only refusals whose call Envoy dropped
// wait long (a token budget's, when the usage format does not resolve: they are never paid,
// and are forgotten at the hold's timeout); a bound well below the refusals of a timeout is
// enough.
const (
	MaxOwed      = 65_536
	MaxOwedHolds = 16_384
)

// debts is the refusals owed per key, each with the time it is forgotten.
type debts struct {
	mu        sync.Mutex
	owed      map[string][]time.Time // per key, oldest first
	n         int
	lastSweep time.Time
}

// add records a refusal under key until until, unless most are remembered (after the ones
// past their time are forgotten, at most once a second: a full scan).
func (d *debts) add(key string, now, until time.Time, most int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.n >= most && now.Sub(d.lastSweep) >= time.Second {
		d.sweepLocked(now)
	}
	if d.n >= most {
		return
	}
	if d.owed == nil {
		d.owed = map[string][]time.Time{}
	}
	d.owed[key] = append(d.owed[key], until)
	d.n++
}

// pay pays back one refusal owed under key, if there is one not past its time.
func (d *debts) pay(key string, now time.Time) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	q := d.payable(key, now)
	if len(q) == 0 {
		return false
	}
	d.set(key, q[1:])
	return true
}

// len is how many refusals are remembered.
func (d *debts) len() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.n
}

// sweep forgets the refusals past their time.
func (d *debts) sweep(now time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.sweepLocked(now)
}

func (d *debts) sweepLocked(now time.Time) {
	d.lastSweep = now
	for key := range d.owed {
		d.payable(key, now)
	}
}

// payable is what is owed under key, those past their time dropped; d.mu is held. A key's
// refusals are forgotten in the order they were owed: their times may differ (rules of
// different timeouts under one key never share it, as a key names its rule).
func (d *debts) payable(key string, now time.Time) []time.Time {
	q := d.owed[key]
	i := 0
	for i < len(q) && !now.Before(q[i]) {
		i++
	}
	if i > 0 {
		q = q[i:]
		d.set(key, q)
	}
	return q
}

// set makes q what is owed under key, keeping n; d.mu is held.
func (d *debts) set(key string, q []time.Time) {
	d.n += len(q) - len(d.owed[key])
	if len(q) == 0 {
		delete(d.owed, key)
		return
	}
	d.owed[key] = q
}
