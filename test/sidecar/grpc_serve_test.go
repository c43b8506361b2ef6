package sidecar_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/redline-dev/redline/internal/policydoc"
	"github.com/redline-dev/redline/internal/testutil/sidecartest"
)

// With an h2c upstream, requests reach the application over HTTP/2, and an upgrade, which
// HTTP/2 cannot carry, still reaches it over HTTP/1.1 and is tunnelled both ways.
func TestH2CUpstreamKeepsUpgrades(t *testing.T) {
	g := NewWithT(t)
	var protos http.Protocols
	protos.SetHTTP1(true)
	protos.SetUnencryptedHTTP2(true)
	app := &http.Server{Protocols: &protos, ReadHeaderTimeout: time.Minute, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Upgrade") != "echo" {
			_, _ = io.WriteString(w, r.Proto)
			return
		}
		conn, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		_, _ = brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\n")
		_ = brw.Flush()
		line, _ := brw.ReadString('\n')
		_, _ = brw.WriteString(r.Proto + " echo: " + line)
		_ = brw.Flush()
	})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	g.Expect(err).NotTo(HaveOccurred())
	go func() { _ = app.Serve(ln) }()
	t.Cleanup(func() { _ = app.Close() })

	e := newEnv(t, "web")
	e.write(t, sidecartest.Document(e.namespace, "p", "r", "web", 1000, time.Minute, "", "Open"))
	s := start(t, "h2c-upgrade", e, shared.URL(), ln.Addr().String(), true, "--upstream-protocol=H2C")

	resp, err := httpClient.Get(s.proxy + "/proto")
	g.Expect(err).NotTo(HaveOccurred())
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	g.Expect(resp.Proto).To(Equal("HTTP/1.1"))
	g.Expect(string(body)).To(Equal("HTTP/2.0"), "the application is spoken to over h2c")

	conn, err := net.Dial("tcp", hostPort(s.proxy))
	g.Expect(err).NotTo(HaveOccurred())
	defer conn.Close()
	_, _ = io.WriteString(conn, "GET /ws HTTP/1.1\r\nHost: app\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\n")
	cr := bufio.NewReader(conn)
	up101, err := http.ReadResponse(cr, nil)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(up101.StatusCode).To(Equal(http.StatusSwitchingProtocols))
	_, _ = io.WriteString(conn, "ping\n")
	echo, err := cr.ReadString('\n')
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(echo).To(Equal("HTTP/1.1 echo: ping\n"))
}

// HTTP/2 streams in flight are bounded over the whole face by --max-conns, as HTTP/1.1
// requests are by the connections that carry them: one connection cannot multiply what the
// bound holds. The call past it is UNAVAILABLE and never reaches the application.
func TestHTTP2StreamsInFlightAreBounded(t *testing.T) {
	g := NewWithT(t)
	e := newEnv(t, "orders")
	e.write(t, sidecartest.DocumentRules(e.namespace, "p", "orders", policydoc.Rule{
		Name: "other", Match: &policydoc.Match{ExactPath: "/other"}, Key: []policydoc.KeyPart{{Header: "x-tenant"}}, Algorithm: "FixedWindow",
		Requests: 1, WindowMS: time.Minute.Milliseconds(), Mode: "Enforce"}))
	app := newGRPCApp(t, nil)
	s := start(t, "h2-streams", e, shared.URL(), app.addr, true, "--upstream-protocol=H2C", "--max-conns=2")
	c := healthClient(t, s)
	for i := range 2 {
		w, err := c.Watch(tenant(t, "x"), &healthpb.HealthCheckRequest{Service: "orders"})
		g.Expect(err).NotTo(HaveOccurred())
		_, err = w.Recv()
		g.Expect(err).NotTo(HaveOccurred(), "watch %d", i)
	}
	w, err := c.Watch(tenant(t, "x"), &healthpb.HealthCheckRequest{Service: "orders"})
	g.Expect(err).NotTo(HaveOccurred())
	_, err = w.Recv()
	g.Expect(status.Code(err)).To(Equal(codes.Unavailable), "%v", err)
	g.Expect(status.Convert(err).Message()).To(ContainSubstring("bound of requests in flight"))
	g.Expect(app.served[watchMethod].Load()).To(BeEquivalentTo(2))
}

// A token budget takes its cost from a model API's JSON response, which a gRPC call does not
// have: a gRPC call its rule matches is refused, UNIMPLEMENTED, naming the rule, and counted;
// never charged a guess.
func TestTokenBudgetRefusesGRPC(t *testing.T) {
	g := NewWithT(t)
	e := newEnv(t, "orders")
	e.write(t, sidecartest.DocumentRules(e.namespace, "llm", "orders",
		sidecartest.BudgetRule("tokens", "x-tenant", "FixedWindow", 1000, 100, 1, policydoc.OnErrorUsed)))
	app := newGRPCApp(t, nil)
	s := start(t, "grpc-budget", e, shared.URL(), app.addr, true, "--upstream-protocol=H2C")
	_, err := healthClient(t, s).Check(tenant(t, fmt.Sprint("b-", time.Now().UnixNano())), &healthpb.HealthCheckRequest{Service: "orders"})
	g.Expect(status.Code(err)).To(Equal(codes.Unimplemented), "%v", err)
	g.Expect(status.Convert(err).Message()).To(ContainSubstring("rule tokens of policy llm"))
	g.Expect(app.served[checkMethod].Load()).To(BeZero())
	g.Expect(s.metric(t, `redline_sidecar_unsized_refusals_total{policy="llm",reason="grpc_not_sized",rule="tokens"}`)).To(BeEquivalentTo(1))
}

// A gRPC call is held to its own deadline, not to --request-timeout: a gRPC server sends its
// response headers with its answer, so a unary call slower than the timeout is still answered.
func TestGRPCCallsOutlastTheRequestTimeout(t *testing.T) {
	g := NewWithT(t)
	e := newEnv(t, "orders")
	e.write(t, grpcRules(e, 1000, 1000))
	app := newGRPCApp(t, nil)
	app.delay.Store(int64(200 * time.Millisecond)) // 20 times the timeout below
	s := start(t, "grpc-slow", e, shared.URL(), app.addr, true, "--upstream-protocol=H2C", "--request-timeout=10ms")
	resp, err := healthClient(t, s).Check(tenant(t, fmt.Sprint("slow-", time.Now().UnixNano())), &healthpb.HealthCheckRequest{Service: "orders"})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(resp.GetStatus()).To(Equal(healthpb.HealthCheckResponse_SERVING))
}
