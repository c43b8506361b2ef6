package redisconn

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// go-redis drops a connection idle past ConnMaxIdleTime only when a caller next takes it from
// the pool; it has no reaper of its own. A quiet client therefore keeps every connection of its
// last burst open for as long as it stays quiet (TestIdleConnectionsClose/quiet fails without
// this file). The reaper closes those sockets itself: every connection is wrapped to count its
// reads and writes, and one whose count has not moved for ConnMaxIdleTime plus a grace, with no
// read or write in progress, is closed. go-redis discards it when it next meets it (its own idle
// check fails first: the grace is why), so a caller never gets a closed one.

// ConnStats counts the sockets of the clients it is given to (Options.Stats). Safe for
// concurrent use; the zero value is ready.
type ConnStats struct {
	open, dialed, reaped atomic.Int64
	nodeChanges          atomic.Uint64 // see changes.go
}

// Open is the number of sockets open to Redis now, idle or busy: what Redis counts as this
// client's connections. (go-redis's PoolStats.TotalConns also counts sockets the reaper closed
// until the pool next looks at them.)
func (s *ConnStats) Open() int64 { return s.open.Load() }

// Dialed is the number of connections opened since start, refused ones included.
func (s *ConnStats) Dialed() int64 { return s.dialed.Load() }

// Reaped is the number of connections closed for being idle.
func (s *ConnStats) Reaped() int64 { return s.reaped.Load() }

type reaper struct {
	after, every time.Duration
	stats        *ConnStats
	mu           sync.Mutex
	conns        map[*trackedConn]*quiet
	running      bool
}

// quiet is what the reaper last saw of a connection.
type quiet struct {
	ops   uint64
	since time.Time
}

func newReaper(maxIdle time.Duration, stats *ConnStats) *reaper {
	grace := min(maxIdle/10, time.Second)
	return &reaper{after: maxIdle + grace, every: max(grace, 5*time.Millisecond), stats: stats, conns: map[*trackedConn]*quiet{}}
}

// dialer wraps dial so that every connection it opens is tracked.
func (r *reaper) dialer(dial func(ctx context.Context, network, addr string) (net.Conn, error)) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		r.stats.dialed.Add(1)
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		t := &trackedConn{Conn: c, r: r}
		r.stats.open.Add(1)
		r.mu.Lock()
		r.conns[t] = &quiet{ops: ^uint64(0)}
		if !r.running {
			// The goroutine lives while connections do: a closed client leaves none behind.
			r.running = true
			go r.run()
		}
		r.mu.Unlock()
		// syscall.Conn stays visible when the socket offers it: go-redis's health check of a
		// pooled connection peeks at the socket through it.
		if sc, ok := c.(syscall.Conn); ok {
			return &trackedSyscallConn{trackedConn: t, sc: sc}, nil
		}
		return t, nil
	}
}

func (r *reaper) run() {
	tick := time.NewTicker(r.every)
	defer tick.Stop()
	var stale []*trackedConn
	for now := range tick.C {
		r.mu.Lock()
		if len(r.conns) == 0 {
			r.running = false
			r.mu.Unlock()
			return
		}
		for c, q := range r.conns {
			switch ops := c.ops.Load(); {
			case ops != q.ops || c.active.Load() > 0:
				q.ops, q.since = ops, now
			case now.Sub(q.since) >= r.after:
				stale = append(stale, c)
			}
		}
		r.mu.Unlock()
		for _, c := range stale {
			if closed, _ := c.close(); closed {
				r.stats.reaped.Add(1)
			}
		}
		clear(stale)
		stale = stale[:0]
	}
}

func (r *reaper) forget(c *trackedConn) {
	r.stats.open.Add(-1)
	r.mu.Lock()
	delete(r.conns, c)
	r.mu.Unlock()
}

// trackedConn counts reads and writes; ops moves on every one, active is non-zero during one.
type trackedConn struct {
	net.Conn
	r      *reaper
	ops    atomic.Uint64
	active atomic.Int32
	closed atomic.Bool
}

func (c *trackedConn) Read(p []byte) (int, error) {
	c.active.Add(1)
	n, err := c.Conn.Read(p)
	c.ops.Add(1)
	c.active.Add(-1)
	return n, err
}

func (c *trackedConn) Write(p []byte) (int, error) {
	c.active.Add(1)
	n, err := c.Conn.Write(p)
	c.ops.Add(1)
	c.active.Add(-1)
	return n, err
}

// close closes the socket unless it is closed already, and says whether this call did.
func (c *trackedConn) close() (bool, error) {
	if !c.closed.CompareAndSwap(false, true) {
		return false, nil
	}
	err := c.Conn.Close()
	c.r.forget(c)
	return true, err
}

func (c *trackedConn) Close() error {
	_, err := c.close()
	return err
}

// NetConn returns the socket, as crypto/tls.Conn does.
func (c *trackedConn) NetConn() net.Conn { return c.Conn }

type trackedSyscallConn struct {
	*trackedConn
	sc syscall.Conn
}

func (c *trackedSyscallConn) SyscallConn() (syscall.RawConn, error) { return c.sc.SyscallConn() }
