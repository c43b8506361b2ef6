// Package membudget is the one memory budget for everything a client makes the sidecar hold
// past the moment it arrives: the bytes of a request body buffered to size it today, and any
// other per-request state that draws from it: the open holds a request keeps until its settle
// (decide.HoldBytes each), the registries' entries that wait for a settle from a later call,
// the refusals the Envoy face remembers until their stream-done call (decide.DebtBytes each),
// and the limiter's table of open holds (limiter.OpenHoldBytes each).
//
// The budget is a weighted semaphore (golang.org/x/sync/semaphore) sized in bytes. A draw is
// TryAcquire and never waits: a request that does not fit is answered at once (503 with
// Retry-After by the proxy), so a flood of clients queues nothing in the sidecar and the
// budget bounds the memory whatever the number of connections. Bytes are drawn before they are
// allocated and given back when nothing holds them any more.
package membudget

import (
	"math"
	"sync"
	"sync/atomic"

	"golang.org/x/sync/semaphore"
)

// DefaultPercent is the share of Go's memory limit (GOMEMLIMIT) the budget takes by default.
// The rest is the sidecar at rest (about 28 MiB of a 64 MiB container: the binary, the runtime,
// the lease and share tables), its connections (each up to --max-header-bytes plus 40 KiB), and
// the garbage of what was drawn and given back, which lives until the collector runs. At the
// injector's 64 MiB, 300 connections each sending a 1 MiB body peaked at 29-35 MiB RSS.
const DefaultPercent = 25

// DefaultSize is the budget where no memory limit is known (no GOMEMLIMIT and no container
// limit): about what DefaultPercent of the injector's default 64 MiB container gives.
const DefaultSize = 14 << 20

// SizeFor is the budget for a Go memory limit (debug.SetMemoryLimit(-1)): percent of it, or
// DefaultSize when the limit is unset (math.MaxInt64) or not positive.
func SizeFor(goMemLimit int64, percent int) int64 {
	if goMemLimit <= 0 || goMemLimit == math.MaxInt64 {
		return DefaultSize
	}
	return goMemLimit / 100 * int64(percent)
}

// Budget is a number of bytes that draws take from and give back. A nil *Budget is no budget:
// every draw is granted, and nothing is counted.
type Budget struct {
	size    int64
	sem     *semaphore.Weighted
	inUse   atomic.Int64
	refused atomic.Uint64
}

// New returns a budget of size bytes; size <= 0 returns nil, no budget.
func New(size int64) *Budget {
	if size <= 0 {
		return nil
	}
	return &Budget{size: size, sem: semaphore.NewWeighted(size)}
}

// Stats is what a budget holds and refused, for metrics.
type Stats struct {
	// Size is the budget in bytes (0: no budget).
	Size int64
	// InUse is the bytes drawn and not given back.
	InUse int64
	// Refused counts draws that did not fit: each is a request answered without being served.
	Refused uint64
}

// Stats reads the budget's counters.
func (b *Budget) Stats() Stats {
	if b == nil {
		return Stats{}
	}
	return Stats{Size: b.size, InUse: b.inUse.Load(), Refused: b.refused.Load()}
}

// Draw takes n bytes (n >= 0) for something kept past its request's decision whose size is
// stated rather than grown (an open hold, a registry entry). When they do not fit, free (if
// set) is asked to give back what it can spare (a cache of entries no bound counts), one call
// at a time while it reports it freed something; Draw then reports false, drawing nothing,
// counted as a refusal. A nil budget grants every draw.
func (b *Budget) Draw(n int64, free func() bool) bool {
	if b == nil || n <= 0 {
		return true
	}
	for !b.sem.TryAcquire(n) {
		if free == nil || !free() {
			b.refused.Add(1)
			return false
		}
	}
	b.inUse.Add(n)
	return true
}

// TryDraw takes n bytes when the budget has room for them now, and says whether it did. Unlike
// Draw, a draw that does not fit is not counted as a refused request: it is for what the
// sidecar keeps on its own account (a refusal remembered for its stream-done call), whose
// caller is not refused for it.
func (b *Budget) TryDraw(n int64) bool {
	if b == nil || n <= 0 {
		return true
	}
	if !b.sem.TryAcquire(n) {
		return false
	}
	b.inUse.Add(n)
	return true
}

// Return gives back n bytes of an earlier Draw, once nothing keeps what they stood for.
func (b *Budget) Return(n int64) {
	if b == nil || n <= 0 {
		return
	}
	b.inUse.Add(-n)
	b.sem.Release(n)
}

// Lease is one request's draw on the budget: it grows as the request holds more and is
// released once, when the request holds nothing any more. Its methods are safe to call from
// several goroutines (a body's read loop grows it while the transport may release it).
type Lease struct {
	b      *Budget
	mu     sync.Mutex
	n      int64
	closed bool
}

// Take draws n bytes (n >= 0) for a new lease; ok is false, and nothing is drawn, when they do
// not fit. On a nil budget it returns a lease that grants every draw.
func (b *Budget) Take(n int64) (l *Lease, ok bool) {
	l = &Lease{b: b}
	if !l.Grow(n) {
		return nil, false
	}
	return l, true
}

// Grow draws n more bytes (n >= 0) before the caller allocates them. It reports false, drawing
// nothing, when they do not fit or the lease was released: the caller must not allocate them.
func (l *Lease) Grow(n int64) bool {
	if n <= 0 {
		return true
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return false
	}
	if l.b == nil {
		l.n += n
		return true
	}
	if !l.b.sem.TryAcquire(n) {
		l.b.refused.Add(1)
		return false
	}
	l.b.inUse.Add(n)
	l.n += n
	return true
}

// ShrinkTo gives back what the lease holds beyond n bytes: the request now holds less (a body
// replaced by a smaller one, the work on it done).
func (l *Lease) ShrinkTo(n int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed || n >= l.n {
		return
	}
	l.giveBack(l.n - max(n, 0))
}

// Shrink gives back n of the bytes the lease holds (at most all of them).
func (l *Lease) Shrink(n int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed || n <= 0 {
		return
	}
	l.giveBack(min(n, l.n))
}

// Bytes is what the lease holds.
func (l *Lease) Bytes() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.n
}

// Release gives back all the lease holds; later calls, and later Grows, do nothing. Call it
// once nothing refers to the bytes any more.
func (l *Lease) Release() {
	if l == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return
	}
	l.closed = true
	l.giveBack(l.n)
}

func (l *Lease) giveBack(n int64) {
	l.n -= n
	if l.b != nil && n > 0 {
		l.b.inUse.Add(-n)
		l.b.sem.Release(n)
	}
}
