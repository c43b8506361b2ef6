package limiter

import (
	"math"
	"sync/atomic"
	"time"
)

// redisClock maps this process's monotonic clock onto Redis's, so that a call can carry a
// deadline the script checks on Redis's own clock: a call that reaches Redis after its caller
// stopped waiting (Redis paused, or a network that held it) counts nothing, where it would
// otherwise count units nobody admits, to the window's end.
//
// Every reply says when its script ran on Redis's clock (now_us). Taken against the local time
// the reply was read, that gives a lower bound of the offset between the clocks (the script ran
// before the reply arrived); the clock keeps the highest bound seen, which is off by at most the
// fastest round trip, so a deadline is early by at most that: a call is never counted after
// its deadline. The bound only rises. Where Redis's clock is behind the kept bound (it stepped
// back, a failover to a node whose clock is behind, another master of a cluster), deadlines
// fall later on that clock: less protection, never a call refused while its caller still waits.
type redisClock struct {
	base   time.Time    // local monotonic origin
	offset atomic.Int64 // Redis us minus local us since base; math.MinInt64 until a reply
}

func newRedisClock() *redisClock {
	c := &redisClock{base: time.Now()}
	c.offset.Store(math.MinInt64)
	return c
}

// observe records that a script ran at redisUS on Redis's clock before the local time read.
func (c *redisClock) observe(redisUS int64, read time.Time) {
	if redisUS <= 0 {
		return
	}
	bound := redisUS - read.Sub(c.base).Microseconds()
	for {
		cur := c.offset.Load()
		if bound <= cur || c.offset.CompareAndSwap(cur, bound) {
			return
		}
	}
}

// deadline is local time at, on Redis's clock in microseconds, or 0 while the offset is unknown.
func (c *redisClock) deadline(at time.Time) int64 {
	off := c.offset.Load()
	if off == math.MinInt64 {
		return 0
	}
	return at.Sub(c.base).Microseconds() + off
}
