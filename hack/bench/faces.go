package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/redline-dev/redline/internal/sidecar/rls"
)

// The faces measured, in table order. "direct" is the upstream without Redline.
const (
	faceDirect = "direct to upstream"
	faceProxy  = "proxy face"
	faceCheck  = "/v1/check"
	faceRLS    = "Envoy RLS (gRPC)"
)

var faces = []string{faceDirect, faceProxy, faceCheck, faceRLS}

// FaceCell is one face at one concurrency, with what the sidecar's limiter did meanwhile.
type FaceCell struct {
	Face string `json:"face"`
	Cell
	// RoundTripsPerDecision is the sidecar's Redis round trips over its Redis decisions.
	RoundTripsPerDecision float64 `json:"roundTripsPerDecision"`
	// Degraded counts decisions made by the failure mode (Redis too slow or unreachable).
	Degraded float64 `json:"degraded"`
}

// keyOf spreads operations over 10000 keys of a limit never reached: every decision is a
// script run in Redis.
func keyOf(i int64) string {
	if i < 0 {
		i = -i
	}
	return "k" + strconv.FormatInt(i%10000, 10)
}

// faceOps returns the operation of each face against sidecar s and the upstream, and a
// function that closes the clients.
func faceOps(s *Sidecar, upstream string) (map[string]op, func(), error) {
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{MaxIdleConns: 1024, MaxIdleConnsPerHost: 512}}
	conn, err := grpc.NewClient(s.GRPC, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, nil, fmt.Errorf("dialing the RLS face: %w", err)
	}
	rc := rlsv3.NewRateLimitServiceClient(conn)
	get := func(base string) op {
		return func(ctx context.Context, i int64) error {
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/", nil)
			if err != nil {
				return fmt.Errorf("building request: %w", err)
			}
			req.Header.Set(keyHeader, keyOf(i))
			resp, err := hc.Do(req)
			if err != nil {
				return fmt.Errorf("GET %s: %w", base, err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				return fmt.Errorf("GET %s: status %d", base, resp.StatusCode)
			}
			return nil
		}
	}
	ops := map[string]op{
		faceDirect: get("http://" + upstream),
		faceProxy:  get("http://" + s.Proxy),
		faceCheck: func(ctx context.Context, i int64) error {
			body := `{"policy":"` + benchPolicy + `","rule":"` + benchRule + `","key":["` + keyOf(i) + `"]}`
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+s.Check+"/v1/check", strings.NewReader(body))
			if err != nil {
				return fmt.Errorf("building request: %w", err)
			}
			req.Header.Set("Content-Type", "application/json")
			resp, err := hc.Do(req)
			if err != nil {
				return fmt.Errorf("POST /v1/check: %w", err)
			}
			b, err := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			if err != nil {
				return fmt.Errorf("reading /v1/check: %w", err)
			}
			if resp.StatusCode != http.StatusOK || !strings.HasPrefix(string(b), `{"allowed":true`) {
				return fmt.Errorf("/v1/check: status %d: %.200s", resp.StatusCode, b)
			}
			return nil
		},
		faceRLS: func(ctx context.Context, i int64) error {
			resp, err := rc.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{
				Domain: "bench",
				Descriptors: []*ratelimitv3.RateLimitDescriptor{{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{
					{Key: rls.EntryPolicy, Value: benchPolicy},
					{Key: rls.EntryRule, Value: benchRule},
					{Key: keyHeader, Value: keyOf(i)},
				}}},
			})
			if err != nil {
				return fmt.Errorf("ShouldRateLimit: %w", err)
			}
			if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
				return fmt.Errorf("ShouldRateLimit: %s", resp.GetOverallCode())
			}
			return nil
		},
	}
	return ops, func() { _ = conn.Close(); hc.CloseIdleConnections() }, nil
}

// runFaces measures every face at every concurrency against sidecar s.
func runFaces(ctx context.Context, s *Sidecar, upstream string, concs []int, b Bounds) ([]FaceCell, error) {
	ops, closeFn, err := faceOps(s, upstream)
	if err != nil {
		return nil, err
	}
	defer closeFn()
	var out []FaceCell
	for _, face := range faces {
		for _, n := range concs {
			before, err := s.counters(ctx)
			if err != nil {
				return nil, err
			}
			c, err := closedLoop(ctx, n, b, ops[face])
			if err != nil {
				return nil, fmt.Errorf("%s at concurrency %d: %w", face, n, err)
			}
			after, err := s.counters(ctx)
			if err != nil {
				return nil, err
			}
			fc := FaceCell{Face: face, Cell: c, Degraded: after.Degraded - before.Degraded}
			if d := after.RedisDecisions - before.RedisDecisions; d > 0 {
				fc.RoundTripsPerDecision = (after.RoundTrips - before.RoundTrips) / d
			}
			progress("  %-20s c=%-3d %8.0f/s  p50 %-9s p99 %-9s rt/decision %.3f", face, n, c.PerSec,
				c.P50.Round(time.Microsecond), c.P99.Round(time.Microsecond), fc.RoundTripsPerDecision)
			out = append(out, fc)
		}
	}
	return out, nil
}
