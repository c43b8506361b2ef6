package sidecar_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	. "github.com/onsi/gomega"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/redline-dev/redline/internal/testutil/sidecartest"
)

// These tests attack the sidecar's ports as another pod on the pod network would. Every face
// listens on all interfaces, as the injector configures the proxy and the admin port (and the
// decision faces of a pod that exposes them); Linux routes all of 127/8 to loopback, so each
// peer is a source address of its own: the attacker 127.0.0.2, the well-behaved client
// 127.0.0.3.

const (
	attackerIP = "127.0.0.2"
	goodIP     = "127.0.0.3"
	// memoryLimit is the injector's default limit for the sidecar container (64Mi).
	memoryLimit = 64 << 20
)

func dialerFrom(ip string) *net.Dialer {
	return &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 3 * time.Second}
}

// dialFrom is a grpc-go context dialer whose connections come from ip.
func dialFrom(ip string) func(ctx context.Context, addr string) (net.Conn, error) {
	return func(ctx context.Context, addr string) (net.Conn, error) {
		return dialerFrom(ip).DialContext(ctx, "tcp", addr)
	}
}

// clientFrom is an HTTP client whose connections come from ip.
func clientFrom(ip string) *http.Client {
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: dialerFrom(ip).DialContext}}
}

// hostPort strips the scheme from one of the sidecar's base URLs.
func hostPort(base string) string { return strings.TrimPrefix(base, "http://") }

// idleFlood opens n connections to addr from the attacker's address, n/64 at a time. On each
// one that gets accepted in time, request (when set) is sent and its answer read: the
// connection is then an idle keep-alive connection, the costliest kind a server holds for
// free. It returns the connections still open.
func idleFlood(t *testing.T, addr string, n int, request string) []net.Conn {
	t.Helper()
	var (
		mu    sync.Mutex
		conns []net.Conn
		next  atomic.Int64
		wg    sync.WaitGroup
	)
	d := dialerFrom(attackerIP)
	for range 64 {
		wg.Go(func() {
			for next.Add(1) <= int64(n) {
				c, err := d.Dial("tcp", addr)
				if err != nil {
					continue // the accept queue is full: the sidecar is not accepting more
				}
				mu.Lock()
				conns = append(conns, c)
				mu.Unlock()
				if request == "" {
					continue
				}
				_ = c.SetDeadline(time.Now().Add(2 * time.Second))
				if _, err := io.WriteString(c, request); err == nil {
					if resp, err := http.ReadResponse(bufio.NewReader(c), nil); err == nil {
						_, _ = io.Copy(io.Discard, resp.Body)
						resp.Body.Close()
					}
				}
				_ = c.SetDeadline(time.Time{})
			}
		})
	}
	wg.Wait()
	t.Cleanup(func() {
		for _, c := range conns {
			_ = c.Close()
		}
	})
	return conns
}

// grpcFlood opens n HTTP/2 connections to addr from the attacker's address, each with a
// Health/Watch stream (which, where served, stays open until the connection's maximum age).
func grpcFlood(t *testing.T, addr string, n int) []net.Conn {
	t.Helper()
	var conns []net.Conn
	d := dialerFrom(attackerIP)
	for range n {
		c, err := d.Dial("tcp", addr)
		if err != nil {
			continue
		}
		conns = append(conns, c)
		_ = c.SetWriteDeadline(time.Now().Add(time.Second))
		if _, err := io.WriteString(c, http2.ClientPreface); err != nil {
			continue
		}
		fr := http2.NewFramer(c, c)
		_ = fr.WriteSettings()
		go func() { _, _ = io.Copy(io.Discard, c) }()
		var hbuf bytes.Buffer
		enc := hpack.NewEncoder(&hbuf)
		for _, hf := range [][2]string{
			{":method", "POST"}, {":scheme", "http"}, {":authority", "sidecar"},
			{":path", "/grpc.health.v1.Health/Watch"}, {"content-type", "application/grpc"}, {"te", "trailers"},
		} {
			_ = enc.WriteField(hpack.HeaderField{Name: hf[0], Value: hf[1]})
		}
		_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: hbuf.Bytes(), EndHeaders: true})
		_ = fr.WriteData(1, true, []byte{0, 0, 0, 0, 0}) // an empty HealthCheckRequest
	}
	t.Cleanup(func() {
		for _, c := range conns {
			_ = c.Close()
		}
	})
	return conns
}

func exposedFaces() []string {
	return []string{"--listen=0.0.0.0:0", "--admin-listen=0.0.0.0:0", "--check-listen=0.0.0.0:0", "--grpc-listen=0.0.0.0:0"}
}

// Thousands of idle connections from one pod to each face neither kill the sidecar nor take
// its memory past the container's limit, and a well-behaved client on another address keeps
// getting decisions and health answers. Before every listener was bounded, each idle
// keep-alive connection cost about 20 KiB for 120 s: some 2,300 of them went past 64 MiB.
func TestIdleConnectionFloodOnEveryFace(t *testing.T) {
	g := NewWithT(t)
	up := newUpstream(t)
	e := newEnv(t, "web")
	e.write(t, sidecartest.DocumentAlgorithm(e.namespace, "p", "r", "web", 1_000_000, time.Minute, "x-key", "Open", "FixedWindow"))
	s := startWithEnv(t, "flooded", e, up.addr(), []string{fmt.Sprintf("REDLINE_MEMORY_LIMIT=%d", memoryLimit)}, exposedFaces()...)
	g.Expect(s.Log()).To(ContainSubstring(`"goMemoryLimitBytes":57042480`), "Go's memory limit is 85%% of the container's")
	good := clientFrom(goodIP)
	pid := s.Pid()
	before := rssMiB(t, pid)

	var peak atomic.Value
	peak.Store(before)
	stopSampling := make(chan struct{})
	var sampler sync.WaitGroup
	sampler.Go(func() {
		for {
			select {
			case <-stopSampling:
				return
			case <-time.After(50 * time.Millisecond):
			}
			if r := rssKiB(pid) / 1024; r > peak.Load().(float64) {
				peak.Store(r)
			}
		}
	})

	proxyConns := idleFlood(t, hostPort(s.proxy), 5000, "GET / HTTP/1.1\r\nHost: app\r\nX-Key: attacker\r\n\r\n")
	adminConns := idleFlood(t, hostPort(s.admin), 3000, "GET /healthz HTTP/1.1\r\nHost: sidecar\r\n\r\n")
	checkConns := idleFlood(t, hostPort(s.check), 2000,
		"POST /v1/check HTTP/1.1\r\nHost: sidecar\r\nContent-Length: 39\r\n\r\n{\"policy\":\"p\",\"rule\":\"r\",\"key\":[\"att\"]}")
	grpcConns := grpcFlood(t, s.grpc, 500)
	t.Logf("attacker holds %d proxy, %d admin, %d check and %d gRPC sockets; sidecar RSS %.1f MiB",
		len(proxyConns), len(adminConns), len(checkConns), len(grpcConns), rssKiB(pid)/1024)

	// The sidecar lives and serves the well-behaved client on every face.
	for i := range 20 {
		resp, err := good.Get(s.admin + "/healthz")
		g.Expect(err).NotTo(HaveOccurred(), "healthz %d", i)
		resp.Body.Close()
		g.Expect(resp.StatusCode).To(Equal(http.StatusOK))

		req, _ := http.NewRequest(http.MethodGet, s.proxy+"/", nil)
		req.Header.Set("X-Key", fmt.Sprint("good-", i))
		resp, err = good.Do(req)
		g.Expect(err).NotTo(HaveOccurred(), "proxied request %d", i)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		g.Expect(resp.StatusCode).To(Equal(http.StatusOK))

		d, err := check(good, s, fmt.Sprintf(`{"policy":"p","rule":"r","key":["good-%d"]}`, i))
		g.Expect(err).NotTo(HaveOccurred(), "check %d", i)
		g.Expect(d.Allowed).To(BeTrue())
	}
	conn, err := grpc.NewClient(s.grpc, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(dialFrom(goodIP)))
	g.Expect(err).NotTo(HaveOccurred())
	defer func() { _ = conn.Close() }()
	resp, err := rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctxTimeout(t, 10*time.Second), rlsDescriptor("good", nil))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(resp.OverallCode).To(Equal(rlsv3.RateLimitResponse_OK))

	close(stopSampling)
	sampler.Wait()
	select {
	case <-s.Done():
		t.Fatalf("the sidecar died under the flood: %v", s.exitErr())
	default:
	}
	after := peak.Load().(float64)
	t.Logf("RSS %.1f MiB before, %.1f MiB peak under the flood (limit %d MiB)", before, after, memoryLimit>>20)
	g.Expect(after).To(BeNumerically("<", memoryLimit>>20), "the sidecar stays under its container's memory limit")
}

// One peer opening more connections than the exposed rate limit service accepts, each with a
// Health/Watch stream, cannot starve another peer: it gets --max-grpc-conns-per-ip of them,
// its streams are refused, and the other peer's calls are answered. Before, its 32 Watch
// streams held every slot for the 30 minutes of MaxConnectionAge.
func TestOnePeerCannotHoldTheExposedRLS(t *testing.T) {
	g := NewWithT(t)
	e := newEnv(t, "web")
	e.write(t, sidecartest.DocumentAlgorithm(e.namespace, "p", "r", "web", 1_000_000, time.Minute, "x-key", "Open", "FixedWindow"))
	s := start(t, "rls-peers", e, shared.URL(), "127.0.0.1:1", true, "--grpc-listen=0.0.0.0:0")

	// The attacker, with grpc-go: 40 connections (over the 32 the face accepts), a Watch each.
	watchErrs := make(chan error, 40)
	for range 40 {
		conn, err := grpc.NewClient(s.grpc, grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithContextDialer(dialFrom(attackerIP)))
		g.Expect(err).NotTo(HaveOccurred())
		t.Cleanup(func() { _ = conn.Close() })
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			w, err := healthpb.NewHealthClient(conn).Watch(ctx, &healthpb.HealthCheckRequest{})
			if err == nil {
				for {
					if _, err = w.Recv(); err != nil {
						break
					}
				}
			}
			watchErrs <- err
		}()
	}
	// The attacker's Watch streams end: refused on the connections it got (its per-IP share,
	// which it keeps open), and its other connections closed on accept. None waits for its
	// deadline. (Collected before the raw flood below, which would otherwise race these
	// connections for the attacker's share.)
	refused := 0
	for range 40 {
		select {
		case err := <-watchErrs:
			g.Expect(status.Code(err)).To(BeElementOf(codes.PermissionDenied, codes.Unavailable), "a Watch on the exposed face: %v", err)
			if status.Code(err) == codes.PermissionDenied {
				refused++
			}
		case <-time.After(30 * time.Second):
			t.Fatal("an attacker's Watch stream is still open")
		}
	}
	g.Expect(refused).To(BeNumerically(">", 0), "some Watch calls reached the service and were refused")

	// Raw HTTP/2 connections too, each with a Watch stream, which grpc-go's client would not
	// keep open on its own after a refusal.
	raw := grpcFlood(t, s.grpc, 40)
	g.Expect(raw).NotTo(BeEmpty())

	good, err := grpc.NewClient(s.grpc, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(dialFrom(goodIP)))
	g.Expect(err).NotTo(HaveOccurred())
	defer func() { _ = good.Close() }()
	rl := rlsv3.NewRateLimitServiceClient(good)
	for i := range 10 {
		resp, err := rl.ShouldRateLimit(ctxTimeout(t, 10*time.Second), rlsDescriptor(fmt.Sprint("good-", i), nil))
		g.Expect(err).NotTo(HaveOccurred(), "the other peer's call %d", i)
		g.Expect(resp.OverallCode).To(Equal(rlsv3.RateLimitResponse_OK))
	}
	hc, err := healthpb.NewHealthClient(good).Check(ctxTimeout(t, 10*time.Second), &healthpb.HealthCheckRequest{})
	g.Expect(err).NotTo(HaveOccurred(), "Health/Check is served on the exposed face")
	g.Expect(hc.Status).To(Equal(healthpb.HealthCheckResponse_SERVING))

}

// A path-prefix rule holds whichever spelling of the path a client sends, and the application
// is sent the path that was matched. Before, /./admin/x and //admin/x were matched raw, passed
// uncounted, and the application (which cleans the path) served /admin/x.
func TestPathSpellingsShareTheirRule(t *testing.T) {
	g := NewWithT(t)
	up := newUpstream(t)
	e := newEnv(t, "web")
	e.write(t, sidecartest.DocumentPathPrefix(e.namespace, "p", "admin", "web", 2, time.Minute, "x-key", "/admin/"))
	s := start(t, "paths", e, shared.URL(), up.addr(), true)
	send := func(target string) (int, string) {
		c, err := net.Dial("tcp", hostPort(s.proxy))
		g.Expect(err).NotTo(HaveOccurred())
		defer func() { _ = c.Close() }()
		_, err = fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: app\r\nX-Key: k\r\nConnection: close\r\n\r\n", target)
		g.Expect(err).NotTo(HaveOccurred())
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		g.Expect(err).NotTo(HaveOccurred(), target)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp.StatusCode, string(body)
	}
	code, body := send("/./admin/users")
	g.Expect(code).To(Equal(http.StatusOK))
	g.Expect(body).To(HavePrefix("hello GET /admin/users "), "the application is sent the matched path")
	code, _ = send("//admin//users")
	g.Expect(code).To(Equal(http.StatusOK))
	g.Expect(up.hits.Load()).To(BeEquivalentTo(2))
	for _, target := range []string{"/admin/users", "/public/../admin/users", "/%61dmin/users", "/admin/./users"} {
		code, _ = send(target)
		g.Expect(code).To(Equal(http.StatusTooManyRequests), "%s is under the /admin/ rule, whose 2 requests are spent", target)
	}
	code, _ = send("/admin%2Fusers")
	g.Expect(code).To(Equal(http.StatusBadRequest), "an encoded slash is refused")
	code, body = send("/public/./page")
	g.Expect(code).To(Equal(http.StatusOK))
	g.Expect(body).To(HavePrefix("hello GET /public/page "))
	g.Expect(up.hits.Load()).To(BeEquivalentTo(3))
}

// The proxy's bound holds at the worst a connection can cost: every slot taken by a client in
// the middle of a request header block just under --max-header-bytes.
func TestHeaderFloodStaysUnderTheMemoryLimit(t *testing.T) {
	g := NewWithT(t)
	up := newUpstream(t)
	e := newEnv(t, "web")
	e.write(t, sidecartest.Document(e.namespace, "p", "r", "web", 1_000_000, time.Minute, "x-key", "Open"))
	s := startWithEnv(t, "headers", e, up.addr(), []string{fmt.Sprintf("REDLINE_MEMORY_LIMIT=%d", memoryLimit)}, "--listen=0.0.0.0:0")
	pid := s.Pid()
	before := rssKiB(pid) / 1024

	// 1,000 connections (3x the bound at 64Mi), each sending 60 KiB of header lines of 1 KiB
	// and never the blank line that ends them.
	line := "X-Filler: " + strings.Repeat("a", 1012) + "\r\n"
	var (
		mu    sync.Mutex
		conns []net.Conn
		wg    sync.WaitGroup
		next  atomic.Int64
	)
	t.Cleanup(func() {
		for _, c := range conns {
			_ = c.Close()
		}
	})
	d := dialerFrom(attackerIP)
	for range 32 {
		wg.Go(func() {
			for next.Add(1) <= 1000 {
				c, err := d.Dial("tcp", hostPort(s.proxy))
				if err != nil {
					continue
				}
				mu.Lock()
				conns = append(conns, c)
				mu.Unlock()
				_ = c.SetWriteDeadline(time.Now().Add(2 * time.Second))
				if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: app\r\n"); err != nil {
					continue
				}
				for range 60 {
					if _, err := io.WriteString(c, line); err != nil {
						break
					}
				}
			}
		})
	}
	wg.Wait()
	peak := 0.0
	for range 20 { // two seconds, well within --read-header-timeout
		peak = max(peak, rssKiB(pid)/1024)
		time.Sleep(100 * time.Millisecond)
	}
	select {
	case <-s.Done():
		t.Fatalf("the sidecar died under the flood: %v", s.exitErr())
	default:
	}
	t.Logf("RSS %.1f MiB before, %.1f MiB peak with %d connections sending 60 KiB header blocks", before, peak, len(conns))
	g.Expect(peak).To(BeNumerically("<", memoryLimit>>20), "the sidecar stays under its container's memory limit")
}
