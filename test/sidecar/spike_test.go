package sidecar_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"github.com/redis/go-redis/v9"

	"github.com/redline-dev/redline/internal/redisconn"
	"github.com/redline-dev/redline/internal/sidecar/checkapi"
	"github.com/redline-dev/redline/internal/sidecar/contract"
	"github.com/redline-dev/redline/internal/testutil/redistest"
	"github.com/redline-dev/redline/internal/testutil/redistest/redisclient"
	"github.com/redline-dev/redline/internal/testutil/sidecartest"
)

// The spike of issue 13: 10 sidecars whose pools add up to more than Redis's maxclients, all
// under a burst at once, while Redis stalls for a moment (as behind a slow command) so that
// every sidecar's pipelines pile up and their pools fill. Redis refuses connections; no
// sidecar dies, every request is answered (by Redis or by the sidecar's failure mode, never by
// another one), no sidecar holds more than its pool, and when the burst ends and idle
// connections close, every sidecar decides from Redis again, exactly.
func TestSpikeAgainstMaxclients(t *testing.T) {
	const (
		sidecars  = 10
		pool      = 8
		maxcl     = 30 // < sidecars x pool = 80: the spike must be refused
		callers   = 32 // per sidecar
		limit     = 20 // per key and 24h; the burst uses each key once
		idleClose = time.Second
	)
	g := NewWithT(t)
	srv, err := redistest.Start("--maxclients", strconv.Itoa(maxcl))
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { _ = srv.Close() })
	admin := redisclient.New(t, srv.URL(), redisconn.Options{PoolSize: 1, ReadTimeout: 5 * time.Second, WriteTimeout: 5 * time.Second, PoolTimeout: 5 * time.Second, ClientName: "spike-admin"})
	g.Expect(admin.Ping(context.Background()).Err()).To(Succeed(), "the test's own connection, opened before the spike")

	e := newEnv(t, "web")
	e.write(t, sidecartest.Document(e.namespace, "p", "r", "web", limit, 24*time.Hour, "x-key", "Closed"))
	modes := make([]string, sidecars)
	scs := make([]*sidecar, sidecars)
	for i := range sidecars {
		modes[i] = []string{contract.FailureModeOpen, contract.FailureModeClosed, contract.FailureModeLocalFallback}[i%3]
		scs[i] = start(t, fmt.Sprint("spike-", i), e, srv.URL(), "127.0.0.1:1", true,
			"--failure-mode="+modes[i], fmt.Sprint("--redis-pool-size=", pool), "--lease-horizon=0",
			"--redis-idle-timeout="+idleClose.String(), "--log-level=info")
	}

	// At rest a sidecar holds the one connection its heartbeat uses, not its pool.
	for _, s := range scs {
		g.Eventually(func() float64 { return s.metric(t, "redline_sidecar_redis_connections") }).
			WithTimeout(10*time.Second).Should(Equal(1.0), "%s at rest", s.name)
	}
	g.Expect(sidecarClients(g, admin)).To(Equal(sidecars), "Redis agrees: one connection per sidecar at rest")
	rejectedBefore := infoField(g, admin, "stats", "rejected_connections")

	// The burst, with a stall of Redis inside it.
	var (
		stop       atomic.Bool
		peakRedis  atomic.Int64
		peakPerPod = make([]atomic.Int64, sidecars)
		outcomes   = make([]map[string]int, sidecars)
		failures   atomic.Int64
		next       atomic.Int64
		wg         sync.WaitGroup
	)
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: callers}}
	defer client.CloseIdleConnections()
	for i, s := range scs {
		outcomes[i] = map[string]int{}
		var mu sync.Mutex
		for range callers {
			wg.Go(func() {
				for !stop.Load() {
					body := fmt.Sprintf(`{"policy":"p","rule":"r","key":["burst-%d"]}`, next.Add(1))
					d, err := check(client, s, body)
					if err != nil {
						failures.Add(1)
						continue
					}
					mu.Lock()
					outcomes[i][outcome(d)]++
					mu.Unlock()
				}
			})
		}
	}
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for n := 0; !stop.Load(); n++ {
			if v, err := connectedClients(admin); err == nil {
				peakRedis.Store(max(peakRedis.Load(), v))
			}
			if n%5 == 0 {
				for i, s := range scs {
					if v, err := scrape(s, "redline_sidecar_redis_connections"); err == nil {
						peakPerPod[i].Store(max(peakPerPod[i].Load(), int64(v)))
					}
				}
			}
			time.Sleep(10 * time.Millisecond)
		}
	}()
	time.Sleep(time.Second)
	g.Expect(srv.Pause()).To(Succeed())
	time.Sleep(400 * time.Millisecond)
	g.Expect(srv.Resume()).To(Succeed())
	time.Sleep(2 * time.Second)
	stop.Store(true)
	wg.Wait()
	<-sampled
	client.CloseIdleConnections()

	rejected := infoField(g, admin, "stats", "rejected_connections") - rejectedBefore
	refusedSeen := 0.0
	for _, s := range scs {
		refusedSeen += s.metric(t, `redline_sidecar_redis_errors_total{kind="maxclients"}`)
	}

	// Recovery: idle connections close, and every sidecar decides from Redis again.
	for _, s := range scs {
		g.Eventually(func() float64 { return s.metric(t, "redline_sidecar_redis_connections") }).
			WithTimeout(20*time.Second).Should(BeNumerically("<=", 1), "%s back at rest", s.name)
	}
	atRestAfter := sidecarClients(g, admin)
	recovered := make([]map[string]int, sidecars)
	for i, s := range scs {
		g.Eventually(func() (string, error) {
			d, err := check(client, s, fmt.Sprintf(`{"policy":"p","rule":"r","key":["probe-%d-%d"]}`, i, time.Now().UnixNano()))
			if err != nil {
				return "", err
			}
			return d.Results[0].Source, nil
		}).WithTimeout(20*time.Second).WithPolling(100*time.Millisecond).Should(Equal("redis"), "%s asks Redis again", s.name)
		recovered[i] = map[string]int{}
		for range limit + 5 {
			d, err := check(client, s, fmt.Sprintf(`{"policy":"p","rule":"r","key":["after-%d"]}`, i))
			g.Expect(err).NotTo(HaveOccurred())
			recovered[i][outcome(d)]++
		}
	}

	// The report.
	totals := map[string]int{}
	var b strings.Builder
	fmt.Fprintf(&b, "spike: %d sidecars x pool %d = worst case %d (+1, this test's) against maxclients %d; %d callers each, Redis paused 400ms inside 3.4s of burst\n",
		sidecars, pool, sidecars*pool, maxcl, callers)
	fmt.Fprintf(&b, "| sidecar | failure mode | peak connections (pool %d) | decisions in the burst | after: %d asked on one key of %d |\n| --- | --- | --- | --- | --- |\n", pool, limit+5, limit)
	for i, s := range scs {
		fmt.Fprintf(&b, "| %s | %s | %d | %s | %s |\n", s.name, modes[i], peakPerPod[i].Load(), fmtOutcomes(outcomes[i]), fmtOutcomes(recovered[i]))
		for k, v := range outcomes[i] {
			totals[k] += v
		}
	}
	fmt.Fprintf(&b, "connected_clients: %d at rest, peak %d in the burst (bound %d, maxclients %d), %d at rest after; rejected_connections %d (sidecars saw %.0f); all decisions: %s; unanswered %d\n",
		sidecars+1, peakRedis.Load(), sidecars*pool+1, maxcl, atRestAfter+1, rejected, refusedSeen, fmtOutcomes(totals), failures.Load())
	t.Log("\n" + b.String())

	for i, s := range scs {
		select {
		case <-s.Done():
			t.Fatalf("%s exited during the spike (%v)", s.name, s.exitErr())
		default:
		}
		g.Expect(peakPerPod[i].Load()).To(BeNumerically("<=", pool), "%s never holds more than its pool", s.name)
		own := map[string]string{contract.FailureModeOpen: "allowed/failopen", contract.FailureModeClosed: "refused/failclosed",
			contract.FailureModeLocalFallback: "allowed/fallback"}[modes[i]]
		for k := range outcomes[i] {
			g.Expect(k).To(BeElementOf("allowed/redis", own), "%s (%s) answers from Redis or its own failure mode", s.name, modes[i])
		}
		g.Expect(recovered[i]["allowed/redis"]).To(Equal(limit), "%s: exactly the limit admitted once Redis answers again", s.name)
		g.Expect(recovered[i]["refused/redis"]+recovered[i]["refused/precheck"]).To(Equal(5),
			"%s: the rest refused by Redis (or by the pre-check of its refusals), none by a failure mode", s.name)
	}
	g.Expect(failures.Load()).To(BeZero(), "every request of the burst answered")
	g.Expect(peakRedis.Load()).To(BeNumerically("<=", min(maxcl, sidecars*pool+1)))
	g.Expect(rejected).To(BeNumerically(">", 0), "the spike went over maxclients: Redis refused connections")
	g.Expect(refusedSeen).To(BeNumerically(">", 0), "and the sidecars counted the refusals")
	g.Expect(totals["allowed/redis"]).To(BeNumerically(">", 0), "Redis decided part of the burst")
	g.Expect(totals["allowed/failopen"]+totals["refused/failclosed"]+totals["allowed/fallback"]).To(BeNumerically(">", 0),
		"the failure modes decided the refused part")
	g.Expect(atRestAfter).To(BeNumerically("<=", sidecars), "at rest again: at most one connection per sidecar")
}

// check asks one sidecar's /v1/check for a decision on one rule.
func check(client *http.Client, s *sidecar, body string) (*checkapi.Response, error) {
	resp, err := client.Post(s.check+checkapi.Path, "application/json", bytes.NewBufferString(body))
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return nil, fmt.Errorf("%s: %s", resp.Status, b)
	}
	var d checkapi.Response
	if err := json.NewDecoder(resp.Body).Decode(&d); err != nil {
		return nil, err
	}
	if len(d.Results) != 1 {
		return nil, fmt.Errorf("%d results, want 1", len(d.Results))
	}
	return &d, nil
}

// outcome is "allowed/<source>" or "refused/<source>".
func outcome(d *checkapi.Response) string {
	if d.Allowed {
		return "allowed/" + d.Results[0].Source
	}
	return "refused/" + d.Results[0].Source
}

func fmtOutcomes(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
	}
	return strings.Join(parts, ", ")
}

// sidecarClients counts the connections Redis holds for sidecars (by their client name).
func sidecarClients(g Gomega, admin redis.UniversalClient) int {
	list, err := admin.ClientList(context.Background()).Result()
	g.Expect(err).NotTo(HaveOccurred())
	return strings.Count(list, " name="+contract.RedisClientName+" ")
}

// infoField reads one integer field of a section of INFO.
func infoField(g Gomega, admin redis.UniversalClient, section, field string) int64 {
	info, err := admin.Info(context.Background(), section).Result()
	g.Expect(err).NotTo(HaveOccurred())
	for line := range strings.SplitSeq(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			g.Expect(err).NotTo(HaveOccurred())
			return n
		}
	}
	g.Expect(field).To(BeEmpty(), "INFO %s has no %s", section, field)
	return 0
}

func connectedClients(admin redis.UniversalClient) (int64, error) {
	info, err := admin.Info(context.Background(), "clients").Result()
	if err != nil {
		return 0, err
	}
	for line := range strings.SplitSeq(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "connected_clients:"); ok {
			return strconv.ParseInt(v, 10, 64)
		}
	}
	return 0, fmt.Errorf("no connected_clients in INFO clients")
}

// scrape reads one unlabelled sample of a sidecar's /metrics, for goroutines that must not fail
// the test themselves.
func scrape(s *sidecar, name string) (float64, error) {
	resp, err := http.Get(s.admin + "/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, err
	}
	for line := range strings.SplitSeq(string(body), "\n") {
		if rest, ok := strings.CutPrefix(line, name+" "); ok {
			return strconv.ParseFloat(strings.TrimSpace(rest), 64)
		}
	}
	return 0, fmt.Errorf("no %s in %s's metrics", name, s.name)
}

// A sidecar opens no Redis connection until something needs one: without policies (nothing to
// decide, no heartbeat to send) it holds none; with them, the one its heartbeat uses.
func TestSidecarConnectsToRedisLazily(t *testing.T) {
	g := NewWithT(t)
	srv, err := redistest.Start()
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { _ = srv.Close() })
	admin := redisclient.New(t, srv.URL(), redisconn.Options{PoolSize: 1, ReadTimeout: 5 * time.Second, ClientName: "lazy-admin"})

	e := newEnv(t, "web")
	s := start(t, "lazy", e, srv.URL(), "127.0.0.1:1", false)
	g.Consistently(func(g Gomega) int { return sidecarClients(g, admin) }).
		WithTimeout(1500*time.Millisecond).WithPolling(100*time.Millisecond).Should(BeZero(), "no policies: no connection")
	g.Expect(s.metric(t, "redline_sidecar_redis_connections")).To(BeZero())

	e.write(t, sidecartest.Document(e.namespace, "p", "r", "web", 10, time.Minute, "x-key", "Closed"))
	g.Eventually(func(g Gomega) int { return sidecarClients(g, admin) }).
		WithTimeout(20*time.Second).WithPolling(100*time.Millisecond).Should(Equal(1), "policies: the heartbeat's connection")
	g.Consistently(func(g Gomega) int { return sidecarClients(g, admin) }).
		WithTimeout(1500*time.Millisecond).WithPolling(100*time.Millisecond).Should(Equal(1), "and only that one while at rest")
}
