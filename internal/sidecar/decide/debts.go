package decide

import (
	"crypto/sha256"
	"sync"
	"time"

	"github.com/redline-dev/redline/internal/sidecar/membudget"
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

// MaxOwed bounds the refusals a registry (of slots or of holds) remembers over all keys. A key
// is remembered by a 16-byte hash, whatever its length, and a refusal by an 8-byte time:
// measured at 112 bytes a refusal on keys of its own, however long (hack/bench debtsize), so
// at most about 2 MiB a registry, drawn from the sidecar's memory budget (DebtBytes each),
// where they compete with the requests' bodies and holds. Past either bound a refusal is not
// remembered, and its stream-done call ends a running request's entry as if none were owed.
// A refusal's stream-done call comes right after its answer, so only refusals whose call
// Envoy dropped wait long (a token budget's, when the usage format does not resolve: they are
// never paid, and are forgotten at the hold's timeout); a bound well below the refusals of a
// timeout is enough.
const MaxOwed = 16_384

// debtShare is how many keys it takes to fill a registry's refusals: one key is remembered at
// most 1/debtShare of them, so that a client refusing itself on one key cannot leave no room
// for the others'.
const debtShare = 8

// DebtBytes is what a remembered refusal draws from the sidecar's memory budget: its measured
// 112 bytes, rounded up.
const DebtBytes = 128

// debts is the refusals owed per key, each with the time it is forgotten. Each draws DebtBytes
// from mem (the registry's budget, nil: none) while remembered.
type debts struct {
	mu        sync.Mutex
	mem       *membudget.Budget
	owed      map[debtKey][]int64 // per key, UnixNano, oldest first
	n         int
	lastSweep time.Time
}

// debtKey names a limiter key in debts by a fixed-size hash: a map entry's size does not grow
// with the key's (a policy's and a rule's names are a tenant's to choose).
type debtKey [16]byte

func keyOf(key string) debtKey {
	sum := sha256.Sum256([]byte(key))
	return debtKey(sum[:16])
}

// add records a refusal under key until until, unless MaxOwed are remembered (after the ones
// past their time are forgotten, at most once a second: a full scan), or MaxOwed/debtShare
// under key, or mem has no room (TryDraw: a refusal not remembered refuses nobody).
func (d *debts) add(key string, now, until time.Time, mem *membudget.Budget) {
	k := keyOf(key)
	d.mu.Lock()
	defer d.mu.Unlock()
	d.mem = mem
	d.tickLocked(now)
	if d.n >= MaxOwed || len(d.owed[k]) >= MaxOwed/debtShare || !d.mem.TryDraw(DebtBytes) {
		return
	}
	if d.owed == nil {
		d.owed = map[debtKey][]int64{}
	}
	d.owed[k] = append(d.owed[k], until.UnixNano())
	d.n++
}

// pay pays back one refusal owed under key, if there is one not past its time.
func (d *debts) pay(key string, now time.Time) bool {
	k := keyOf(key)
	d.mu.Lock()
	defer d.mu.Unlock()
	d.tickLocked(now)
	q := d.payable(k, now)
	if len(q) == 0 {
		return false
	}
	d.set(k, q[1:])
	return true
}

// len is how many refusals are remembered.
func (d *debts) len() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.n
}

// tick forgets the refusals past their time, at most once a second (a full scan): their bytes
// go back to the memory budget within a second of the registry's next use. The registries call
// it on every use, the in-flight one also every second (SlotRegistry.Run).
func (d *debts) tick(now time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.tickLocked(now)
}

func (d *debts) tickLocked(now time.Time) {
	if d.n > 0 && now.Sub(d.lastSweep) >= time.Second {
		d.sweepLocked(now)
	}
}

// sweep forgets the refusals past their time.
func (d *debts) sweep(now time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.sweepLocked(now)
}

func (d *debts) sweepLocked(now time.Time) {
	d.lastSweep = now
	for k := range d.owed {
		d.payable(k, now)
	}
}

// payable is what is owed under k, those past their time dropped; d.mu is held. A key's
// refusals are forgotten in the order they were owed: their times may differ (rules of
// different timeouts under one key never share it, as a key names its rule).
func (d *debts) payable(k debtKey, now time.Time) []int64 {
	q := d.owed[k]
	t := now.UnixNano()
	i := 0
	for i < len(q) && t >= q[i] {
		i++
	}
	if i > 0 {
		q = q[i:]
		d.set(k, q)
	}
	return q
}

// set makes q, no longer than what is owed under k, what is owed under k, keeping n and giving
// back what the refusals dropped drew; d.mu is held.
func (d *debts) set(k debtKey, q []int64) {
	dropped := len(d.owed[k]) - len(q)
	d.n -= dropped
	d.mem.Return(int64(dropped) * DebtBytes)
	if len(q) == 0 {
		delete(d.owed, k)
		return
	}
	d.owed[k] = q
}
