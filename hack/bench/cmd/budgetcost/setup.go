package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redline-dev/redline/internal/policydoc"
	"github.com/redline-dev/redline/internal/redisacl"
	"github.com/redline-dev/redline/internal/testutil/fakemodel"
	"github.com/redline-dev/redline/internal/testutil/redistest"
	"github.com/redline-dev/redline/internal/testutil/sidecarproc"
)

const (
	namespace = "bench"
	keyHeader = "x-key"
	// limit is never reached, in requests or in tokens: every request is admitted, and what is
	// measured is the path, not a refusal.
	limit = 1_000_000_000
	// window is a day: a FixedWindow's holds go back at the window's end at the latest, and a
	// day's end seldom falls inside a run; one that does still passes (a settle that finds its
	// hold gone back counts, and the report shows how many holds it saw open).
	window = 24 * time.Hour
	// keys is how many X-Key values the requests spread over.
	keys = 16
	// outputCap is the max_completion_tokens each streamed request asks for: above -tokens, so
	// the fake stops at -tokens and the hold (prompt + cap) gives back the unused part.
	outputCap = 2000
	// redisTimeout is the sidecars' --redis-timeout: long enough that on a loaded machine the
	// decisions are Redis's, not the failure mode's, which would cost the sidecar less.
	redisTimeout = time.Second
)

// policies are the two documents: one rule each, on the same requests, keyed on X-Key.
var policies = [2]policydoc.Policy{
	pathPlain: {Name: "plain", Generation: 1, Selector: policydoc.Selector{MatchLabels: map[string]string{"app": "bench"}},
		FailureMode: "Closed", Rules: []policydoc.Rule{{Name: "requests", Key: []policydoc.KeyPart{{Header: keyHeader}},
			Algorithm: "FixedWindow", Requests: limit, WindowMS: window.Milliseconds(), Mode: "Enforce"}}},
	pathBudget: {Name: "budget", Generation: 1, Selector: policydoc.Selector{MatchLabels: map[string]string{"app": "bench"}},
		FailureMode: "Closed", Rules: []policydoc.Rule{{Name: "tokens", Key: []policydoc.KeyPart{{Header: keyHeader}},
			Algorithm: "FixedWindow", Requests: limit, WindowMS: window.Milliseconds(), Mode: "Enforce",
			Cost: &policydoc.Cost{From: policydoc.CostFromResponse, Usage: policydoc.UsageAuto, Header: "redline-cost",
				DefaultHold: 1000, MinOutput: 10, OnError: policydoc.OnErrorUsed, TimeoutMS: (10 * time.Minute).Milliseconds()}}}},
}

// bench is what the sidecar sections share: one redis-server, the fake model API, and a
// sidecar per path, all on loopback.
type bench struct {
	redis    *redistest.Server
	rc       *redis.Client
	model    *fakemodel.Server
	upstream string
	stopUp   func()
	sidecars [2]*sidecarproc.Sidecar
}

// startBench builds ./cmd/sidecar of root and starts everything. The caller closes it.
func startBench(ctx context.Context, root, dir string, o options) (_ *bench, err error) {
	b := &bench{}
	defer func() {
		if err != nil {
			b.close()
		}
	}()
	progress("building ./cmd/sidecar")
	bin, err := sidecarproc.Build(ctx, root, dir)
	if err != nil {
		return nil, err
	}
	if b.redis, err = redistest.Start(); err != nil {
		return nil, fmt.Errorf("starting redis-server: %w", err)
	}
	b.rc = redis.NewClient(&redis.Options{Addr: b.redis.Addr()})
	// What the manager would load: the sidecar's first calls are then EVALSHA, as in a cluster.
	for _, s := range redisacl.SidecarScripts() {
		if err := b.rc.ScriptLoad(ctx, s.Source).Err(); err != nil {
			return nil, fmt.Errorf("SCRIPT LOAD %s: %w", s.Name, err)
		}
	}
	b.model = fakemodel.New(fakemodel.Config{Length: o.tokens})
	if b.upstream, b.stopUp, err = serve(b.model); err != nil {
		return nil, err
	}
	for p, pol := range policies {
		_, doc, err := policydoc.Build(namespace, []policydoc.Policy{pol}, map[string]string{})
		if err != nil {
			return nil, fmt.Errorf("building the %s policies document: %w", pathNames[p], err)
		}
		files, err := sidecarproc.WriteFiles(filepath.Join(dir, "files-"+pathNames[p]), doc, "bench")
		if err != nil {
			return nil, err
		}
		s, err := sidecarproc.Start(ctx, sidecarproc.Options{Bin: bin, Dir: filepath.Join(dir, "logs"), Name: pathNames[p],
			Namespace: namespace, Files: files, RedisURL: b.redis.URL(), Upstream: b.upstream,
			// --pprof: its heap handler forces a GC before the heap is read (heap.go). The
			// connection bound is the default's when the memory limit is unknown, written out
			// so that the in-flight streams fit whatever the machine's cgroup says.
			Args: []string{"--redis-timeout=" + redisTimeout.String(), "--pprof", "--max-conns=" + strconv.Itoa(max(1024, 2*o.inflight+o.concurrency))}})
		if err != nil {
			return nil, fmt.Errorf("starting the %s sidecar: %w", pathNames[p], err)
		}
		b.sidecars[p] = s
	}
	return b, nil
}

func (b *bench) close() {
	for _, s := range b.sidecars {
		if s != nil {
			_ = s.Stop(3 * time.Second)
		}
	}
	if b.stopUp != nil {
		b.stopUp()
	}
	if b.rc != nil {
		_ = b.rc.Close()
	}
	if b.redis != nil {
		_ = b.redis.Close()
	}
}

// checkHealthy fails the run if a sidecar's failure mode decided anything: its numbers would
// then be of a path that skipped Redis.
func (b *bench) checkHealthy(ctx context.Context) error {
	for p, s := range b.sidecars {
		n, err := scrapeSum(ctx, s.Admin, "redline_sidecar_degraded_decisions_total", "")
		if err != nil {
			return err
		}
		if n != 0 {
			return fmt.Errorf("the %s sidecar's failure mode made %.0f decisions: Redis did not answer within %s", pathNames[p], n, redisTimeout)
		}
	}
	return nil
}

// serve runs h on a loopback port until the returned function is called.
func serve(h http.Handler) (string, func(), error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, fmt.Errorf("listening on loopback: %w", err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	return ln.Addr().String(), func() { _ = srv.Close() }, nil
}

// scrapeSum is the sum of the samples of metric name at the admin address whose labels
// contain match ("" for all), 0 when there is none.
func scrapeSum(ctx context.Context, admin, name, match string) (float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+admin+"/metrics", nil)
	if err != nil {
		return 0, fmt.Errorf("building the metrics request: %w", err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, fmt.Errorf("scraping %s: %w", admin, err)
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("scraping %s: status %d", admin, resp.StatusCode)
	}
	return sumSamples(bufio.NewScanner(resp.Body), name, match)
}

// sumSamples reads Prometheus text and sums the samples of name whose labels contain match.
func sumSamples(sc *bufio.Scanner, name, match string) (float64, error) {
	var sum float64
	for sc.Scan() {
		line := sc.Text()
		series, val, ok := strings.Cut(line, " ")
		if !ok || strings.HasPrefix(line, "#") {
			continue
		}
		metric, labels, _ := strings.Cut(series, "{")
		if metric != name || !strings.Contains(labels, match) {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(val), 64)
		if err != nil {
			return 0, fmt.Errorf("metric %s: %w", series, err)
		}
		sum += v
	}
	if err := sc.Err(); err != nil {
		return 0, fmt.Errorf("reading metrics: %w", err)
	}
	return sum, nil
}

// waitFor polls cond every 20ms until it holds or within has passed.
func waitFor(ctx context.Context, within time.Duration, cond func() (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	for {
		ok, err := cond()
		if err != nil || ok {
			return err
		}
		select {
		case <-ctx.Done():
			return errors.New("not within " + within.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
}
