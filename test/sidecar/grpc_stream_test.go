package sidecar_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/redline-dev/redline/internal/policydoc"
	"github.com/redline-dev/redline/internal/testutil/sidecartest"
)

const (
	duplexMethod = "/grpc.testing.TestService/FullDuplexCall"
	inputMethod  = "/grpc.testing.TestService/StreamingInputCall"
)

// streamApp is grpc's interop TestService (its generated types), with the two streaming
// methods a proxy could break by buffering: client streaming sums what it received, full
// duplex echoes each message as it arrives and ends with a trailer counting them.
type streamApp struct {
	testgrpc.UnimplementedTestServiceServer
	duplexCalls atomic.Int64
}

func (a *streamApp) StreamingInputCall(s grpc.ClientStreamingServer[testgrpc.StreamingInputCallRequest, testgrpc.StreamingInputCallResponse]) error {
	var n int
	for {
		m, err := s.Recv()
		if errors.Is(err, io.EOF) {
			return s.SendAndClose(&testgrpc.StreamingInputCallResponse{AggregatedPayloadSize: int32(n)})
		}
		if err != nil {
			return err
		}
		n += len(m.GetPayload().GetBody())
	}
}

func (a *streamApp) FullDuplexCall(s grpc.BidiStreamingServer[testgrpc.StreamingOutputCallRequest, testgrpc.StreamingOutputCallResponse]) error {
	a.duplexCalls.Add(1)
	n := 0
	for {
		m, err := s.Recv()
		if errors.Is(err, io.EOF) {
			s.SetTrailer(metadata.Pairs("x-echoed", strconv.Itoa(n)))
			return nil
		}
		if err != nil {
			return err
		}
		n++
		if err := s.Send(&testgrpc.StreamingOutputCallResponse{Payload: m.GetPayload()}); err != nil {
			return err
		}
	}
}

// Client streaming with messages larger than the flow-control windows, and full duplex
// ping-pong (each answer read before the next message is sent, which a proxy buffering either
// direction would deadlock), pass through the sidecar to an h2c gRPC server; the server's
// trailer reaches the client; the duplex method's rule admits 2 calls per tenant, then
// RESOURCE_EXHAUSTED.
func TestGRPCClientAndBidiStreamsPassThrough(t *testing.T) {
	g := NewWithT(t)
	app := &streamApp{}
	srv := grpc.NewServer()
	testgrpc.RegisterTestServiceServer(srv, app)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	g.Expect(err).NotTo(HaveOccurred())
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)

	e := newEnv(t, "orders")
	e.write(t, sidecartest.DocumentRules(e.namespace, "grpc", "orders", policydoc.Rule{
		Name: "duplex", Match: &policydoc.Match{ExactPath: duplexMethod}, Key: []policydoc.KeyPart{{Header: "x-tenant"}},
		Algorithm: "FixedWindow", Requests: 2, WindowMS: time.Hour.Milliseconds(), Mode: "Enforce"}))
	s := start(t, "grpc-streams", e, shared.URL(), ln.Addr().String(), true, "--upstream-protocol=H2C")
	conn, err := grpc.NewClient(hostPort(s.proxy), grpc.WithTransportCredentials(insecure.NewCredentials()))
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { _ = conn.Close() })
	c := testgrpc.NewTestServiceClient(conn)
	who := fmt.Sprint("streams-", time.Now().UnixNano())

	// Client streaming: 3 messages of 100 KiB, over the 64 KiB windows on both sides.
	in, err := c.StreamingInputCall(tenant(t, who))
	g.Expect(err).NotTo(HaveOccurred())
	for range 3 {
		g.Expect(in.Send(&testgrpc.StreamingInputCallRequest{Payload: &testgrpc.Payload{Body: bytes.Repeat([]byte{'x'}, 100<<10)}})).To(Succeed())
	}
	sum, err := in.CloseAndRecv()
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(sum.GetAggregatedPayloadSize()).To(BeEquivalentTo(300 << 10))

	duplex := func() error {
		d, err := c.FullDuplexCall(tenant(t, who))
		if err != nil {
			return err
		}
		for i := range 3 {
			body := []byte(fmt.Sprint("ping ", i))
			if err := d.Send(&testgrpc.StreamingOutputCallRequest{Payload: &testgrpc.Payload{Body: body}}); err != nil && !errors.Is(err, io.EOF) {
				return err
			}
			got, err := d.Recv()
			if err != nil {
				return err
			}
			g.Expect(got.GetPayload().GetBody()).To(Equal(body))
		}
		g.Expect(d.CloseSend()).To(Succeed())
		_, err = d.Recv()
		g.Expect(err).To(MatchError(io.EOF))
		g.Expect(d.Trailer().Get("x-echoed")).To(ConsistOf("3"), "the application's trailer reaches the client")
		return nil
	}
	g.Expect(duplex()).To(Succeed())
	g.Expect(duplex()).To(Succeed())
	err = duplex()
	g.Expect(status.Code(err)).To(Equal(codes.ResourceExhausted), "%v", err)
	g.Expect(app.duplexCalls.Load()).To(BeEquivalentTo(2))
}
