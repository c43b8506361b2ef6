package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// request is the ShouldRateLimit request for key under rule: one descriptor,
// generic_key=bench/<rule>, k=<key> (see procs.go).
func request(rule, key string) *rlsv3.RateLimitRequest {
	return &rlsv3.RateLimitRequest{
		Domain: domain,
		Descriptors: []*ratelimitv3.RateLimitDescriptor{{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{
			{Key: "generic_key", Value: domain + "/" + rule},
			{Key: entryKey, Value: key},
		}}},
	}
}

// client is the load generator's view of one server: conns gRPC connections, used round robin
// by the callers, and the requests of every key built once (marshalling a shared, unchanging
// message from many goroutines is safe).
type client struct {
	conns []*grpc.ClientConn
	rls   []rlsv3.RateLimitServiceClient
	reqs  []*rlsv3.RateLimitRequest
}

func newClient(addr string, conns, keys int) (*client, error) {
	c := &client{}
	for range conns {
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			c.close()
			return nil, fmt.Errorf("dialing %s: %w", addr, err)
		}
		c.conns = append(c.conns, conn)
		c.rls = append(c.rls, rlsv3.NewRateLimitServiceClient(conn))
	}
	for i := range keys {
		c.reqs = append(c.reqs, request(benchRule, "key-"+strconv.Itoa(i)))
	}
	return c, nil
}

func (c *client) close() {
	for _, conn := range c.conns {
		_ = conn.Close()
	}
}

// call decides one request on connection g%conns and reports whether it was answered OK.
func (c *client) call(ctx context.Context, g int, req *rlsv3.RateLimitRequest) (rlsv3.RateLimitResponse_Code, error) {
	resp, err := c.rls[g%len(c.rls)].ShouldRateLimit(ctx, req)
	if err != nil {
		return rlsv3.RateLimitResponse_UNKNOWN, err
	}
	return resp.GetOverallCode(), nil
}

// probe shows that a server enforces: a fresh key of the 1-per-minute rule is admitted once
// and then refused, and a key of the bench rule is admitted.
func (c *client) probe(ctx context.Context, fresh string) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for i, want := range []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT} {
		got, err := c.call(ctx, 0, request(probeRule, fresh))
		if err != nil {
			return fmt.Errorf("probe call %d: %w", i+1, err)
		}
		if got != want {
			return fmt.Errorf("probe call %d under a limit of 1/min: %s, want %s", i+1, got, want)
		}
	}
	got, err := c.call(ctx, 0, c.reqs[0])
	if err != nil {
		return fmt.Errorf("bench rule: %w", err)
	}
	if got != rlsv3.RateLimitResponse_OK {
		return fmt.Errorf("bench rule: %s, want OK", got)
	}
	return nil
}

// Result is one closed-loop run of one server at one concurrency.
type Result struct {
	Decisions int64
	Errors    int64 // gRPC errors and answers other than OK
	FirstErr  string
	Elapsed   time.Duration
	PerSec    float64
	P50, P99  time.Duration
}

// callTimeout bounds one call; a server slower than this is failing, not slow.
const callTimeout = 5 * time.Second

// closedLoop runs callers goroutines against c for d, each sending its next request when its
// previous one is answered, over the keys in turn. Calls carry no deadline tied to d (gRPC would
// send it to the server, which then fails the last calls early): a caller stops starting calls
// once d has passed, and the calls in flight then are counted, as is the time they take.
func closedLoop(ctx context.Context, c *client, callers int, d time.Duration) Result {
	lat := make([][]time.Duration, callers)
	var next, errs atomic.Int64
	var stop atomic.Bool
	var firstErr atomic.Pointer[string]
	var wg sync.WaitGroup
	timer := time.AfterFunc(d, func() { stop.Store(true) })
	defer timer.Stop()
	start := time.Now()
	for g := range callers {
		lat[g] = make([]time.Duration, 0, 1<<14)
		wg.Go(func() {
			for !stop.Load() && ctx.Err() == nil {
				req := c.reqs[int(next.Add(1)-1)%len(c.reqs)]
				cctx, cancel := context.WithTimeout(ctx, callTimeout)
				t0 := time.Now()
				code, err := c.call(cctx, g, req)
				el := time.Since(t0)
				cancel()
				if err != nil || code != rlsv3.RateLimitResponse_OK {
					errs.Add(1)
					msg := code.String()
					if err != nil {
						msg = err.Error()
					}
					firstErr.CompareAndSwap(nil, &msg)
					continue
				}
				lat[g] = append(lat[g], el)
			}
		})
	}
	wg.Wait()
	r := Result{Elapsed: time.Since(start), Errors: errs.Load()}
	if p := firstErr.Load(); p != nil {
		r.FirstErr = *p
	}
	all := slices.Concat(lat...)
	r.Decisions = int64(len(all))
	if len(all) > 0 {
		slices.Sort(all)
		r.PerSec = float64(len(all)) / r.Elapsed.Seconds()
		r.P50 = all[len(all)/2]
		r.P99 = all[min(len(all)-1, len(all)*99/100)]
	}
	return r
}

// waitOK sends a bench request every 100ms until one is answered OK.
func (c *client) waitOK(ctx context.Context, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		code, err := c.call(cctx, 0, c.reqs[0])
		cancel()
		if err == nil && code == rlsv3.RateLimitResponse_OK {
			return nil
		}
		if err == nil {
			err = errors.New(code.String())
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("not deciding again within %s: %w", limit, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// warmUp sends n requests from 16 callers (connections, pools, scripts); more than 1% failures
// fail it.
func warmUp(ctx context.Context, c *client, n int) error {
	var wg sync.WaitGroup
	var failed atomic.Int64
	var first atomic.Pointer[error]
	var next atomic.Int64
	for g := range 16 {
		wg.Go(func() {
			for i := next.Add(1); i <= int64(n); i = next.Add(1) {
				cctx, cancel := context.WithTimeout(ctx, callTimeout)
				code, err := c.call(cctx, g, c.reqs[int(i)%len(c.reqs)])
				cancel()
				if err == nil && code != rlsv3.RateLimitResponse_OK {
					err = errors.New(code.String())
				}
				if err != nil {
					failed.Add(1)
					first.CompareAndSwap(nil, &err)
				}
			}
		})
	}
	wg.Wait()
	if f := failed.Load(); f*100 > int64(n) {
		return fmt.Errorf("warm-up: %d of %d requests failed, first: %w", f, n, *first.Load())
	}
	return nil
}
