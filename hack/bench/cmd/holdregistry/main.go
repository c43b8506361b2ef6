// Command holdregistry measures what keys that fill the sidecar's hold registries do to other
// keys, on a redis-server of its own, through the faces' handlers in process:
//
//   - Envoy's rate limit service: 1,700 keys each open 10 streams of a budget of 10,000 tokens a
//     minute (defaultHold 1,000: 10 streams per key), then a victim key starts 100 streams, none
//     done: how many are admitted (its limit is 10); and the same after 8 keys of a larger
//     budget start 16,384 streams;
//   - /v1/check: 8 keys reserve 16,384 holds and never settle, then 100 other keys reserve once
//     each: how many are answered 503; and the same with holds of a 2 s timeout, once every one
//     has passed its deadline.
//
// Usage: go run ./cmd/holdregistry (from hack/bench).
package main

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/redline-dev/redline/internal/limiter"
	"github.com/redline-dev/redline/internal/policydoc"
	"github.com/redline-dev/redline/internal/redisconn"
	"github.com/redline-dev/redline/internal/sidecar/checkapi"
	"github.com/redline-dev/redline/internal/sidecar/decide"
	"github.com/redline-dev/redline/internal/sidecar/rls"
	"github.com/redline-dev/redline/internal/sidecar/ruleset"
	"github.com/redline-dev/redline/internal/testutil/redistest"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func run() error {
	engine, store, closeAll, err := newEngine()
	if err != nil {
		return err
	}
	defer closeAll()
	if err := rlsFace(context.Background(), engine, store); err != nil {
		return err
	}
	checkFace(engine, store)
	return nil
}

// newEngine is a limiter on a redis-server of its own, and a rule set of three token-budget
// rules: tokens (10,000 a minute, 1,000 held a request), bulk and short (2 s timeout).
func newEngine() (_ *decide.Engine, _ *ruleset.Store, closeAll func(), err error) {
	srv, err := redistest.Start()
	if err != nil {
		return nil, nil, nil, err
	}
	closers := []func(){func() { _ = srv.Close() }}
	closeAll = func() {
		for _, c := range slices.Backward(closers) {
			c()
		}
	}
	defer func() {
		if err != nil {
			closeAll()
		}
	}()
	c, err := redisconn.NewClient(srv.URL(), redisconn.Options{ReadTimeout: 5 * time.Second, WriteTimeout: 5 * time.Second})
	if err != nil {
		return nil, nil, nil, err
	}
	closers = append(closers, func() { _ = c.Close() })
	lim, err := limiter.New(c, limiter.Options{})
	if err != nil {
		return nil, nil, nil, err
	}
	closers = append(closers, lim.Close)
	rule := func(name string, requests, hold, timeoutMS int64) policydoc.Rule {
		return policydoc.Rule{
			Name: name, Key: []policydoc.KeyPart{{Header: "x-user"}}, Algorithm: "FixedWindow",
			Requests: requests, WindowMS: time.Minute.Milliseconds(), Mode: "Enforce",
			Cost: &policydoc.Cost{From: policydoc.CostFromResponse, Usage: policydoc.UsageAuto, Header: "redline-cost", DefaultHold: hold, MinOutput: 1,
				OnError: policydoc.OnErrorUsed, TimeoutMS: timeoutMS},
		}
	}
	_, data, err := policydoc.Build("ns", []policydoc.Policy{{
		Name: "llm", Generation: 1, FailureMode: "Open", Selector: policydoc.Selector{MatchLabels: map[string]string{"app": "web"}},
		Rules: []policydoc.Rule{rule("tokens", 10_000, 1_000, time.Minute.Milliseconds()),
			rule("bulk", 100_000_000, 1, time.Minute.Milliseconds()), rule("short", 100_000_000, 1, 2_000)},
	}}, map[string]string{})
	if err != nil {
		return nil, nil, nil, err
	}
	doc, err := policydoc.Parse(data)
	if err != nil {
		return nil, nil, nil, err
	}
	set, err := ruleset.NewBuilder("").Build(doc, map[string]string{"app": "web"})
	if err != nil {
		return nil, nil, nil, err
	}
	store := &ruleset.Store{}
	store.Swap(set)
	return &decide.Engine{Limiter: lim}, store, closeAll, nil
}

// rlsFace fills Envoy's face's hold registry, then measures what a victim key gets.
func rlsFace(ctx context.Context, engine *decide.Engine, store *ruleset.Store) error {
	s := &rls.Server{Engine: engine, Store: store, Holds: &decide.Registry{}}
	start := func(user string) (rlsv3.RateLimitResponse_Code, error) {
		d := &rlv3.RateLimitDescriptor{Entries: []*rlv3.RateLimitDescriptor_Entry{
			{Key: "policy", Value: "llm"}, {Key: "rule", Value: "tokens"}, {Key: "user", Value: user}}}
		resp, err := s.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*rlv3.RateLimitDescriptor{d}})
		if err != nil {
			return 0, err
		}
		return resp.OverallCode, nil
	}
	t0 := time.Now()
	var fillOK atomic.Int64
	if err := parallel(17_000, 16, func(i int) error {
		code, err := start(fmt.Sprintf("filler-%d", i%1_700))
		if code == rlsv3.RateLimitResponse_OK {
			fillOK.Add(1)
		}
		return err
	}); err != nil {
		return err
	}
	fmt.Printf("rls: 17000 stream starts over 1700 keys: %d admitted in %v; %d holds kept\n", fillOK.Load(), time.Since(t0).Round(10*time.Millisecond), s.Holds.Len())
	var victim atomic.Int64
	// One after the other, none done: 100 streams open at once by the end.
	if err := parallel(100, 1, func(int) error {
		code, err := start("victim")
		if code == rlsv3.RateLimitResponse_OK {
			victim.Add(1)
		}
		return err
	}); err != nil {
		return err
	}
	fmt.Printf("rls: victim key (limit 10 streams) under the filled registry: %d of 100 admitted\n", victim.Load())

	// One key's holds on a fresh registry: a busy key, then the victim.
	s.Holds = &decide.Registry{}
	var busy atomic.Int64
	for i := range 16_384 {
		code, err := startRule(ctx, s, "bulk", fmt.Sprintf("busy-%d", i%8))
		if err != nil {
			return err
		}
		if code == rlsv3.RateLimitResponse_OK {
			busy.Add(1)
		}
	}
	victim.Store(0)
	if err := parallel(100, 1, func(int) error {
		code, err := start("victim-2")
		if code == rlsv3.RateLimitResponse_OK {
			victim.Add(1)
		}
		return err
	}); err != nil {
		return err
	}
	fmt.Printf("rls: 8 keys start 16384 streams (%d admitted), then a victim key: %d of 100 admitted\n", busy.Load(), victim.Load())

	return nil
}

// checkFace fills /v1/check's hold registry, then measures what other keys get.
func checkFace(engine *decide.Engine, store *ruleset.Store) {
	h := &checkapi.Handler{Engine: engine, Store: store, Holds: &decide.Registry{}}
	reserve := func(rule, user string) int {
		rec := httptest.NewRecorder()
		body := `{"policy":"llm","rule":"` + rule + `","key":["` + user + `"],"reserve":{}}`
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, checkapi.Path, strings.NewReader(body)))
		return rec.Code
	}
	others := func(rule string) map[int]int {
		got := map[int]int{}
		for i := range 100 {
			got[reserve(rule, fmt.Sprintf("other-%d", i))]++
		}
		return got
	}
	statuses := map[int]int{}
	for i := range 16_384 {
		statuses[reserve("bulk", fmt.Sprintf("hog-%d", i%8))]++
	}
	fmt.Printf("check: 8 keys reserve 16384 holds (a minute's timeout), never settled: %v\n", statuses)
	fmt.Printf("check: then 100 other keys reserve once each: %v\n", others("bulk"))

	// Holds of a 2 s timeout, past their deadline.
	h.Holds = &decide.Registry{}
	statuses = map[int]int{}
	var last time.Time
	for i := range 16_384 {
		statuses[reserve("short", fmt.Sprintf("hog-%d", i%8))]++
		last = time.Now()
	}
	time.Sleep(time.Until(last.Add(2100 * time.Millisecond)))
	fmt.Printf("check: 8 keys reserve 16384 holds of a 2 s timeout (%v); once all passed their deadline, 100 other keys: %v\n", statuses, others("short"))
}

// startRule starts one stream of rule for user on Envoy's face.
func startRule(ctx context.Context, s *rls.Server, rule, user string) (rlsv3.RateLimitResponse_Code, error) {
	d := &rlv3.RateLimitDescriptor{Entries: []*rlv3.RateLimitDescriptor_Entry{
		{Key: "policy", Value: "llm"}, {Key: "rule", Value: rule}, {Key: "user", Value: user}}}
	resp, err := s.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*rlv3.RateLimitDescriptor{d}})
	if err != nil {
		return 0, err
	}
	return resp.OverallCode, nil
}

// parallel runs f(0..n-1) on workers goroutines and returns the first error.
func parallel(n, workers int, f func(i int) error) error {
	var next atomic.Int64
	var wg sync.WaitGroup
	var once sync.Once
	var first error
	for range workers {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				if err := f(i); err != nil {
					once.Do(func() { first = err })
					return
				}
			}
		})
	}
	wg.Wait()
	return first
}
