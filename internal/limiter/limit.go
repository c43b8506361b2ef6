package limiter

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// ErrInvalidLimit is wrapped by errors about a Limit or cost that cannot be enforced.
var ErrInvalidLimit = errors.New("invalid limit")

// burst is the TokenBucket capacity.
func (l Limit) burst() int64 {
	if l.Burst > 0 {
		return l.Burst
	}
	return l.Requests
}

// Capacity is the largest cost the limit can ever admit at once: Burst for TokenBucket,
// Requests otherwise. A larger cost is refused without asking Redis.
func (l Limit) Capacity() int64 {
	if l.Algorithm == TokenBucket {
		return l.burst()
	}
	return l.Requests
}

// Validate reports whether the limit can be enforced.
func (l Limit) Validate() error {
	if _, ok := shaArgs[l.Algorithm]; !ok {
		return fmt.Errorf("%w: unknown algorithm %q", ErrInvalidLimit, l.Algorithm)
	}
	if l.Requests < 1 {
		return fmt.Errorf("%w: requests must be at least 1, got %d", ErrInvalidLimit, l.Requests)
	}
	if l.Window < time.Millisecond {
		return fmt.Errorf("%w: window must be at least 1ms, got %s", ErrInvalidLimit, l.Window)
	}
	if l.Replicas < 0 {
		return fmt.Errorf("%w: replicas must not be negative, got %d", ErrInvalidLimit, l.Replicas)
	}
	if l.Peers < 0 {
		return fmt.Errorf("%w: peers must not be negative, got %d", ErrInvalidLimit, l.Peers)
	}
	if l.Calendar != nil && l.Algorithm != FixedWindow {
		return fmt.Errorf("%w: a calendar window is a FixedWindow, not %s", ErrInvalidLimit, l.Algorithm)
	}
	if l.Burst < 0 {
		return fmt.Errorf("%w: burst must not be negative, got %d", ErrInvalidLimit, l.Burst)
	}
	switch l.FailureMode {
	case "", FailureModeOpen, FailureModeClosed, FailureModeLocalFallback:
	default:
		return fmt.Errorf("%w: unknown failure mode %q", ErrInvalidLimit, l.FailureMode)
	}
	return l.Durability.valid()
}

// scriptArgs appends the script's ARGV for this limit and cost to dst; want, when above cost,
// asks a leasing algorithm for a lease of that many units. ARGV[4], the call's deadline on
// Redis's clock, is 0 (none) here: the pipeline sets it when it sends the call (see deadlineArg).
func (l Limit) scriptArgs(dst []any, cost, want int64) []any {
	dst = append(dst, l.Requests, l.Window.Milliseconds(), cost, noDeadline)
	switch {
	case l.Algorithm == TokenBucket:
		dst = append(dst, l.burst())
	case l.Algorithm.leases():
		dst = append(dst, max(want, cost))
	}
	return dst
}

// noDeadline is ARGV[4] of a call sent without a deadline, boxed once.
var noDeadline any = int64(0)

// deadlineArg is the index in a call's EVALSHA arguments of its deadline: "evalsha", sha,
// numkeys, key, limit, window, cost, deadline.
const deadlineArg = 7

// leases says whether the algorithm's script grants leases. FixedWindow and
// SlidingWindowCounter count a lease in the current window, which is exact: every leased unit
// was counted before it is admitted, and a lease ends with its window. SlidingWindowLog is the
// precise algorithm by definition and stays per request. TokenBucket stays per request too: a
// held lease would be tokens outside the bucket while it refills, so a replica could admit
// more than the burst in one instant.
func (a Algorithm) leases() bool { return a == FixedWindow || a == SlidingWindowCounter }

// suffix is the key suffix of the algorithm's state. Algorithms whose states mean different
// things never share a key; FixedWindow and SlidingWindowCounter keep the same windows.
func (a Algorithm) suffix() string {
	switch a {
	case FixedWindow, SlidingWindowCounter:
		// One state for both: a rule whose algorithm changes between them (or whose replicas
		// run both while a reload reaches them) keeps counting the same windows.
		return "swc"
	case SlidingWindowLog:
		return "swl"
	case TokenBucket:
		return "tb"
	}
	return "x"
}

// errBadReply is wrapped by errors about a script reply of an unexpected shape.
var errBadReply = errors.New("unexpected script reply")

// grant is what a script's reply says beyond its Result.
type grant struct {
	units    int64 // counted in Redis for this call, cost included
	nowUS    int64 // Redis's clock when the script ran, microseconds
	restored int64 // units this replica's shares added to the state first (see shares.go)
}

// window returns the start of the window, aligned like the scripts align it, that g was counted
// in (ms on Redis's clock) and how long that window still ran when the script did.
func (g grant) window(w time.Duration) (startMS int64, left time.Duration) {
	ms := w.Milliseconds()
	now := g.nowUS / 1000
	startMS = now - now%ms
	return startMS, time.Duration((startMS+ms)*1000-g.nowUS) * time.Microsecond
}

// errStale is wrapped by the error of a call that reached Redis after its deadline: the script
// counted nothing, and the decision falls to the failure mode.
var errStale = errors.New("the call reached Redis after its deadline")

// errHeld is wrapped by the error of a call refused a grant while the replicas restore their
// shares in its state (Options.RestoreHold); the failure mode decides.
var errHeld = errors.New("grants wait while the replicas restore what Redis lost")

// decodeReply turns a script's {allowed, remaining, retry_after_ms, reset_after_ms, now_us,
// granted[, restored]} into a Result and a grant. A reply of a call that ran after its deadline
// (retry_after_ms -2) is errStale, with the grant's clock still read.
func decodeReply(n []int64) (Result, grant, error) {
	if len(n) != 6 && len(n) != 7 {
		return Result{}, grant{}, fmt.Errorf("%w: want 6 or 7 integers, got %d", errBadReply, len(n))
	}
	g := grant{units: n[5], nowUS: n[4]}
	if len(n) == 7 {
		if n[6] < 0 {
			return Result{}, grant{}, fmt.Errorf("%w: restored %d", errBadReply, n[6])
		}
		g.restored = n[6]
	}
	if g.nowUS <= 0 {
		return Result{}, grant{}, fmt.Errorf("%w: clock %d", errBadReply, g.nowUS)
	}
	if n[0] == 0 && n[2] == -2 {
		return Result{}, grant{nowUS: g.nowUS}, errStale
	}
	if n[0] == 0 && n[2] == -4 {
		return Result{}, grant{nowUS: g.nowUS}, errCalendarMiss
	}
	if n[0] == 0 && n[2] == -3 {
		return Result{}, grant{nowUS: g.nowUS, restored: g.restored}, errHeld
	}
	if g.units < 0 || (n[0] == 1) != (g.units > 0) {
		return Result{}, grant{}, fmt.Errorf("%w: grant %d with allowed %d", errBadReply, g.units, n[0])
	}
	r, err := decodeResult(n[:4])
	return r, g, err
}

func decodeResult(n []int64) (Result, error) {
	if n[0] != 0 && n[0] != 1 {
		return Result{}, fmt.Errorf("%w: allowed flag %d", errBadReply, n[0])
	}
	if n[1] < 0 || n[2] < -1 || n[3] < 0 {
		return Result{}, fmt.Errorf("%w: negative value in %v", errBadReply, n)
	}
	if n[0] == 1 && n[2] != 0 {
		return Result{}, fmt.Errorf("%w: admitted with retry-after %dms", errBadReply, n[2])
	}
	r := Result{
		Allowed:    n[0] == 1,
		Remaining:  n[1],
		RetryAfter: msDuration(n[2]),
		ResetAfter: msDuration(n[3]),
		Source:     SourceRedis,
	}
	r.OverLimit = !r.Allowed
	return r, nil
}

// msDuration converts milliseconds to a Duration, keeping -1 as -1 and saturating on overflow.
func msDuration(ms int64) time.Duration {
	if ms < 0 {
		return -1
	}
	if ms > math.MaxInt64/int64(time.Millisecond) {
		return math.MaxInt64
	}
	return time.Duration(ms) * time.Millisecond
}

// stateKey is the Redis key of an algorithm's state for a key built by keyscheme.Key.
func stateKey(key string, a Algorithm) string {
	return key + ":" + a.suffix()
}
