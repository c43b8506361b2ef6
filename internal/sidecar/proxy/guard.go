package proxy

import (
	"context"
	"errors"
	"net"
	"net/http/httptrace"
	"sync"
	"time"
)

// http.Transport returns a keep-alive connection to its idle pool as soon as a response is
// complete, and only then does the connection's read loop look for bytes the application sent
// beyond that response (past a short Content-Length, a body on HEAD or 204): if it finds some
// with no request waiting, it closes the connection. In between, another request may take the
// connection and be served those bytes as its own response: another client's injected body.
// The window is short but real (hit under -race by this package's attack test; see also
// golang/go#31259). This guard closes it without touching the protocol: every connection to the
// application is wrapped, and a request about to reuse one waits until the read loop is blocked
// reading the socket, which it only does with nothing buffered. Bytes that then arrive before
// the request is written are refused as unsolicited, which makes the transport drop the
// connection (and retry the request on a new one when it may). Bytes an application sends after
// it received the request cannot be told from its answer, by this or by any HTTP/1.1 proxy.

// errUnsolicited fails the read of bytes the application sent while no request was written.
var errUnsolicited = errors.New("application sent bytes on an idle keep-alive connection before any request")

// reuseWait bounds the wait for the read loop to reach the socket; it is normally
// microseconds. A connection still not settled by then is closed rather than trusted.
const reuseWait = time.Second

// guardedConn is a connection to the application that knows whether a read is in progress
// and whether a request was handed the connection but has not written yet.
type guardedConn struct {
	net.Conn

	mu       sync.Mutex
	reading  bool          // the transport's read loop is blocked in Read
	awaiting bool          // handed to a request that has not written yet
	closed   bool          // Close was called
	settled  chan struct{} // closed when reading or closed becomes true, if someone waits
}

func (c *guardedConn) Read(p []byte) (int, error) {
	c.mu.Lock()
	c.reading = true
	c.wake()
	c.mu.Unlock()
	n, err := c.Conn.Read(p)
	c.mu.Lock()
	c.reading = false
	unsolicited := n > 0 && c.awaiting
	c.mu.Unlock()
	if unsolicited {
		return 0, errUnsolicited
	}
	return n, err
}

func (c *guardedConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	c.awaiting = false
	c.mu.Unlock()
	return c.Conn.Write(p)
}

func (c *guardedConn) Close() error {
	c.mu.Lock()
	c.closed = true
	c.wake()
	c.mu.Unlock()
	return c.Conn.Close()
}

// wake releases a request waiting in reuse; c.mu is held.
func (c *guardedConn) wake() {
	if c.settled != nil {
		close(c.settled)
		c.settled = nil
	}
}

// reuse runs when a request takes c from the idle pool, before it writes: it waits until the
// read loop is reading the socket (nothing buffered) or has closed c (something was).
func (c *guardedConn) reuse() {
	c.mu.Lock()
	c.awaiting = true
	if c.reading || c.closed {
		c.mu.Unlock()
		return
	}
	settled := make(chan struct{})
	c.settled = settled
	c.mu.Unlock()
	t := time.NewTimer(reuseWait)
	defer t.Stop()
	select {
	case <-settled:
	case <-t.C:
		_ = c.Close() // the transport sees a closed connection and dials a new one
	}
}

// guardedDialer wraps every connection it dials.
func guardedDialer(d *net.Dialer) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &guardedConn{Conn: conn}, nil
	}
}

// reuseTrace is attached to every outgoing request so that a reused connection is checked
// before the request is written on it.
var reuseTrace = &httptrace.ClientTrace{
	GotConn: func(info httptrace.GotConnInfo) {
		if gc, ok := info.Conn.(*guardedConn); ok && info.Reused {
			gc.reuse()
		}
	},
}
