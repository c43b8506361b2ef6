package app

import (
	"fmt"
	"net"
	"net/netip"

	"github.com/redline-dev/redline/internal/sidecar/connlimit"
)

// faceHooks are what each HTTP face does at its connection bound: close its longest-idle
// keep-alive connection.
type faceHooks struct{ proxy, admin, check func() bool }

// listeners are the sidecar's sockets.
type listeners struct {
	proxy, admin, check, grpc net.Listener
}

// addrOf is ln's address, or "" for a face turned off.
func addrOf(ln net.Listener) string {
	if ln == nil {
		return ""
	}
	return ln.Addr().String()
}

// onLoopback reports whether addr ("host:port") listens on a loopback address only: then its
// peers are the pod's own containers.
func onLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.IsLoopback()
}

// listenAll opens every configured address, or none. Every face is bounded (connlimit): in
// all, so that one client opening sockets without end cannot exhaust the sidecar's memory or
// descriptors, and per remote IP, so that one peer cannot take every slot. A face on loopback
// has no per-IP bound: its only peers are the pod's own containers, all of them 127.0.0.1.
// Each face's onFull hook runs when it reaches its bound.
func listenAll(cfg *Config, onFull faceHooks) (*listeners, error) {
	var (
		lns    listeners
		opened []net.Listener
	)
	open := func(what, addr string, lim connlimit.Limits, full func() bool) (net.Listener, error) {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			for _, l := range opened {
				_ = l.Close()
			}
			return nil, fmt.Errorf("listening for %s on %s: %w", what, addr, err)
		}
		opened = append(opened, ln)
		if onLoopback(ln.Addr().String()) {
			lim.PerIP = 0
		}
		var hook func()
		if full != nil {
			hook = func() { full() }
		}
		return connlimit.Listen(ln, lim, hook), nil
	}
	var err error
	if lns.proxy, err = open("the proxy", cfg.Listen, connlimit.Limits{Max: cfg.MaxConns, PerIP: cfg.MaxConnsPerIP}, onFull.proxy); err != nil {
		return nil, err
	}
	if lns.admin, err = open("admin", cfg.AdminListen, connlimit.Limits{Max: cfg.MaxAdminConns, PerIP: cfg.MaxAdminConnsPerIP}, onFull.admin); err != nil {
		return nil, err
	}
	if cfg.CheckListen != "" {
		if lns.check, err = open("the decision API", cfg.CheckListen, connlimit.Limits{Max: cfg.MaxCheckConns, PerIP: cfg.MaxCheckConnsPerIP}, onFull.check); err != nil {
			return nil, err
		}
	}
	if cfg.GRPCListen != "" {
		if lns.grpc, err = open("the rate limit service", cfg.GRPCListen, connlimit.Limits{Max: cfg.MaxGRPCConns, PerIP: cfg.MaxGRPCConnsPerIP}, nil); err != nil {
			return nil, err
		}
	}
	return &lns, nil
}
