// Package connlimit bounds the connections one sidecar listener holds: in all (netutil's
// LimitListener) and per remote IP, so that neither one client opening sockets without end nor
// one peer taking every slot can exhaust the sidecar's memory or starve other peers. Every face
// of the sidecar (proxy, admin, decision API, rate limit service) is opened through Listen.
//
// The cap is a memory bound: what one connection can cost times the cap must fit in the
// container. Connections beyond it wait in the kernel's accept queue, which costs the sidecar
// nothing. A peer over its per-IP bound is closed as soon as it is accepted, before anything is
// read from it, and does not count against the cap.
package connlimit

import (
	"net"
	"net/http"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/netutil"
)

// Limits bound one listener.
type Limits struct {
	// Max is the most connections open at once; 0 means no bound (tests only).
	Max int
	// PerIP is the most connections open at once from one remote IP; 0 means no bound. A peer
	// is its IP: an IPv6 client is one peer per address, as Kubernetes gives a pod one.
	PerIP int
}

// Listener is a bounded listener. Its Accept hands out connections within Limits.
type Listener struct {
	net.Listener // netutil.LimitListener over the per-IP counting listener

	counting *perIP
}

// Listen bounds ln by lim. When onFull is set it runs (synchronously, on the accepting
// goroutine) each time a connection takes the last slot: the proxy closes an idle keep-alive
// connection there, so idle connections never keep a new one waiting (IdleCloser).
func Listen(ln net.Listener, lim Limits, onFull func()) *Listener {
	p := &perIP{Listener: ln, limit: lim.PerIP, max: lim.Max, onFull: onFull, open: map[netip.Addr]int{}}
	var outer net.Listener = p
	if lim.Max > 0 {
		outer = netutil.LimitListener(p, lim.Max)
	}
	return &Listener{Listener: outer, counting: p}
}

// Open is the number of connections the listener holds now.
func (l *Listener) Open() int { return int(l.counting.total.Load()) }

// Refused is how many connections were closed on accept for being over their peer's bound.
func (l *Listener) Refused() uint64 { return l.counting.refused.Load() }

// perIP counts open connections per remote IP and closes those over the bound.
type perIP struct {
	net.Listener

	limit, max int
	onFull     func()
	mu         sync.Mutex
	// open has an entry only for IPs with open connections: at most Max entries.
	open    map[netip.Addr]int
	total   atomic.Int64
	refused atomic.Uint64
}

func (p *perIP) Accept() (net.Conn, error) {
	for {
		c, err := p.Listener.Accept()
		if err != nil {
			return nil, err
		}
		ip := remoteIP(c)
		p.mu.Lock()
		if p.limit > 0 && p.open[ip] >= p.limit {
			p.mu.Unlock()
			p.refused.Add(1)
			_ = c.Close()
			continue
		}
		p.open[ip]++
		p.mu.Unlock()
		if n := p.total.Add(1); p.onFull != nil && p.max > 0 && n >= int64(p.max) {
			p.onFull()
		}
		return &conn{Conn: c, release: func() { p.release(ip) }}, nil
	}
}

func (p *perIP) release(ip netip.Addr) {
	p.total.Add(-1)
	p.mu.Lock()
	if p.open[ip] <= 1 {
		delete(p.open, ip)
	} else {
		p.open[ip]--
	}
	p.mu.Unlock()
}

// remoteIP is c's peer address without port and zone, IPv4-mapped IPv6 as IPv4. A connection
// whose peer is not an IP (a unix socket, in tests) counts as the zero address.
func remoteIP(c net.Conn) netip.Addr {
	if ta, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		if a, ok := netip.AddrFromSlice(ta.IP); ok {
			return a.Unmap().WithZone("")
		}
	}
	return netip.Addr{}
}

// conn releases its peer's count once, on the first Close.
type conn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *conn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}

// IdleCloser tracks an http.Server's idle keep-alive connections (set ConnState to its
// ConnState) and closes the one idle longest when asked (pass CloseOldest as Listen's onFull).
// This is what nginx does when it runs out of connections: closing an idle keep-alive
// connection is always allowed by HTTP/1.1 (RFC 9112 section 9.8), and clients retry a request
// that found its pooled connection closed. So the cap bounds memory without letting idle
// pooled connections of many clients lock new ones out until their idle timeout.
type IdleCloser struct {
	mu   sync.Mutex
	idle map[net.Conn]time.Time
	// owed is set when the cap was reached with no connection idle (the last response not yet
	// written out): the next connection to go idle is closed at once, or the next client would
	// wait for an idle timeout, since the cap is only reached once.
	owed bool
}

// ConnState is an http.Server ConnState hook.
func (t *IdleCloser) ConnState(c net.Conn, s http.ConnState) {
	t.mu.Lock()
	if s == http.StateIdle && t.owed {
		t.owed = false
		delete(t.idle, c)
		t.mu.Unlock()
		_ = c.Close()
		return
	}
	defer t.mu.Unlock()
	if s == http.StateIdle {
		if t.idle == nil {
			t.idle = map[net.Conn]time.Time{}
		}
		t.idle[c] = time.Now()
		return
	}
	delete(t.idle, c)
}

// CloseOldest closes the connection idle longest, if any, and reports whether it closed one.
// A scan, not a heap: it runs only at the cap, over at most the cap's idle connections.
func (t *IdleCloser) CloseOldest() bool {
	t.mu.Lock()
	var (
		oldest net.Conn
		since  time.Time
	)
	for c, at := range t.idle {
		if oldest == nil || at.Before(since) {
			oldest, since = c, at
		}
	}
	if oldest != nil {
		delete(t.idle, oldest)
	} else {
		t.owed = true
	}
	t.mu.Unlock()
	if oldest == nil {
		return false
	}
	_ = oldest.Close()
	return true
}
