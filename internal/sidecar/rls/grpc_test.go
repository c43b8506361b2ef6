package rls_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/http"
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
	"google.golang.org/grpc/encoding/gzip"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/redline-dev/redline/internal/limiter"
	"github.com/redline-dev/redline/internal/sidecar/config"
	"github.com/redline-dev/redline/internal/sidecar/decide"
	"github.com/redline-dev/redline/internal/sidecar/rls"
	"github.com/redline-dev/redline/internal/sidecar/sidecartest"
)

// blockingLimiter holds every call until release is closed or the call's context ends, and
// records the deadlines it was given.
type blockingLimiter struct {
	entered   chan struct{}
	release   chan struct{}
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
		return limiter.Result{}, ctx.Err()
	}
}

func rlsRequest() *rlsv3.RateLimitRequest {
	return &rlsv3.RateLimitRequest{Descriptors: []*rlv3.RateLimitDescriptor{desc("generic_key", "p/r", "k", "a")}}
}

// What a grpc-go client sees of the protocol around ShouldRateLimit.
func TestGRPCClient(t *testing.T) {
	store := sidecartest.Store(t, 1000, time.Minute)
	addr, _ := serve(t, &rls.Server{Engine: &decide.Engine{Limiter: &countingLimiter{}}, Store: store})
	conn := dial(t, addr)
	client := rlsv3.NewRateLimitServiceClient(conn)

	t.Run("unknown method and service", func(t *testing.T) {
		g := NewWithT(t)
		for _, m := range []string{"/envoy.service.ratelimit.v3.RateLimitService/Nope", "/some.Service/ShouldRateLimit"} {
			err := conn.Invoke(ctxTimeout(t, 10*time.Second), m, rlsRequest(), &rlsv3.RateLimitResponse{})
			g.Expect(status.Code(err)).To(Equal(codes.Unimplemented), m)
			g.Expect(status.Convert(err).Message()).To(Equal("unknown method " + m))
		}
		// The connection stays usable.
		_, err := client.ShouldRateLimit(ctxTimeout(t, 10*time.Second), rlsRequest())
		g.Expect(err).NotTo(HaveOccurred())
	})

	t.Run("message over 1 MiB", func(t *testing.T) {
		g := NewWithT(t)
		req := rlsRequest()
		req.Domain = strings.Repeat("d", rls.MaxMessageSize)
		_, err := client.ShouldRateLimit(ctxTimeout(t, 10*time.Second), req)
		g.Expect(status.Code(err)).To(Equal(codes.ResourceExhausted))
		req.Domain = strings.Repeat("d", rls.MaxMessageSize-proto.Size(rlsRequest())-4)
		g.Expect(proto.Size(req)).To(BeNumerically("<=", rls.MaxMessageSize))
		_, err = client.ShouldRateLimit(ctxTimeout(t, 10*time.Second), req)
		g.Expect(err).NotTo(HaveOccurred(), "1 MiB is allowed")
	})

	t.Run("compressed by the client", func(t *testing.T) {
		g := NewWithT(t)
		_, err := client.ShouldRateLimit(ctxTimeout(t, 10*time.Second), rlsRequest(), grpc.UseCompressor(gzip.Name))
		g.Expect(status.Code(err)).To(Equal(codes.Unimplemented))
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
		for range 1500 { // more than the server's 1000 concurrent streams: grpc-go queues
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
		_, err = w.Recv()
		g.Expect(status.Code(err)).To(Equal(codes.Unimplemented))

		empty, _ := serve(t, &rls.Server{Engine: &decide.Engine{Limiter: &countingLimiter{}}, Store: &config.Store{}})
		resp, err := healthpb.NewHealthClient(dial(t, empty)).Check(ctxTimeout(t, 10*time.Second), &healthpb.HealthCheckRequest{})
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(resp.Status).To(Equal(healthpb.HealthCheckResponse_NOT_SERVING), "no policies loaded")
	})
}

// The client's deadline travels as grpc-timeout and bounds the decision.
func TestGRPCDeadline(t *testing.T) {
	g := NewWithT(t)
	lim := newBlockingLimiter()
	addr, _ := serve(t, &rls.Server{Engine: &decide.Engine{Limiter: lim}, Store: sidecartest.Store(t, 10, time.Minute)})
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

// Shutdown lets calls in flight finish, as grpc.Server's GracefulStop did.
func TestGracefulShutdown(t *testing.T) {
	g := NewWithT(t)
	lim := newBlockingLimiter()
	addr, hs := serve(t, &rls.Server{Engine: &decide.Engine{Limiter: lim}, Store: sidecartest.Store(t, 10, time.Minute)})
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
	go func() { stopped <- hs.Shutdown(ctxTimeout(t, 30*time.Second)) }()
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

// h2c returns an HTTP client that speaks cleartext HTTP/2 with prior knowledge, as gRPC does.
func h2c(t testing.TB) *http.Client {
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	tr := &http.Transport{Protocols: &p}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 10 * time.Second}
}

func frame(flags byte, msg []byte) []byte {
	b := []byte{flags, 0, 0, 0, 0}
	binary.BigEndian.PutUint32(b[1:], uint32(len(msg)))
	return append(b, msg...)
}

// rawResponse is an HTTP/2 answer to a hand-made gRPC request.
type rawResponse struct {
	*http.Response
	body []byte
}

// status is grpc-status: from the trailers, or from the headers of a Trailers-Only answer.
func (r rawResponse) status() string {
	if s := r.Header.Get("Grpc-Status"); s != "" {
		return s
	}
	return r.Trailer.Get("Grpc-Status")
}

func rawCall(t testing.TB, c *http.Client, method, url string, body io.Reader, hdr ...string) rawResponse {
	t.Helper()
	req, err := http.NewRequest(method, url, body)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/grpc")
	req.Header.Set("Te", "trailers")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	return rawResponse{resp, b}
}

// The protocol as the gRPC over HTTP/2 specification has it, request by hand-made request.
func TestGRPCWire(t *testing.T) {
	lim := &countingLimiter{}
	addr, _ := serve(t, &rls.Server{Engine: &decide.Engine{Limiter: lim}, Store: sidecartest.Store(t, 10, time.Minute)})
	c := h2c(t)
	url := "http://" + addr + rls.ShouldRateLimitMethod
	msg, err := proto.Marshal(rlsRequest())
	if err != nil {
		t.Fatal(err)
	}

	t.Run("answer", func(t *testing.T) {
		g := NewWithT(t)
		r := rawCall(t, c, http.MethodPost, url, bytes.NewReader(frame(0, msg)))
		g.Expect(r.ProtoMajor).To(Equal(2))
		g.Expect(r.StatusCode).To(Equal(http.StatusOK))
		g.Expect(r.Header.Get("Content-Type")).To(Equal("application/grpc"))
		g.Expect(r.Header).NotTo(HaveKey("Grpc-Status"), "the status comes after the message")
		g.Expect(r.Header).NotTo(HaveKey("Date"))
		g.Expect(r.ContentLength).To(Equal(int64(-1)))
		g.Expect(r.Trailer.Get("Grpc-Status")).To(Equal("0"))
		g.Expect(r.Trailer).NotTo(HaveKey("Grpc-Message"))
		g.Expect(len(r.body)).To(BeNumerically(">", 5))
		g.Expect(r.body[0]).To(BeZero())
		g.Expect(binary.BigEndian.Uint32(r.body[1:5])).To(Equal(uint32(len(r.body) - 5)))
		var resp rlsv3.RateLimitResponse
		g.Expect(proto.Unmarshal(r.body[5:], &resp)).To(Succeed())
		g.Expect(resp.OverallCode).To(Equal(rlsv3.RateLimitResponse_OK))
		g.Expect(resp.Statuses[0].CurrentLimit.Name).To(Equal("p/r"))
	})

	t.Run("content-type", func(t *testing.T) {
		g := NewWithT(t)
		for ct, want := range map[string]string{"application/grpc+proto": "application/grpc+proto", "application/grpc;charset=x": "application/grpc"} {
			r := rawCall(t, c, http.MethodPost, url, bytes.NewReader(frame(0, msg)), "Content-Type", ct)
			g.Expect(r.status()).To(Equal("0"), ct)
			g.Expect(r.Header.Get("Content-Type")).To(Equal(want), ct)
		}
		for _, ct := range []string{"application/json", "application/grpc+json", "application/grpcx", ""} {
			r := rawCall(t, c, http.MethodPost, url, bytes.NewReader(frame(0, msg)), "Content-Type", ct)
			g.Expect(r.StatusCode).To(Equal(http.StatusUnsupportedMediaType), ct)
			g.Expect(r.status()).To(Equal(fmt.Sprint(int(codes.InvalidArgument))), ct)
		}
		r := rawCall(t, c, http.MethodGet, url, nil)
		g.Expect(r.StatusCode).To(Equal(http.StatusMethodNotAllowed))
		g.Expect(r.status()).To(Equal(fmt.Sprint(int(codes.Internal))))
	})

	// A failure is Trailers-Only: HTTP 200, the status in the headers, no body.
	failures := []struct {
		name string
		body []byte
		hdr  []string
		code codes.Code
	}{
		{"compressed flag", frame(1, msg), nil, codes.Unimplemented},
		{"grpc-encoding", frame(0, msg), []string{"Grpc-Encoding", "snappy"}, codes.Unimplemented},
		{"unknown flags", frame(2, msg), nil, codes.Internal},
		{"no message", nil, nil, codes.Internal},
		{"two messages", append(frame(0, msg), frame(0, msg)...), nil, codes.Internal},
		{"cut message", frame(0, msg)[:len(msg)], nil, codes.Internal},
		{"cut prefix", frame(0, msg)[:3], nil, codes.Internal},
		{"over 1 MiB, announced", frame(0, nil)[:1], nil, codes.ResourceExhausted}, // length patched below
		{"not protobuf", frame(0, []byte{0xff, 0xff}), nil, codes.Internal},
		{"too many descriptors", frame(0, bytes.Repeat([]byte{0x12, 0}, rls.MaxDescriptors+1)), nil, codes.ResourceExhausted},
		{"no descriptors", frame(0, nil), nil, codes.InvalidArgument},
		{"expired deadline", frame(0, msg), []string{"Grpc-Timeout", "1n"}, codes.DeadlineExceeded},
		{"malformed deadline", frame(0, msg), []string{"Grpc-Timeout", "1x"}, codes.Internal},
		{"deadline of 9 digits", frame(0, msg), []string{"Grpc-Timeout", "123456789S"}, codes.Internal},
	}
	failures[7].body = []byte{0, 0, 0x10, 0, 1} // 1 MiB + 1, never sent
	for _, f := range failures {
		t.Run(f.name, func(t *testing.T) {
			g := NewWithT(t)
			before := len(lim.seen())
			r := rawCall(t, c, http.MethodPost, url, bytes.NewReader(f.body), f.hdr...)
			g.Expect(r.status()).To(Equal(fmt.Sprint(int(f.code))))
			g.Expect(r.Header.Get("Grpc-Status")).NotTo(BeEmpty(), "Trailers-Only")
			g.Expect(r.body).To(BeEmpty())
			g.Expect(r.Header.Get("Content-Type")).To(Equal("application/grpc"))
			g.Expect(r.Header.Get("Grpc-Message")).NotTo(BeEmpty())
			if f.name == "malformed deadline" || f.name == "deadline of 9 digits" {
				g.Expect(r.StatusCode).To(Equal(http.StatusBadRequest))
			} else {
				g.Expect(r.StatusCode).To(Equal(http.StatusOK))
			}
			g.Expect(lim.seen()).To(HaveLen(before), "nothing counted")
		})
	}

	t.Run("long deadlines are fine", func(t *testing.T) {
		g := NewWithT(t)
		for _, v := range []string{"99999999H", "10S", "5000000u"} {
			r := rawCall(t, c, http.MethodPost, url, bytes.NewReader(frame(0, msg)), "Grpc-Timeout", v)
			g.Expect(r.status()).To(Equal("0"), v)
		}
	})

	t.Run("message never sent", func(t *testing.T) {
		g := NewWithT(t)
		pr, pw := io.Pipe()
		defer func() { _ = pw.Close() }()
		start := time.Now()
		r := rawCall(t, c, http.MethodPost, url, pr, "Grpc-Timeout", "200m")
		g.Expect(r.status()).To(Equal(fmt.Sprint(int(codes.DeadlineExceeded))))
		g.Expect(time.Since(start)).To(BeNumerically("<", 5*time.Second))
	})

	t.Run("grpc-message is percent-encoded", func(t *testing.T) {
		g := NewWithT(t)
		r := rawCall(t, c, http.MethodPost, "http://"+addr+"/x%25%C3%A9/y", bytes.NewReader(frame(0, msg)))
		g.Expect(r.status()).To(Equal(fmt.Sprint(int(codes.Unimplemented))))
		g.Expect(r.Header.Get("Grpc-Message")).To(Equal("unknown method /x%25%C3%A9/y"))
	})

	t.Run("HTTP/1 is not served", func(t *testing.T) {
		g := NewWithT(t)
		resp, err := (&http.Client{Timeout: 5 * time.Second}).Post(url, "application/grpc", bytes.NewReader(frame(0, msg)))
		if err == nil {
			resp.Body.Close()
			g.Expect(resp.StatusCode).NotTo(Equal(http.StatusOK))
		}
		g.Expect(errors.Is(err, context.DeadlineExceeded)).To(BeFalse(), "refused at once")
	})
}
