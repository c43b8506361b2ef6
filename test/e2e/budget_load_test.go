package e2e

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"maps"
	"mime"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/redis/go-redis/v9"

	"github.com/redline-dev/redline/internal/testutil/fakemodel"
	"github.com/redline-dev/redline/internal/testutil/stack"
	"github.com/redline-dev/redline/internal/tokens"
)

// The load of the token budget specs: clients per sidecar, what each asks and what the fake
// model answers. 3 x 64 streams of about 360 tokens ask for 7x the budget at once.
const (
	budgetClients = 64
	budgetCap     = 400 // the output cap each request sets
	budgetLength  = 350 // tokens the fake generates when the cap allows
	budgetDelay   = time.Millisecond
	// budgetBackoff is how long a refused client waits before it asks again: far less than
	// Retry-After (the window's end), so demand stays above the budget all the run.
	budgetBackoff = 50 * time.Millisecond
	// budgetLinger is how long a run goes on once 90% of the budget is served: the last holds
	// settle and their units are asked for again. budgetMaxRun bounds a run that never gets
	// there (then the >= 90% assertion fails).
	budgetLinger = 3 * time.Second
	budgetMaxRun = 15 * time.Second
)

// budgetCall is the request every client of the load sends: an OpenAI chat stream asking for
// its usage (which the check-then-charge client needs; the proxy asks for it anyway).
var budgetCall = fakemodel.Call{Kind: tokens.OpenAIChat, Stream: true, IncludeUsage: true, Cap: budgetCap, Prompt: "Write a short poem about rate limits."}

// budgetHTTP keeps a connection per client goroutine open to each sidecar and fake.
var budgetHTTP = &http.Client{Transport: &http.Transport{
	MaxIdleConns: 4 * budgetClients * replicas, MaxIdleConnsPerHost: 2 * budgetClients * replicas, IdleConnTimeout: 30 * time.Second,
	DialContext: (&net.Dialer{Timeout: 2 * time.Second}).DialContext,
}}

// startFake serves a fake model on a loopback port until the container's specs end.
func startFake(cfg fakemodel.Config) (*fakemodel.Server, string) {
	GinkgoHelper()
	fm := fakemodel.New(cfg)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	Expect(err).NotTo(HaveOccurred())
	srv := &http.Server{Handler: fm, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	DeferCleanup(srv.Close)
	return fm, ln.Addr().String()
}

// streamResult is what a client saw of one request.
type streamResult struct {
	status int
	usage  tokens.Usage
	known  bool // the body reported a usage
}

// stream sends one request of c to base and reads its whole body, scanning it for its usage.
func stream(ctx context.Context, base string, c fakemodel.Call, header http.Header) (streamResult, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+c.Path(), bytes.NewReader(c.Body()))
	if err != nil {
		return streamResult{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	maps.Copy(req.Header, header)
	res, err := budgetHTTP.Do(req)
	if err != nil {
		return streamResult{}, err
	}
	defer func() { _ = res.Body.Close() }()
	ct, _, _ := mime.ParseMediaType(res.Header.Get("Content-Type"))
	scan := tokens.NewUsageScanner(c.Kind, ct == "text/event-stream")
	if _, err := io.Copy(scan, res.Body); err != nil {
		return streamResult{status: res.StatusCode}, fmt.Errorf("reading the response of %s: %w", base, err)
	}
	u, ok := scan.Usage()
	return streamResult{status: res.StatusCode, usage: u, known: ok}, nil
}

// budgetRun is one run's outcome.
type budgetRun struct {
	name              string
	served            fakemodel.Served // the fake's count over the run
	admitted, refused int64
	failed            int64
	firstFailure      string
	elapsed           time.Duration
}

func (r budgetRun) overshoot() int64 { return max(r.served.Total()-budgetTokens, 0) }

// runLoad runs clients goroutines on each target, each calling one until the run stops: 90%
// of budgetTokens served by fm plus budgetLinger, or budgetMaxRun. one returns whether the
// request was admitted; an error counts as a failure. A refused client waits budgetBackoff.
// In-flight requests finish before runLoad returns; none starts after the stop.
func runLoad(ctx context.Context, name string, fm *fakemodel.Server, targets []string, one func(ctx context.Context, target string) (bool, error)) budgetRun {
	before := fm.Served()
	start := time.Now()
	var stopped atomic.Bool
	stopCh := make(chan struct{})
	var stopOnce sync.Once
	stop := func() { stopOnce.Do(func() { stopped.Store(true); close(stopCh) }) }
	go func() { // the run's clock: a few seconds after the budget is spent, or the bound
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		bound := time.After(budgetMaxRun)
		for {
			select {
			case <-stopCh:
				return
			case <-bound:
				stop()
				return
			case <-ctx.Done():
				stop()
				return
			case <-tick.C:
				if fm.Served().Total()-before.Total() >= budgetTokens*9/10 {
					time.AfterFunc(budgetLinger, stop)
					return
				}
			}
		}
	}()
	run := budgetRun{name: name}
	var admitted, refused, failed atomic.Int64
	var failMu sync.Mutex
	var wg sync.WaitGroup
	for _, target := range targets {
		for range budgetClients {
			wg.Go(func() {
				for !stopped.Load() {
					ok, err := one(ctx, target)
					switch {
					case err != nil:
						failed.Add(1)
						failMu.Lock()
						if run.firstFailure == "" {
							run.firstFailure = err.Error()
						}
						failMu.Unlock()
					case ok:
						admitted.Add(1)
						continue
					default:
						refused.Add(1)
					}
					select {
					case <-stopCh:
					case <-time.After(budgetBackoff):
					}
				}
			})
		}
	}
	wg.Wait()
	stop()
	after := fm.Served()
	run.served = fakemodel.Served{Input: after.Input - before.Input, Output: after.Output - before.Output, Requests: after.Requests - before.Requests}
	run.admitted, run.refused, run.failed = admitted.Load(), refused.Load(), failed.Load()
	run.elapsed = time.Since(start)
	return run
}

// checkThenCharge is the field's approach to a token budget, emulated for the contrast: read
// the key's count, send when it is under the budget, add the response's reported usage after
// it. Every client that reads the count before the first response ends is let through.
func checkThenCharge(rdb *redis.Client, counter string) func(ctx context.Context, target string) (bool, error) {
	return func(ctx context.Context, target string) (bool, error) {
		used, err := rdb.Get(ctx, counter).Int64()
		if err != nil && err != redis.Nil {
			return false, fmt.Errorf("reading the check-then-charge counter: %w", err)
		}
		if used >= budgetTokens {
			return false, nil
		}
		r, err := stream(ctx, target, budgetCall, nil)
		if err != nil {
			return false, err
		}
		if r.status != http.StatusOK || !r.known {
			return false, fmt.Errorf("the fake model answered %d, usage reported: %v", r.status, r.known)
		}
		pipe := rdb.TxPipeline()
		pipe.IncrBy(ctx, counter, r.usage.Cost())
		pipe.PExpire(ctx, counter, time.Minute)
		if _, err := pipe.Exec(ctx); err != nil {
			return false, fmt.Errorf("charging the check-then-charge counter: %w", err)
		}
		return true, nil
	}
}

// budgetTable is the runs side by side, in Markdown.
func budgetTable(runs ...budgetRun) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d sidecars x %d concurrent OpenAI chat streams (cap %d, %d tokens generated, %v a token), FixedWindow budget of %d tokens a minute on one API key:\n\n",
		replicas, budgetClients, budgetCap, budgetLength, budgetDelay, budgetTokens)
	b.WriteString("| approach | tokens served by the upstream | overshoot | budget used | requests admitted | refused | run |\n")
	b.WriteString("| --- | --- | --- | --- | --- | --- | --- |\n")
	for _, r := range runs {
		fmt.Fprintf(&b, "| %s | %d (%d in, %d out) | %d | %.1f%% | %d | %d | %v |\n", r.name, r.served.Total(), r.served.Input, r.served.Output,
			r.overshoot(), 100*float64(r.served.Total())/budgetTokens, r.admitted, r.refused, r.elapsed.Round(100*time.Millisecond))
	}
	return b.String()
}

// writeResult writes a results page into $REDLINE_E2E_RESULTS, a directory relative to the
// repository's root (REDLINE_E2E_RESULTS=results), only when a person asks: an ordinary run
// leaves the tree clean.
func writeResult(name, text string) {
	GinkgoHelper()
	dir := os.Getenv("REDLINE_E2E_RESULTS")
	if dir == "" {
		return
	}
	if !filepath.IsAbs(dir) {
		root, err := stack.RepoRoot()
		Expect(err).NotTo(HaveOccurred())
		dir = filepath.Join(root, dir)
	}
	Expect(os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644)).To(Succeed())
	GinkgoWriter.Printf("wrote %s\n", filepath.Join(dir, name))
}
