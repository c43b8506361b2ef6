package sidecar_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/redline-dev/redline/internal/policydoc"
	"github.com/redline-dev/redline/internal/testutil/sidecartest"
	"github.com/redline-dev/redline/internal/testutil/tlstest"
)

// grpcApp is a real grpc-go server (its health service: Check is unary, Watch server-streaming)
// that counts the calls it served, by full method name.
type grpcApp struct {
	addr   string
	health *health.Server
	served map[string]*atomic.Int64
	// delay holds each unary call this long before it is served (nanoseconds).
	delay atomic.Int64
}

const (
	checkMethod = "/grpc.health.v1.Health/Check"
	watchMethod = "/grpc.health.v1.Health/Watch"
)

func newGRPCApp(t testing.TB, creds credentials.TransportCredentials) *grpcApp {
	a := &grpcApp{health: health.NewServer(), served: map[string]*atomic.Int64{checkMethod: {}, watchMethod: {}}}
	count := func(method string) {
		if n, ok := a.served[method]; ok {
			n.Add(1)
		}
	}
	opts := []grpc.ServerOption{
		grpc.UnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			count(info.FullMethod)
			time.Sleep(time.Duration(a.delay.Load()))
			return h(ctx, req)
		}),
		grpc.StreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			count(info.FullMethod)
			return h(srv, ss)
		}),
	}
	if creds != nil {
		opts = append(opts, grpc.Creds(creds))
	}
	srv := grpc.NewServer(opts...)
	healthpb.RegisterHealthServer(srv, a.health)
	a.health.SetServingStatus("orders", healthpb.HealthCheckResponse_SERVING)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a.addr = ln.Addr().String()
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	return a
}

// grpcRules counts each health method apart, per value of the x-tenant metadata.
func grpcRules(e *env, checks, watches int64) []byte {
	rule := func(name, method string, n int64) policydoc.Rule {
		return policydoc.Rule{Name: name, Match: &policydoc.Match{ExactPath: method, Methods: []string{http.MethodPost}},
			Key:       []policydoc.KeyPart{{Header: "x-tenant"}},
			Algorithm: "FixedWindow", Requests: n, WindowMS: time.Hour.Milliseconds(), Mode: "Enforce"}
	}
	return sidecartest.DocumentRules(e.namespace, "grpc", "orders",
		rule("checks", checkMethod, checks), rule("watches", watchMethod, watches))
}

// healthClient dials the sidecar's proxy face with plaintext HTTP/2, as a gRPC client does.
func healthClient(t testing.TB, s *sidecar) healthpb.HealthClient {
	conn, err := grpc.NewClient(hostPort(s.proxy), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return healthpb.NewHealthClient(conn)
}

func tenant(t *testing.T, name string) context.Context {
	return metadata.AppendToOutgoingContext(ctxTimeout(t, time.Minute), "x-tenant", name)
}

// expectGRPCCalls drives the application through the sidecar: per tenant, the Check calls
// and Watch streams its rules admit, then RESOURCE_EXHAUSTED with the RateLimit fields; each
// tenant counted apart. The application counts what it served.
func expectGRPCCalls(t *testing.T, s *sidecar, app *grpcApp, prefix string) {
	g := NewWithT(t)
	c := healthClient(t, s)
	check := func(who string) (*metadata.MD, error) {
		var hdr, trl metadata.MD
		_, err := c.Check(tenant(t, who), &healthpb.HealthCheckRequest{Service: "orders"}, grpc.Header(&hdr), grpc.Trailer(&trl))
		all := metadata.Join(hdr, trl)
		return &all, err
	}
	for _, who := range []string{prefix + "-a", prefix + "-b"} {
		for i := range 3 {
			_, err := check(who)
			g.Expect(err).NotTo(HaveOccurred(), "check %d of %s", i, who)
		}
		md, err := check(who)
		st := status.Convert(err)
		g.Expect(st.Code()).To(Equal(codes.ResourceExhausted), "the 4th check of %s: %v", who, err)
		g.Expect(st.Message()).To(ContainSubstring("rule checks"))
		g.Expect(md.Get("ratelimit")).To(ConsistOf(MatchRegexp(`^"grpc/checks";r=0;t=\d+$`)))
		g.Expect(md.Get("retry-after")).To(HaveLen(1))
	}
	g.Expect(app.served[checkMethod].Load()).To(BeEquivalentTo(6), "the application served the admitted checks only")

	// Server streaming: two Watch streams pass and stay open (a status change reaches each
	// as a second message), the third is refused before the application sees it.
	who := prefix + "-a"
	cur, other := healthpb.HealthCheckResponse_SERVING, healthpb.HealthCheckResponse_NOT_SERVING
	for i := range 2 {
		w, err := c.Watch(tenant(t, who), &healthpb.HealthCheckRequest{Service: "orders"})
		g.Expect(err).NotTo(HaveOccurred())
		first, err := w.Recv()
		g.Expect(err).NotTo(HaveOccurred(), "watch %d", i)
		g.Expect(first.GetStatus()).To(Equal(cur))
		app.health.SetServingStatus("orders", other)
		second, err := w.Recv()
		g.Expect(err).NotTo(HaveOccurred(), "watch %d's second message", i)
		g.Expect(second.GetStatus()).To(Equal(other))
		cur, other = other, cur
	}
	w, err := c.Watch(tenant(t, who), &healthpb.HealthCheckRequest{Service: "orders"})
	g.Expect(err).NotTo(HaveOccurred())
	_, err = w.Recv()
	g.Expect(status.Code(err)).To(Equal(codes.ResourceExhausted), "the 3rd watch: %v", err)
	g.Expect(app.served[watchMethod].Load()).To(BeEquivalentTo(2))
}

// A grpc-go client through the built sidecar to a grpc-go server on h2c: unary and
// server-streaming calls admitted up to each method's limit per tenant (metadata), then
// RESOURCE_EXHAUSTED.
func TestGRPCThroughTheProxyToH2C(t *testing.T) {
	e := newEnv(t, "orders")
	e.write(t, grpcRules(e, 3, 2))
	app := newGRPCApp(t, nil)
	s := start(t, "grpc-h2c", e, shared.URL(), app.addr, true, "--upstream-protocol=H2C")
	expectGRPCCalls(t, s, app, fmt.Sprint("h2c-", time.Now().UnixNano()))

	// A key sent twice is the client's error, as an HTTP 400 is: INVALID_ARGUMENT, uncounted.
	ctx := metadata.AppendToOutgoingContext(ctxTimeout(t, time.Minute), "x-tenant", "one", "x-tenant", "two")
	_, err := healthClient(t, s).Check(ctx, &healthpb.HealthCheckRequest{Service: "orders"})
	NewWithT(t).Expect(status.Code(err)).To(Equal(codes.InvalidArgument), "%v", err)
	NewWithT(t).Expect(app.served[checkMethod].Load()).To(BeEquivalentTo(6))
}

// An application that is down is UNAVAILABLE to a gRPC caller, as a 502 is to others.
func TestGRPCToAnApplicationDown(t *testing.T) {
	e := newEnv(t, "orders")
	e.write(t, grpcRules(e, 3, 2))
	s := start(t, "grpc-down", e, shared.URL(), freePort(t), true, "--upstream-protocol=H2C")
	_, err := healthClient(t, s).Check(tenant(t, fmt.Sprint("down-", time.Now().UnixNano())), &healthpb.HealthCheckRequest{Service: "orders"})
	NewWithT(t).Expect(status.Code(err)).To(Equal(codes.Unavailable), "%v", err)
	NewWithT(t).Expect(status.Convert(err).Message()).To(ContainSubstring("application is unavailable"))
}

// The same through an application that serves gRPC over TLS only, with a certificate for its
// Service's name (not for the loopback address the sidecar dials).
func TestGRPCThroughTheProxyToTLS(t *testing.T) {
	g := NewWithT(t)
	ca, err := tlstest.NewCA("app-ca")
	g.Expect(err).NotTo(HaveOccurred())
	pair, err := ca.Node("orders.shop.svc")
	g.Expect(err).NotTo(HaveOccurred())
	cert, err := tls.X509KeyPair(pair.CertPEM, pair.KeyPEM)
	g.Expect(err).NotTo(HaveOccurred())
	e := newEnv(t, "orders")
	e.write(t, grpcRules(e, 3, 2))
	app := newGRPCApp(t, credentials.NewServerTLSFromCert(&cert))
	s := start(t, "grpc-tls", e, shared.URL(), app.addr, true, "--upstream-protocol=HTTPS")
	expectGRPCCalls(t, s, app, fmt.Sprint("tls-", time.Now().UnixNano()))
}

// An HTTP/2 client without TLS (prior knowledge) and an HTTP/1.1 client on the same port, to
// an HTTP/1.1 application: both admitted and refused alike, the refusal a 429 with its JSON.
func TestH2CAndHTTP1OnOnePort(t *testing.T) {
	g := NewWithT(t)
	up := newUpstream(t)
	e := newEnv(t, "web")
	e.write(t, sidecartest.Document(e.namespace, "p", "per-key", "web", 2, time.Hour, "x-key", "Open"))
	s := start(t, "h2c", e, shared.URL(), up.addr(), true)
	var h2 http.Protocols
	h2.SetUnencryptedHTTP2(true)
	clients := map[string]*http.Client{
		"HTTP/2.0": {Transport: &http.Transport{Protocols: &h2}},
		"HTTP/1.1": {Transport: &http.Transport{}},
	}
	for proto, c := range clients {
		key := fmt.Sprint(proto, time.Now().UnixNano())
		send := func() (*http.Response, string) {
			req, _ := http.NewRequest(http.MethodGet, s.proxy+"/api/orders", nil)
			req.Header.Set("X-Key", key)
			resp, err := c.Do(req)
			g.Expect(err).NotTo(HaveOccurred())
			defer resp.Body.Close()
			body, err := io.ReadAll(resp.Body)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(resp.Proto).To(Equal(proto))
			return resp, string(body)
		}
		for range 2 {
			resp, body := send()
			g.Expect(resp.StatusCode).To(Equal(http.StatusOK), proto)
			g.Expect(body).To(HavePrefix("hello GET /api/orders"))
		}
		resp, body := send()
		g.Expect(resp.StatusCode).To(Equal(http.StatusTooManyRequests), proto)
		g.Expect(resp.Header.Get("Content-Type")).To(Equal("application/json"))
		g.Expect(strings.TrimSpace(body)).To(ContainSubstring(`"rule":"per-key"`))
		c.CloseIdleConnections()
	}
	g.Expect(up.hits.Load()).To(BeEquivalentTo(4))
}
