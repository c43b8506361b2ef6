package rls_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	. "github.com/onsi/gomega"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	grpcgzip "google.golang.org/grpc/encoding/gzip"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/redline-dev/redline/internal/limiter"
	"github.com/redline-dev/redline/internal/sidecar/decide"
	"github.com/redline-dev/redline/internal/sidecar/rls"
	"github.com/redline-dev/redline/internal/sidecar/ruleset"
	"github.com/redline-dev/redline/internal/testutil/sidecartest"
)

// blockingLimiter holds every call until release is closed or the call's context ends, and
// records the deadlines it was given.
type blockingLimiter struct {
	entered chan struct{}
	release chan struct{}
	// outlast keeps a call past its context's end until release: its answer then cannot
	// reach a client before the client's own deadline, however loaded the machine.
	outlast   bool
	mu        sync.Mutex
	deadlines []time.Time
}

func newBlockingLimiter() *blockingLimiter {
	return &blockingLimiter{entered: make(chan struct{}, 100), release: make(chan struct{})}
}

func (b *blockingLimiter) Allow(ctx context.Context, _ string, l limiter.Limit, _ int64) (limiter.Result, error) {
	d, _ := ctx.Deadline()
	b.mu.Lock()
	b.deadlines = append(b.deadlines, d)
	b.mu.Unlock()
	b.entered <- struct{}{}
	select {
	case <-b.release:
		return limiter.Result{Allowed: true, Remaining: l.Requests - 1, ResetAfter: l.Window}, nil
	case <-ctx.Done():
		if b.outlast {
			<-b.release
		}
		return limiter.Result{}, ctx.Err()
	}
}

func rlsRequest() *rlsv3.RateLimitRequest {
	return &rlsv3.RateLimitRequest{Descriptors: []*rlv3.RateLimitDescriptor{desc("generic_key", "p/r", "k", "a")}}
}

// What a grpc-go client sees of the protocol around ShouldRateLimit.
func TestGRPCClient(t *testing.T) {
	store := sidecartest.Store(t, 1000, time.Minute)
	addr, _ := serve(t, &rls.Server{Engine: &decide.Engine{Limiter: sidecartest.FakeLimiter{Decide: (&countingLimiter{}).Allow}}, Store: store})
	conn := dial(t, addr)
	client := rlsv3.NewRateLimitServiceClient(conn)

	t.Run("unknown method and service", func(t *testing.T) {
		g := NewWithT(t)
		for _, m := range []string{"/envoy.service.ratelimit.v3.RateLimitService/Nope", "/some.Service/ShouldRateLimit"} {
			err := conn.Invoke(ctxTimeout(t, 10*time.Second), m, rlsRequest(), &rlsv3.RateLimitResponse{})
			g.Expect(status.Code(err)).To(Equal(codes.Unimplemented), m)
		}
		// The connection stays usable.
		_, err := client.ShouldRateLimit(ctxTimeout(t, 10*time.Second), rlsRequest())
		g.Expect(err).NotTo(HaveOccurred())
	})

	t.Run("message over 64 KiB", func(t *testing.T) {
		g := NewWithT(t)
		req := rlsRequest()
		req.Domain = strings.Repeat("d", rls.MaxMessageSize)
		_, err := client.ShouldRateLimit(ctxTimeout(t, 10*time.Second), req)
		g.Expect(status.Code(err)).To(Equal(codes.ResourceExhausted))
		req.Domain = strings.Repeat("d", rls.MaxMessageSize-proto.Size(rlsRequest())-4)
		g.Expect(proto.Size(req)).To(BeNumerically("<=", rls.MaxMessageSize))
		_, err = client.ShouldRateLimit(ctxTimeout(t, 10*time.Second), req)
		g.Expect(err).NotTo(HaveOccurred(), "64 KiB is allowed")
	})

	t.Run("compressed by the client", func(t *testing.T) {
		g := NewWithT(t)
		_, err := client.ShouldRateLimit(ctxTimeout(t, 10*time.Second), rlsRequest(), grpc.UseCompressor(grpcgzip.Name))
		g.Expect(err).NotTo(HaveOccurred(), "this test binary links grpc's gzip codec")
	})

	t.Run("a compressed message that inflates beyond 64 KiB", func(t *testing.T) {
		g := NewWithT(t)
		req := rlsRequest()
		req.Domain = strings.Repeat("d", 8<<20) // 8 MiB of one byte: a few KiB of gzip
		raw, err := proto.Marshal(req)
		g.Expect(err).NotTo(HaveOccurred())
		var zb bytes.Buffer
		zw := gzip.NewWriter(&zb)
		_, _ = zw.Write(raw)
		g.Expect(zw.Close()).To(Succeed())
		g.Expect(zb.Len()).To(BeNumerically("<", rls.MaxMessageSize), "the bomb itself fits the limit")
		_, err = client.ShouldRateLimit(ctxTimeout(t, 10*time.Second), req, grpc.UseCompressor(grpcgzip.Name))
		g.Expect(status.Code(err)).To(Equal(codes.ResourceExhausted))
		_, err = client.ShouldRateLimit(ctxTimeout(t, 10*time.Second), rlsRequest())
		g.Expect(err).NotTo(HaveOccurred(), "the connection stays usable")
	})

	t.Run("metadata is ignored", func(t *testing.T) {
		g := NewWithT(t)
		ctx := metadata.AppendToOutgoingContext(ctxTimeout(t, 10*time.Second), "x-envoy-thing", "1", "bin-bin", "\x00\x01")
		var hdr, trl metadata.MD
		resp, err := client.ShouldRateLimit(ctx, rlsRequest(), grpc.Header(&hdr), grpc.Trailer(&trl))
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(resp.OverallCode).To(Equal(rlsv3.RateLimitResponse_OK))
		g.Expect(hdr.Get("content-type")).To(Equal([]string{"application/grpc"}))
	})

	t.Run("many concurrent calls on one connection", func(t *testing.T) {
		g := NewWithT(t)
		var wg sync.WaitGroup
		var failed atomic.Int64
		for range 500 { // more than the server's 64 concurrent streams: grpc-go queues
			wg.Go(func() {
				resp, err := client.ShouldRateLimit(ctxTimeout(t, 30*time.Second), rlsRequest())
				if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK {
					failed.Add(1)
				}
			})
		}
		wg.Wait()
		g.Expect(failed.Load()).To(BeZero())
	})

	t.Run("health", func(t *testing.T) {
		g := NewWithT(t)
		health := healthpb.NewHealthClient(conn)
		for _, svc := range []string{"", "envoy.service.ratelimit.v3.RateLimitService"} {
			resp, err := health.Check(ctxTimeout(t, 10*time.Second), &healthpb.HealthCheckRequest{Service: svc})
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(resp.Status).To(Equal(healthpb.HealthCheckResponse_SERVING))
		}
		_, err := health.Check(ctxTimeout(t, 10*time.Second), &healthpb.HealthCheckRequest{Service: "other"})
		g.Expect(status.Code(err)).To(Equal(codes.NotFound))
		w, err := health.Watch(ctxTimeout(t, 10*time.Second), &healthpb.HealthCheckRequest{})
		g.Expect(err).NotTo(HaveOccurred())
		first, err := w.Recv()
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(first.Status).To(Equal(healthpb.HealthCheckResponse_SERVING))

		empty, _ := serve(t, &rls.Server{Engine: &decide.Engine{Limiter: sidecartest.FakeLimiter{Decide: (&countingLimiter{}).Allow}}, Store: &ruleset.Store{}})
		resp, err := healthpb.NewHealthClient(dial(t, empty)).Check(ctxTimeout(t, 10*time.Second), &healthpb.HealthCheckRequest{})
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(resp.Status).To(Equal(healthpb.HealthCheckResponse_NOT_SERVING), "no policies loaded")
	})
}

// The client's deadline travels as grpc-timeout and bounds the decision.
func TestGRPCDeadline(t *testing.T) {
	g := NewWithT(t)
	lim := newBlockingLimiter()
	lim.outlast = true
	addr, _ := serve(t, &rls.Server{Engine: &decide.Engine{Limiter: sidecartest.FakeLimiter{Decide: lim.Allow}}, Store: sidecartest.Store(t, 10, time.Minute)})
	t.Cleanup(func() { close(lim.release) }) // before the server's graceful stop waits for the call
	client := rlsv3.NewRateLimitServiceClient(dial(t, addr))
	start := time.Now()
	_, err := client.ShouldRateLimit(ctxTimeout(t, 300*time.Millisecond), rlsRequest())
	g.Expect(status.Code(err)).To(Equal(codes.DeadlineExceeded))
	lim.mu.Lock()
	defer lim.mu.Unlock()
	g.Expect(lim.deadlines).To(HaveLen(1))
	g.Expect(lim.deadlines[0]).To(BeTemporally(">", start), "the limiter got the caller's deadline")
	g.Expect(lim.deadlines[0]).To(BeTemporally("<=", start.Add(300*time.Millisecond+50*time.Millisecond)))
}

// Shutdown lets calls in flight finish (grpc.Server's GracefulStop).
func TestGracefulShutdown(t *testing.T) {
	g := NewWithT(t)
	lim := newBlockingLimiter()
	addr, gs := serve(t, &rls.Server{Engine: &decide.Engine{Limiter: sidecartest.FakeLimiter{Decide: lim.Allow}}, Store: sidecartest.Store(t, 10, time.Minute)})
	client := rlsv3.NewRateLimitServiceClient(dial(t, addr))
	type result struct {
		resp *rlsv3.RateLimitResponse
		err  error
	}
	inFlight := make(chan result, 1)
	go func() {
		resp, err := client.ShouldRateLimit(ctxTimeout(t, 30*time.Second), rlsRequest())
		inFlight <- result{resp, err}
	}()
	<-lim.entered
	stopped := make(chan error, 1)
	go func() { stopped <- rls.Shutdown(ctxTimeout(t, 30*time.Second), gs) }()
	g.Consistently(stopped).WithTimeout(200 * time.Millisecond).ShouldNot(Receive())
	close(lim.release)
	var r result
	g.Eventually(inFlight).WithTimeout(10 * time.Second).Should(Receive(&r))
	g.Expect(r.err).NotTo(HaveOccurred())
	g.Expect(r.resp.OverallCode).To(Equal(rlsv3.RateLimitResponse_OK))
	g.Eventually(stopped).WithTimeout(10 * time.Second).Should(Receive(BeNil()))
	_, err := client.ShouldRateLimit(ctxTimeout(t, 5*time.Second), rlsRequest())
	g.Expect(status.Code(err)).To(Equal(codes.Unavailable))
}

// On an exposed face no streaming call is served: Health/Watch, which would stay open until
// the connection's maximum age, is refused, and Health/Check still answers. On loopback Watch
// is served.
func TestExposedFaceServesNoStreams(t *testing.T) {
	g := NewWithT(t)
	srv := &rls.Server{Engine: &decide.Engine{Limiter: sidecartest.FakeLimiter{Decide: (&countingLimiter{}).Allow}}, Store: sidecartest.Store(t, 1000, time.Minute)}
	exposed, _ := serveWith(t, srv, rls.ServerOptions{Exposed: true})
	hc := healthpb.NewHealthClient(dial(t, exposed))
	w, err := hc.Watch(ctxTimeout(t, 10*time.Second), &healthpb.HealthCheckRequest{})
	g.Expect(err).NotTo(HaveOccurred())
	_, err = w.Recv()
	g.Expect(status.Code(err)).To(Equal(codes.PermissionDenied))
	resp, err := hc.Check(ctxTimeout(t, 10*time.Second), &healthpb.HealthCheckRequest{})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(resp.Status).To(Equal(healthpb.HealthCheckResponse_SERVING))
	_, err = rlsv3.NewRateLimitServiceClient(dial(t, exposed)).ShouldRateLimit(ctxTimeout(t, 10*time.Second), rlsRequest())
	g.Expect(err).NotTo(HaveOccurred())

	loopback, _ := serve(t, srv)
	w, err = healthpb.NewHealthClient(dial(t, loopback)).Watch(ctxTimeout(t, 10*time.Second), &healthpb.HealthCheckRequest{})
	g.Expect(err).NotTo(HaveOccurred())
	first, err := w.Recv()
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(first.Status).To(Equal(healthpb.HealthCheckResponse_SERVING))
}
