package connlimit

import (
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"
)

// dialFrom connects to addr from the loopback address src (Linux routes all of 127/8 to lo),
// so that one test can play several peers.
func dialFrom(src, addr string) (net.Conn, error) {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 5 * time.Second}
	return d.Dial("tcp", addr)
}

// serveEcho accepts from ln and echoes, until ln closes.
func serveEcho(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() { _, _ = io.Copy(c, c); _ = c.Close() }()
	}
}

// alive reports whether c answers an echo within a second.
func alive(c net.Conn) bool {
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte{'x'}); err != nil {
		return false
	}
	var b [1]byte
	_, err := io.ReadFull(c, b[:])
	return err == nil
}

func TestPerIPBoundLeavesRoomForOtherPeers(t *testing.T) {
	g := NewWithT(t)
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	g.Expect(err).NotTo(HaveOccurred())
	ln := Listen(raw, Limits{Max: 8, PerIP: 3}, nil)
	defer ln.Close()
	go serveEcho(ln)

	var attacker []net.Conn
	defer func() {
		for _, c := range attacker {
			_ = c.Close()
		}
	}()
	for range 10 {
		c, err := dialFrom("127.0.0.2", raw.Addr().String())
		g.Expect(err).NotTo(HaveOccurred()) // the kernel accepts; the listener closes the extra ones
		attacker = append(attacker, c)
	}
	served := 0
	for _, c := range attacker {
		if alive(c) {
			served++
		}
	}
	g.Expect(served).To(Equal(3), "one peer holds at most PerIP connections")
	g.Expect(ln.Refused()).To(BeEquivalentTo(7))

	other, err := dialFrom("127.0.0.3", raw.Addr().String())
	g.Expect(err).NotTo(HaveOccurred())
	defer other.Close()
	g.Expect(alive(other)).To(BeTrue(), "another peer is served beside the one at its bound")
	g.Expect(ln.Open()).To(Equal(4))

	// Closing frees the peer's slots: its count goes back, and its entry with it.
	for _, c := range attacker {
		_ = c.Close()
	}
	g.Eventually(ln.Open).Should(Equal(1))
	again, err := dialFrom("127.0.0.2", raw.Addr().String())
	g.Expect(err).NotTo(HaveOccurred())
	defer again.Close()
	g.Expect(alive(again)).To(BeTrue())
}

func TestMaxHoldsTheRestInTheAcceptQueue(t *testing.T) {
	g := NewWithT(t)
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	g.Expect(err).NotTo(HaveOccurred())
	ln := Listen(raw, Limits{Max: 2}, nil)
	defer ln.Close()
	go serveEcho(ln)
	var conns []net.Conn
	for range 3 {
		c, err := dialFrom("127.0.0.1", raw.Addr().String())
		g.Expect(err).NotTo(HaveOccurred())
		defer c.Close()
		conns = append(conns, c)
	}
	g.Expect(alive(conns[0]) && alive(conns[1])).To(BeTrue())
	g.Expect(alive(conns[2])).To(BeFalse(), "the third waits to be accepted")
	g.Expect(ln.Open()).To(Equal(2))
	_ = conns[0].Close()
	g.Eventually(func() bool { return alive(conns[2]) }).Should(BeTrue(), "accepted once a slot is free")
}

// At the cap, the connection idle longest is closed so a new client gets in at once; busy
// connections are never closed.
func TestIdleCloserMakesRoomAtTheCap(t *testing.T) {
	g := NewWithT(t)
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	g.Expect(err).NotTo(HaveOccurred())
	var idle IdleCloser
	ln := Listen(raw, Limits{Max: 3}, func() { idle.CloseOldest() })
	release := make(chan struct{})
	var once sync.Once
	defer once.Do(func() { close(release) })
	srv := &http.Server{
		ReadHeaderTimeout: 10 * time.Second,
		ConnState:         idle.ConnState,
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/slow" {
				<-release
			}
			_, _ = io.WriteString(w, "ok")
		}),
	}
	go func() { _ = srv.Serve(ln) }()
	defer func() { _ = srv.Close() }()

	url := "http://" + raw.Addr().String()
	busy := make(chan error, 1)
	slowClient := &http.Client{Transport: &http.Transport{}}
	go func() {
		resp, err := slowClient.Get(url + "/slow")
		if err == nil {
			_, err = io.ReadAll(resp.Body)
			resp.Body.Close()
		}
		busy <- err
	}()
	g.Eventually(ln.Open).Should(Equal(1))
	// Idle keep-alive connections fill the other slots, then more clients come.
	for i := range 6 {
		c := &http.Client{Transport: &http.Transport{}, Timeout: 5 * time.Second}
		resp, err := c.Get(url + "/")
		g.Expect(err).NotTo(HaveOccurred(), "client %d waited behind idle connections", i)
		_, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
		g.Expect(ln.Open()).To(BeNumerically("<=", 3))
	}
	once.Do(func() { close(release) })
	g.Expect(<-busy).NotTo(HaveOccurred(), "the busy connection was not closed")
}
