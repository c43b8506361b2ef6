package rls_test

import (
	"context"
	"errors"
	"math"
	"net"
	"sync"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	. "github.com/onsi/gomega"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/redline-dev/redline/internal/limiter"
	"github.com/redline-dev/redline/internal/sidecar/decide"
	"github.com/redline-dev/redline/internal/sidecar/rls"
	"github.com/redline-dev/redline/internal/sidecar/ruleset"
	"github.com/redline-dev/redline/internal/testutil/sidecartest"
)

func desc(kv ...string) *rlv3.RateLimitDescriptor {
	d := &rlv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &rlv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

func TestHitFor(t *testing.T) {
	d := desc
	cases := []struct {
		name string
		d    *rlv3.RateLimitDescriptor
		want decide.Hit
		ok   bool
	}{
		{"policy and rule entries", d("policy", "p", "api_key", "k", "rule", "r", "path", "/x"), decide.Hit{Policy: "p", Rule: "r", Key: []string{"k", "/x"}}, true},
		{"generic key", d("generic_key", "p/r", "remote_address", "1.2.3.4"), decide.Hit{Policy: "p", Rule: "r", Key: []string{"1.2.3.4"}}, true},
		{"generic key without slash is a key part", d("generic_key", "x", "policy", "p", "rule", "r"), decide.Hit{Policy: "p", Rule: "r", Key: []string{"x"}}, true},
		{"no rule", d("remote_address", "1.2.3.4"), decide.Hit{}, false},
		{"policy only", d("policy", "p"), decide.Hit{}, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			g := NewWithT(t)
			h, ok := rls.HitFor(c.d)
			g.Expect(ok).To(Equal(c.ok))
			if ok {
				g.Expect(h).To(Equal(c.want))
			}
		})
	}
}

type countingLimiter struct {
	mu    sync.Mutex
	costs []int64
}

func (c *countingLimiter) Allow(_ context.Context, _ string, l limiter.Limit, cost int64) (limiter.Result, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.costs = append(c.costs, cost)
	r := limiter.Result{Allowed: cost <= l.Requests, Remaining: max(l.Requests-cost, 0), ResetAfter: l.Window, Source: limiter.SourceRedis}
	if !r.Allowed {
		r.OverLimit, r.RetryAfter = true, 1500*time.Millisecond
	}
	return r, nil
}

func (c *countingLimiter) seen() []int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]int64(nil), c.costs...)
}

// serve runs srv on a loopback port the way the sidecar does and returns its address.
func serve(t testing.TB, srv *rls.Server) (string, *grpc.Server) {
	t.Helper()
	return serveWith(t, srv, rls.ServerOptions{})
}

// serveWith is serve with server options.
func serveWith(t testing.TB, srv *rls.Server, opts rls.ServerOptions) (string, *grpc.Server) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs, hs := rls.NewServer(srv, opts)
	if srv.Store.Current() != nil {
		rls.SetServing(hs)
	}
	done := make(chan error, 1)
	go func() { done <- gs.Serve(ln) }()
	t.Cleanup(func() {
		gs.Stop()
		if err := <-done; err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			t.Errorf("serving: %v", err)
		}
	})
	return ln.Addr().String(), gs
}

// dial returns a grpc-go connection to addr, closed with the test.
func dial(t testing.TB, addr string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

func ctxTimeout(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// ShouldRateLimit as Envoy calls it: go-control-plane messages through grpc-go.
func TestShouldRateLimit(t *testing.T) {
	g := NewWithT(t)
	set := sidecartest.Store(t, 10, 2*time.Hour).Current()
	store := &ruleset.Store{}
	lim := &countingLimiter{}
	addr, _ := serve(t, &rls.Server{Engine: &decide.Engine{Limiter: sidecartest.FakeLimiter{Decide: lim.Allow}}, Store: store})
	client := rlsv3.NewRateLimitServiceClient(dial(t, addr))

	_, err := client.ShouldRateLimit(ctxTimeout(t, 10*time.Second), &rlsv3.RateLimitRequest{Descriptors: []*rlv3.RateLimitDescriptor{desc("generic_key", "p/r")}})
	g.Expect(status.Code(err)).To(Equal(codes.Unavailable))
	g.Expect(status.Convert(err).Message()).To(Equal("no policies loaded"))
	store.Swap(set)
	_, err = client.ShouldRateLimit(ctxTimeout(t, 10*time.Second), &rlsv3.RateLimitRequest{Domain: "d"})
	g.Expect(status.Code(err)).To(Equal(codes.InvalidArgument))
	g.Expect(status.Convert(err).Message()).To(Equal("no descriptors"))
	g.Expect(lim.seen()).To(BeEmpty())

	over := desc("generic_key", "p/r", "k", "a")
	over.HitsAddend = wrapperspb.UInt64(11)
	negative := desc("policy", "p", "rule", "r", "k", "a")
	negative.IsNegativeHits = true
	zero := desc("generic_key", "p/r", "k", "b")
	zero.HitsAddend = wrapperspb.UInt64(0) // present but 0: the cost is 1, not the request's 3
	resp, err := client.ShouldRateLimit(ctxTimeout(t, 10*time.Second), &rlsv3.RateLimitRequest{
		Domain:      "redline",
		HitsAddend:  3,
		Descriptors: []*rlv3.RateLimitDescriptor{desc("generic_key", "p/r", "k", "a"), over, desc("other", "x"), negative, zero, desc("policy", "p", "rule", "nope")},
	})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(lim.seen()).To(ConsistOf(int64(3), int64(11), int64(1)), "request hits_addend, overridden per descriptor; negative hits not counted")
	g.Expect(resp.OverallCode).To(Equal(rlsv3.RateLimitResponse_OVER_LIMIT))
	g.Expect(resp.Statuses).To(HaveLen(6))
	g.Expect(resp.Statuses[0].Code).To(Equal(rlsv3.RateLimitResponse_OK))
	g.Expect(resp.Statuses[0].LimitRemaining).To(Equal(uint32(7)))
	g.Expect(resp.Statuses[0].CurrentLimit.Name).To(Equal("p/r"))
	g.Expect(resp.Statuses[0].CurrentLimit.RequestsPerUnit).To(Equal(uint32(10)))
	g.Expect(resp.Statuses[0].CurrentLimit.Unit).To(Equal(rlsv3.RateLimitResponse_RateLimit_HOUR))
	g.Expect(resp.Statuses[0].CurrentLimit.UnitMultiplier.GetValue()).To(Equal(uint32(2)))
	g.Expect(resp.Statuses[0].DurationUntilReset.AsDuration()).To(Equal(2 * time.Hour))
	g.Expect(resp.Statuses[1].Code).To(Equal(rlsv3.RateLimitResponse_OVER_LIMIT))
	g.Expect(resp.Statuses[1].LimitRemaining).To(BeZero())
	for _, i := range []int{2, 3, 5} {
		g.Expect(resp.Statuses[i].Code).To(Equal(rlsv3.RateLimitResponse_OK))
		g.Expect(resp.Statuses[i].CurrentLimit).To(BeNil())
		g.Expect(resp.Statuses[i].DurationUntilReset).To(BeNil())
	}
	g.Expect(resp.Statuses[4].LimitRemaining).To(Equal(uint32(9)))
	hdr := map[string]string{}
	for _, h := range resp.ResponseHeadersToAdd {
		hdr[h.Key] = h.Value
	}
	g.Expect(hdr).To(Equal(map[string]string{
		"RateLimit-Policy": `"p/r";q=10;w=7200, "p/r";q=10;w=7200, "p/r";q=10;w=7200`,
		"RateLimit":        `"p/r";r=7;t=7200, "p/r";r=0;t=7200, "p/r";r=9;t=7200`,
		"Retry-After":      "2",
	}))

	// Within the limit: OK, the RateLimit fields and no Retry-After.
	resp, err = client.ShouldRateLimit(ctxTimeout(t, 10*time.Second), &rlsv3.RateLimitRequest{Descriptors: []*rlv3.RateLimitDescriptor{desc("policy", "p", "rule", "r")}})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(resp.OverallCode).To(Equal(rlsv3.RateLimitResponse_OK))
	g.Expect(resp.ResponseHeadersToAdd).To(HaveLen(2))
	g.Expect(resp.ResponseHeadersToAdd[0].Key).To(Equal("RateLimit-Policy"))
	g.Expect(resp.ResponseHeadersToAdd[1].Key).To(Equal("RateLimit"))
}

// One minute, one day and a window in seconds that no larger unit divides.
func TestCurrentLimitUnits(t *testing.T) {
	cases := []struct {
		window time.Duration
		unit   rlsv3.RateLimitResponse_RateLimit_Unit
		mult   *wrapperspb.UInt32Value
	}{
		{time.Minute, rlsv3.RateLimitResponse_RateLimit_MINUTE, nil},
		{24 * time.Hour, rlsv3.RateLimitResponse_RateLimit_DAY, nil},
		{90 * time.Second, rlsv3.RateLimitResponse_RateLimit_SECOND, wrapperspb.UInt32(90)},
		{time.Second, rlsv3.RateLimitResponse_RateLimit_SECOND, nil},
	}
	for _, c := range cases {
		t.Run(c.window.String(), func(t *testing.T) {
			g := NewWithT(t)
			addr, _ := serve(t, &rls.Server{Engine: &decide.Engine{Limiter: sidecartest.FakeLimiter{Decide: (&countingLimiter{}).Allow}}, Store: sidecartest.Store(t, 5, c.window)})
			resp, err := rlsv3.NewRateLimitServiceClient(dial(t, addr)).ShouldRateLimit(ctxTimeout(t, 10*time.Second),
				&rlsv3.RateLimitRequest{Descriptors: []*rlv3.RateLimitDescriptor{desc("generic_key", "p/r")}})
			g.Expect(err).NotTo(HaveOccurred())
			l := resp.Statuses[0].CurrentLimit
			g.Expect(l.Unit).To(Equal(c.unit))
			g.Expect(l.UnitMultiplier.GetValue()).To(Equal(c.mult.GetValue()))
			g.Expect(l.UnitMultiplier == nil).To(Equal(c.mult == nil))
		})
	}
}

// hits_addend is unsigned on the wire: no value wraps into an admissible cost.
func TestCost(t *testing.T) {
	cases := []struct {
		name       string
		request    uint32
		descriptor *wrapperspb.UInt64Value
		want       int64
	}{
		{"neither set", 0, nil, 1},
		{"request level", 7, nil, 7},
		{"request level max", math.MaxUint32, nil, math.MaxUint32},
		{"descriptor overrides", 7, wrapperspb.UInt64(3), 3},
		{"descriptor zero means one", 7, wrapperspb.UInt64(0), 1},
		{"2^63-1", 0, wrapperspb.UInt64(math.MaxInt64), math.MaxInt64},
		{"2^63 saturates", 0, wrapperspb.UInt64(1 << 63), math.MaxInt64},
		{"2^64-1 saturates", 0, wrapperspb.UInt64(math.MaxUint64), math.MaxInt64},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			NewWithT(t).Expect(rls.Cost(c.request, c.descriptor)).To(Equal(c.want))
		})
	}
}

// Requests beyond the bounds are refused before any limiter call.
func TestRequestBounds(t *testing.T) {
	g := NewWithT(t)
	lim := &countingLimiter{}
	addr, _ := serve(t, &rls.Server{Engine: &decide.Engine{Limiter: sidecartest.FakeLimiter{Decide: lim.Allow}}, Store: sidecartest.Store(t, 10, time.Minute)})
	client := rlsv3.NewRateLimitServiceClient(dial(t, addr))

	many := &rlsv3.RateLimitRequest{}
	for range rls.MaxDescriptors + 1 {
		many.Descriptors = append(many.Descriptors, desc("generic_key", "p/r"))
	}
	_, err := client.ShouldRateLimit(ctxTimeout(t, 10*time.Second), many)
	g.Expect(status.Code(err)).To(Equal(codes.InvalidArgument))
	g.Expect(status.Convert(err).Message()).To(ContainSubstring("at most 32"))

	wide := desc("generic_key", "p/r")
	for range rls.MaxEntries {
		wide.Entries = append(wide.Entries, &rlv3.RateLimitDescriptor_Entry{Key: "k", Value: "v"})
	}
	_, err = client.ShouldRateLimit(ctxTimeout(t, 10*time.Second), &rlsv3.RateLimitRequest{Descriptors: []*rlv3.RateLimitDescriptor{wide}})
	g.Expect(status.Code(err)).To(Equal(codes.InvalidArgument))
	g.Expect(status.Convert(err).Message()).To(ContainSubstring("at most 16"))
	g.Expect(lim.seen()).To(BeEmpty())

	many.Descriptors = many.Descriptors[:rls.MaxDescriptors]
	resp, err := client.ShouldRateLimit(ctxTimeout(t, 10*time.Second), many)
	g.Expect(err).NotTo(HaveOccurred(), "32 descriptors are accepted")
	g.Expect(resp.Statuses).To(HaveLen(rls.MaxDescriptors))
}

// The descriptors of one request are decided together: every limiter call is in flight
// before the first answers, so N descriptors cost one round trip, not N in a row.
func TestDescriptorsAreOneBatch(t *testing.T) {
	g := NewWithT(t)
	lim := newBlockingLimiter()
	addr, _ := serve(t, &rls.Server{Engine: &decide.Engine{Limiter: sidecartest.FakeLimiter{Decide: lim.Allow}}, Store: sidecartest.Store(t, 10, time.Minute)})
	client := rlsv3.NewRateLimitServiceClient(dial(t, addr))
	done := make(chan error, 1)
	go func() {
		_, err := client.ShouldRateLimit(ctxTimeout(t, 30*time.Second), &rlsv3.RateLimitRequest{Descriptors: []*rlv3.RateLimitDescriptor{
			desc("generic_key", "p/r", "k", "a"), desc("generic_key", "p/r", "k", "b"), desc("generic_key", "p/r", "k", "c"),
		}})
		done <- err
	}()
	for range 3 {
		g.Eventually(lim.entered).WithTimeout(10 * time.Second).Should(Receive())
	}
	close(lim.release)
	g.Eventually(done).WithTimeout(10 * time.Second).Should(Receive(BeNil()))
}

// A hit that can never be admitted (-1) is the refusal reported, as decide orders them, even
// when another refusal has a longer finite wait.
func TestNeverAdmissibleIsTheRefusal(t *testing.T) {
	g := NewWithT(t)
	lim := &countingLimiter{}
	addr, _ := serve(t, &rls.Server{Engine: &decide.Engine{Limiter: sidecartest.FakeLimiter{Decide: never{lim}.Allow}}, Store: sidecartest.Store(t, 10, time.Minute)})
	client := rlsv3.NewRateLimitServiceClient(dial(t, addr))
	over := desc("generic_key", "p/r", "k", "over")
	over.HitsAddend = wrapperspb.UInt64(11)
	huge := desc("generic_key", "p/r", "k", "huge")
	huge.HitsAddend = wrapperspb.UInt64(math.MaxUint64)
	resp, err := client.ShouldRateLimit(ctxTimeout(t, 10*time.Second), &rlsv3.RateLimitRequest{Descriptors: []*rlv3.RateLimitDescriptor{over, huge}})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(resp.OverallCode).To(Equal(rlsv3.RateLimitResponse_OVER_LIMIT))
	g.Expect(resp.Statuses[0].Code).To(Equal(rlsv3.RateLimitResponse_OVER_LIMIT))
	g.Expect(resp.Statuses[1].Code).To(Equal(rlsv3.RateLimitResponse_OVER_LIMIT))
	for _, h := range resp.ResponseHeadersToAdd {
		g.Expect(h.Key).NotTo(Equal("Retry-After"), "a never-admissible refusal has no retry time")
	}
	g.Expect(lim.seen()).To(ConsistOf(int64(11), int64(math.MaxInt64)))
}

// never answers costs above the limit as never admissible, as the limiter does.
type never struct{ *countingLimiter }

func (n never) Allow(ctx context.Context, key string, l limiter.Limit, cost int64) (limiter.Result, error) {
	r, err := n.countingLimiter.Allow(ctx, key, l, cost)
	if cost > l.Requests {
		r.RetryAfter = -1
	}
	return r, err
}
