//go:build unix

package proxy

import (
	"errors"
	"net"
	"syscall"
)

// alive reports whether an idle keep-alive connection is still open and has nothing unread:
// a non-blocking peek sees EAGAIN on a healthy idle connection, 0 bytes once the peer closed,
// and data if the peer sent something unasked (then the connection is out of step).
func alive(c net.Conn) bool {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return true
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	ok = false
	var buf [1]byte
	err = rc.Read(func(fd uintptr) bool {
		_, _, rerr := syscall.Recvfrom(int(fd), buf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		ok = errors.Is(rerr, syscall.EAGAIN) || errors.Is(rerr, syscall.EWOULDBLOCK)
		return true // never wait
	})
	return err == nil && ok
}
