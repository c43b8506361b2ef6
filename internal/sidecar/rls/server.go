package rls

import (
	"context"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"
)

// ServiceName is the rate limit service's gRPC name, as the health service reports it.
const ServiceName = "envoy.service.ratelimit.v3.RateLimitService"

// MaxMessageSize bounds a RateLimitRequest. Envoy's carry a domain and a few descriptors of a
// few short entries; 64 KiB holds MaxDescriptors descriptors of MaxEntries entries of 100
// bytes each, several times over.
const MaxMessageSize = 64 << 10

// ServerOptions bound what one client of the service can hold.
type ServerOptions struct {
	// MaxConcurrentStreams is how many calls one connection may have open at once (default 64).
	// grpc-go clients queue beyond it; Envoy opens another connection.
	MaxConcurrentStreams uint32
	// IdleTimeout closes a connection without calls for this long (default 2m), with a GOAWAY.
	IdleTimeout time.Duration
	// MaxConnectionAge closes a connection this old, gracefully, so a client holding streams
	// open cannot keep its resources forever (default 30m); calls in flight get
	// MaxConnectionAgeGrace (default 30s) to finish.
	MaxConnectionAge      time.Duration
	MaxConnectionAgeGrace time.Duration
	// HandshakeTimeout bounds a new connection's wait for the client's HTTP/2 preface (default 10s).
	HandshakeTimeout time.Duration
	// Exposed says the service listens on the pod network, where any pod is a client: then no
	// streaming call is served (grpc.health.v1.Health/Watch is the only one), so a peer cannot
	// hold calls open for MaxConnectionAge. Health/Check, a unary call, stays: it is what
	// kubelet's gRPC probe and Envoy's health checker use.
	Exposed bool
}

func (o ServerOptions) withDefaults() ServerOptions {
	if o.MaxConcurrentStreams == 0 {
		o.MaxConcurrentStreams = 64
	}
	if o.IdleTimeout <= 0 {
		o.IdleTimeout = 2 * time.Minute
	}
	if o.MaxConnectionAge <= 0 {
		o.MaxConnectionAge = 30 * time.Minute
	}
	if o.MaxConnectionAgeGrace <= 0 {
		o.MaxConnectionAgeGrace = 30 * time.Second
	}
	if o.HandshakeTimeout <= 0 {
		o.HandshakeTimeout = 10 * time.Second
	}
	return o
}

// streamWorkers is the number of goroutines kept to run calls: MaxConcurrentStreams's default.
const streamWorkers = 64

// maxHeaderListSize bounds a call's header block: Envoy sends the pseudo-headers, content-type,
// te, grpc-timeout and perhaps tracing headers, well under 16 KiB.
const maxHeaderListSize = 16 << 10

// NewServer returns a grpc.Server serving svc and grpc.health.v1.Health, and the health server,
// which reports NOT_SERVING until SetServing is called.
func NewServer(svc *Server, opts ServerOptions) (*grpc.Server, *health.Server) {
	opts = opts.withDefaults()
	gs := grpc.NewServer(
		grpc.MaxRecvMsgSize(MaxMessageSize),
		grpc.MaxConcurrentStreams(opts.MaxConcurrentStreams),
		grpc.MaxHeaderListSize(maxHeaderListSize),
		grpc.ConnectionTimeout(opts.HandshakeTimeout),
		// A fixed 64 KiB window (grpc-go's least) turns off its bandwidth-delay estimator, which
		// would otherwise grow a connection's buffer to several MiB for whoever sends fast.
		grpc.InitialWindowSize(64<<10),
		grpc.InitialConnWindowSize(64<<10),
		// Goroutines kept to serve the calls, as many as one connection may run at once: a
		// goroutine per call (grpc-go's default) grows a fresh stack through the decision's call
		// depth every time, a tenth of the sidecar's CPU under the compare-envoy load (16
		// workers still left most calls of a 64-stream burst to new goroutines; 64 cut stack
		// copying from 11% to 3% of the CPU). When all are busy, grpc-go starts a goroutine.
		grpc.NumStreamWorkers(streamWorkers),
		grpc.KeepaliveParams(keepalive.ServerParameters{
			MaxConnectionIdle:     opts.IdleTimeout,
			MaxConnectionAge:      opts.MaxConnectionAge,
			MaxConnectionAgeGrace: opts.MaxConnectionAgeGrace,
		}),
		// Clients may ping every 10s, with or without calls; faster pings get a GOAWAY
		// (ENHANCE_YOUR_CALM), as grpc-go's own default policy does at 5 minutes.
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
		grpc.StreamInterceptor(streamGuard(opts.Exposed)),
	)
	rlsv3.RegisterRateLimitServiceServer(gs, svc)
	hs := health.NewServer()
	hs.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	hs.SetServingStatus(ServiceName, healthpb.HealthCheckResponse_NOT_SERVING)
	healthpb.RegisterHealthServer(gs, hs)
	return gs, hs
}

// streamGuard refuses every streaming call on an exposed face; on loopback it lets them through.
func streamGuard(exposed bool) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		if exposed {
			return status.Errorf(codes.PermissionDenied,
				"%s is not served on the pod network: streams would outlive their use; call grpc.health.v1.Health/Check", info.FullMethod)
		}
		return handler(srv, ss)
	}
}

// SetServing reports the service as serving: call it once policies are in force.
func SetServing(hs *health.Server) {
	hs.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	hs.SetServingStatus(ServiceName, healthpb.HealthCheckResponse_SERVING)
}

// Shutdown stops gs gracefully: no new calls, calls in flight finish. When ctx ends first the
// remaining calls are cut.
func Shutdown(ctx context.Context, gs *grpc.Server) error {
	done := make(chan struct{})
	go func() {
		gs.GracefulStop()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		gs.Stop()
		<-done
		return ctx.Err()
	}
}
