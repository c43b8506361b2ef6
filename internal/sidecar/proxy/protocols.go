package proxy

import (
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/redline-dev/redline/internal/sidecar/contract"
)

// The proxy face serves HTTP/1.1 and HTTP/2 over cleartext (h2c, prior knowledge: what gRPC
// clients and Envoy send to a plaintext port) on one port, both from net/http. The HTTP/2
// settings below keep an HTTP/2 connection within what an HTTP/1.1 one may hold:
const (
	// MaxConcurrentStreams is the most requests one HTTP/2 connection carries at once; the
	// face's in-flight HTTP/2 requests are bounded in all by Options.MaxStreams as well.
	MaxConcurrentStreams = 100
	// ReceiveBuffer is the HTTP/2 flow-control window the server grants, per connection and
	// per stream (the protocol's least): at most 64 KiB of a client's request bodies wait in
	// the sidecar per connection, as an HTTP/1.1 connection's read buffer and copy buffer do.
	ReceiveBuffer = 64 << 10
	// PingAfter is how long an HTTP/2 connection may be silent while a stream is open before
	// the server pings it, and PingTimeout how long it waits for the answer before closing a
	// dead peer's connection (and its streams).
	PingAfter   = 60 * time.Second
	PingTimeout = 15 * time.Second
	// WriteByteTimeout closes an HTTP/2 connection that accepts no byte written to it for
	// this long: a client that stops reading cannot hold the sidecar's buffers.
	WriteByteTimeout = 30 * time.Second
)

// ServeProtocols makes srv, the proxy face's server, serve h2c beside HTTP/1.1 with the
// settings above. srv's MaxHeaderBytes bounds an HTTP/2 header list too, its IdleTimeout an
// HTTP/2 connection without streams, and its ReadHeaderTimeout the connection preface (read
// as an HTTP/1.1 request line first); the connection bounds of the listener hold for both.
func ServeProtocols(srv *http.Server) {
	var p http.Protocols
	p.SetHTTP1(true)
	p.SetUnencryptedHTTP2(true)
	srv.Protocols = &p
	srv.HTTP2 = &http.HTTP2Config{
		MaxConcurrentStreams:          MaxConcurrentStreams,
		MaxReceiveBufferPerConnection: ReceiveBuffer,
		MaxReceiveBufferPerStream:     ReceiveBuffer,
		SendPingTimeout:               PingAfter,
		PingTimeout:                   PingTimeout,
		WriteByteTimeout:              WriteByteTimeout,
	}
}

// upstreamTransport is the transport to the application for protocol (contract.
// UpstreamProtocols; "" is HTTP1), built on base, the HTTP/1.1 transport.
//
// HTTP1 is base itself, as before h2c existed. H2C speaks HTTP/2 with prior knowledge (a gRPC
// server's plaintext port), except for upgrades (WebSocket), which HTTP/2 cannot carry: those
// go over base. HTTPS speaks TLS, HTTP/2 when the application offers it by ALPN, HTTP/1.1
// otherwise.
//
// The HTTPS transport does not verify the application's certificate: the application is in the
// same pod, reached on loopback, which nothing outside the pod's network namespace can answer
// on; its certificate names the Service (or nothing the sidecar knows), never 127.0.0.1. The
// TLS is the application's requirement, not a protection between the two containers.
//
// Neither HTTP/2 transport uses the keep-alive guard (guard.go): HTTP/2 frames every response
// in its stream, so the window the guard closes does not exist there, and the guard would
// take another stream's frames for unsolicited bytes. An HTTPS application answering HTTP/1.1
// runs without it.
func upstreamTransport(protocol string, base *http.Transport, dialer *net.Dialer) (http.RoundTripper, error) {
	h2 := &http.HTTP2Config{
		// Bounded as the inbound side: at most 64 KiB of the application's response bodies
		// wait per connection.
		MaxReceiveBufferPerConnection: ReceiveBuffer,
		MaxReceiveBufferPerStream:     ReceiveBuffer,
		// More calls than a connection allows open a second connection, not a queue.
		StrictMaxConcurrentRequests: false,
		SendPingTimeout:             PingAfter,
		PingTimeout:                 PingTimeout,
		WriteByteTimeout:            WriteByteTimeout,
	}
	switch protocol {
	case "", contract.UpstreamProtocolHTTP1:
		return base, nil
	case contract.UpstreamProtocolH2C:
		t := base.Clone()
		t.DialContext = dialer.DialContext
		t.TLSNextProto = nil
		var p http.Protocols
		p.SetUnencryptedHTTP2(true)
		t.Protocols = &p
		t.HTTP2 = h2
		return newRouter(t, base), nil
	case contract.UpstreamProtocolHTTPS:
		t := base.Clone()
		t.DialContext = dialer.DialContext
		t.TLSNextProto = nil
		var p http.Protocols
		p.SetHTTP1(true)
		p.SetHTTP2(true)
		t.Protocols = &p
		t.HTTP2 = h2
		t.TLSHandshakeTimeout = dialer.Timeout
		t.TLSClientConfig = &tls.Config{
			InsecureSkipVerify: true, // loopback in the pod: see above
			MinVersion:         tls.VersionTLS12,
		}
		return newRouter(t, nil), nil
	}
	return nil, fmt.Errorf("upstream protocol %q: want one of %s", protocol, strings.Join(contract.UpstreamProtocols, ", "))
}

// router picks the transport of each request to an HTTP/2 application.
//
// A gRPC call goes without --request-timeout's bound on the response headers: a gRPC server
// sends them with its first message, which a unary call or a long-poll stream sends when it
// is done, and the call carries its own deadline (grpc-timeout), which the client enforces by
// cancelling the stream, which cancels the call upstream. Upgrades (WebSocket) go over
// HTTP/1.1 when there is an HTTP/1.1 transport, since HTTP/2 cannot carry them.
type router struct {
	h2, grpc, h1 *http.Transport
}

func newRouter(h2, h1 *http.Transport) router {
	g := h2.Clone()
	g.ResponseHeaderTimeout = 0
	return router{h2: h2, grpc: g, h1: h1}
}

func (u router) RoundTrip(r *http.Request) (*http.Response, error) {
	switch {
	case u.h1 != nil && r.Header.Get("Upgrade") != "":
		return u.h1.RoundTrip(r)
	case isGRPC(r):
		return u.grpc.RoundTrip(r)
	}
	return u.h2.RoundTrip(r)
}

// closeIdle closes the idle connections of the transports to the application.
func closeIdle(rt http.RoundTripper) {
	switch t := rt.(type) {
	case *http.Transport:
		t.CloseIdleConnections()
	case router:
		for _, tr := range []*http.Transport{t.h2, t.grpc, t.h1} {
			if tr != nil {
				tr.CloseIdleConnections()
			}
		}
	}
}

// dropH2CUpgrade removes an HTTP/1.1 request's offer to switch to h2c (RFC 7540's Upgrade:
// h2c, which net/http does not serve). Passed on, an application that accepts it would answer
// 101 and the proxy would tunnel the connection's bytes, every later HTTP/2 stream on it
// reaching the application undecided. Without the offer the request is served as HTTP/1.1;
// h2c clients use prior knowledge, which the face serves.
func dropH2CUpgrade(r *http.Request) {
	for _, v := range r.Header["Upgrade"] {
		for tok := range strings.SplitSeq(v, ",") {
			if strings.EqualFold(strings.TrimSpace(tok), "h2c") {
				delete(r.Header, "Upgrade")
				delete(r.Header, "Http2-Settings")
				return
			}
		}
	}
}
