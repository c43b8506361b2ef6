package sidecar_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
)

// BenchmarkGRPCAddedLatency sends unary health checks to a grpc-go server, alternately
// through the sidecar (h2c in and out, a rule deciding every call on Redis) and straight to
// it, one at a time, and reports p50 and p99 of each and the sidecar's added latency. Run:
//
//	go test -run '^$' -bench GRPCAddedLatency -benchtime 5000x ./test/sidecar/
func BenchmarkGRPCAddedLatency(b *testing.B) {
	e := newEnv(b, "orders")
	e.write(b, grpcRules(e, 1_000_000, 1))
	app := newGRPCApp(b, nil)
	s := start(b, "grpc-bench", e, shared.URL(), app.addr, true, "--upstream-protocol=H2C")
	via := healthClient(b, s)
	conn, err := grpc.NewClient(app.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	direct := healthpb.NewHealthClient(conn)
	ctx := metadata.AppendToOutgoingContext(context.Background(), "x-tenant", fmt.Sprint("bench-", time.Now().UnixNano()))
	req := &healthpb.HealthCheckRequest{Service: "orders"}
	call := func(c healthpb.HealthClient) time.Duration {
		t0 := time.Now()
		if _, err := c.Check(ctx, req); err != nil {
			b.Fatal(err)
		}
		return time.Since(t0)
	}
	call(via)
	call(direct)
	var viaD, directD []time.Duration
	b.ResetTimer()
	for range b.N {
		viaD = append(viaD, call(via))
		directD = append(directD, call(direct))
	}
	b.StopTimer()
	q := func(d []time.Duration, p float64) float64 {
		slices.Sort(d)
		return float64(d[int(p*float64(len(d)-1))].Microseconds())
	}
	b.ReportMetric(q(viaD, 0.5), "proxy-p50-µs")
	b.ReportMetric(q(viaD, 0.99), "proxy-p99-µs")
	b.ReportMetric(q(directD, 0.5), "direct-p50-µs")
	b.ReportMetric(q(directD, 0.99), "direct-p99-µs")
	b.ReportMetric(q(viaD, 0.5)-q(directD, 0.5), "added-p50-µs")
	b.ReportMetric(q(viaD, 0.99)-q(directD, 0.99), "added-p99-µs")
}
