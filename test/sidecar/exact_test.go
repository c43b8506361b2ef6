package sidecar_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	. "github.com/onsi/gomega"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/redline-dev/redline/internal/fleet"
	"github.com/redline-dev/redline/internal/redisconn"
	"github.com/redline-dev/redline/internal/sidecar/checkapi"
	"github.com/redline-dev/redline/internal/sidecar/proxy"
	"github.com/redline-dev/redline/internal/testutil/redistest/redisclient"
	"github.com/redline-dev/redline/internal/testutil/sidecartest"
)

// upstream is the application behind the sidecars; it counts the requests that reach it.
type upstream struct {
	*httptest.Server
	hits atomic.Int64
}

func newUpstream(t testing.TB) *upstream {
	u := &upstream{}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.hits.Add(1)
		w.Header().Set("X-Upstream", "yes")
		_, _ = fmt.Fprintf(w, "hello %s %s xff=%s\n", r.Method, r.URL.Path, r.Header.Get("X-Forwarded-For"))
	}))
	t.Cleanup(u.Close)
	return u
}

func (u *upstream) addr() string { return u.Listener.Addr().String() }

const limit = 100

var (
	retryAfterRE = regexp.MustCompile(`^[1-9][0-9]*$`)
	rateLimitRE  = regexp.MustCompile(`^"shared/per-key";r=(\d+);t=(\d+)$`)
)

// Three sidecars in front of one application, one policy of 100 requests a minute per API key:
// whichever face is used and however requests are spread, exactly 100 pass.
func TestThreeReplicasShareOneLimit(t *testing.T) {
	g := NewWithT(t)
	e := newEnv(t, "checkout")
	e.write(t, sidecartest.Document(e.namespace, "shared", "per-key", "checkout", limit, time.Minute, "x-api-key", "LocalFallback"))
	up := newUpstream(t)
	var scs []*sidecar
	for i := range 3 {
		scs = append(scs, start(t, fmt.Sprint("pod-", i), e, shared.URL(), up.addr(), true))
	}

	t.Run("proxy", func(t *testing.T) {
		g := NewWithT(t)
		key := fmt.Sprint("proxy-", time.Now().UnixNano())
		statuses := map[int]int{}
		var mu sync.Mutex
		var refusal *http.Response
		var refusalBody []byte
		parallel(300, 12, func(i int) {
			req, _ := http.NewRequest(http.MethodGet, scs[i%3].proxy+"/api/orders", nil)
			req.Header.Set("X-API-Key", key)
			resp, err := httpClient.Do(req)
			g.Expect(err).NotTo(HaveOccurred())
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			mu.Lock()
			defer mu.Unlock()
			statuses[resp.StatusCode]++
			g.Expect(resp.Header.Get("RateLimit-Policy")).To(Equal(`"shared/per-key";q=100;w=60`))
			m := rateLimitRE.FindStringSubmatch(resp.Header.Get("RateLimit"))
			g.Expect(m).NotTo(BeNil(), "RateLimit field %q", resp.Header.Get("RateLimit"))
			switch resp.StatusCode {
			case http.StatusOK:
				g.Expect(resp.Header.Get("X-Upstream")).To(Equal("yes"))
				g.Expect(resp.Header.Get("Retry-After")).To(BeEmpty())
			case http.StatusTooManyRequests:
				g.Expect(m[1]).To(Equal("0"))
				g.Expect(resp.Header.Get("Retry-After")).To(MatchRegexp(retryAfterRE.String()))
				g.Expect(resp.Header.Get("X-Upstream")).To(BeEmpty(), "a refused request never reaches the application")
				if refusal == nil {
					refusal, refusalBody = resp, body
				}
			}
		})
		g.Expect(statuses).To(Equal(map[int]int{200: limit, 429: 300 - limit}))
		g.Expect(up.hits.Load()).To(Equal(int64(limit)), "only admitted requests reach the application")
		var body proxy.Refusal
		g.Expect(json.Unmarshal(refusalBody, &body)).To(Succeed())
		g.Expect(body.Error).To(Equal("rate_limited"))
		g.Expect(body.Policy).To(Equal("shared"))
		g.Expect(body.Rule).To(Equal("per-key"))
		ra, _ := strconv.ParseInt(refusal.Header.Get("Retry-After"), 10, 64)
		g.Expect(body.RetryAfterSeconds).To(Equal(ra))
		g.Expect(ra).To(BeNumerically("<=", 60))
		g.Expect(refusal.Header.Get("Content-Type")).To(Equal("application/json"))
	})

	t.Run("checkAPI", func(t *testing.T) {
		g := NewWithT(t)
		key := fmt.Sprint("check-", time.Now().UnixNano())
		var allowed, refused atomic.Int64
		parallel(300, 12, func(i int) {
			// Alternate the two request shapes: explicit hits and request attributes.
			body := fmt.Sprintf(`{"policy":"shared","rule":"per-key","key":[%q]}`, key)
			if i%2 == 1 {
				body = fmt.Sprintf(`{"method":"POST","path":"/api/pay?x=1","headers":{"x-api-key":%q},"remoteAddress":"10.0.0.1"}`, key)
			}
			resp, err := httpClient.Post(scs[i%3].check+checkapi.Path, "application/json", bytes.NewBufferString(body))
			g.Expect(err).NotTo(HaveOccurred())
			defer resp.Body.Close()
			g.Expect(resp.StatusCode).To(Equal(http.StatusOK))
			var d checkapi.Response
			g.Expect(json.NewDecoder(resp.Body).Decode(&d)).To(Succeed())
			g.Expect(d.Results).To(HaveLen(1))
			g.Expect(d.Results[0].Limit).To(Equal(int64(limit)))
			g.Expect(d.Headers["RateLimit-Policy"]).To(Equal(`"shared/per-key";q=100;w=60`))
			if d.Allowed {
				allowed.Add(1)
				g.Expect(d.Headers).NotTo(HaveKey("Retry-After"))
			} else {
				refused.Add(1)
				g.Expect(d.Policy).To(Equal("shared"))
				g.Expect(d.RetryAfterSeconds).To(BeNumerically(">=", 1))
				g.Expect(d.Headers["Retry-After"]).To(Equal(strconv.FormatInt(d.RetryAfterSeconds, 10)))
			}
		})
		g.Expect(allowed.Load()).To(Equal(int64(limit)))
		g.Expect(refused.Load()).To(Equal(int64(300 - limit)))

		// The proxy and the API count the same key for the same client.
		req, _ := http.NewRequest(http.MethodGet, scs[0].proxy+"/", nil)
		req.Header.Set("X-API-Key", key)
		resp, err := httpClient.Do(req)
		g.Expect(err).NotTo(HaveOccurred())
		resp.Body.Close()
		g.Expect(resp.StatusCode).To(Equal(http.StatusTooManyRequests))

		resp, err = httpClient.Post(scs[0].check+checkapi.Path, "application/json", bytes.NewBufferString(`{"policy":"nope","rule":"x"}`))
		g.Expect(err).NotTo(HaveOccurred())
		resp.Body.Close()
		g.Expect(resp.StatusCode).To(Equal(http.StatusBadRequest))
	})

	t.Run("envoyRLS", func(t *testing.T) {
		g := NewWithT(t)
		var clients []rlsv3.RateLimitServiceClient
		for _, s := range scs {
			conn, err := grpc.NewClient(s.grpc, grpc.WithTransportCredentials(insecure.NewCredentials()))
			g.Expect(err).NotTo(HaveOccurred())
			t.Cleanup(func() { _ = conn.Close() })
			clients = append(clients, rlsv3.NewRateLimitServiceClient(conn))
		}
		key := fmt.Sprint("rls-", time.Now().UnixNano())
		var ok, over atomic.Int64
		parallel(300, 12, func(i int) {
			entries := []*rlv3.RateLimitDescriptor_Entry{{Key: "policy", Value: "shared"}, {Key: "rule", Value: "per-key"}, {Key: "api_key", Value: key}}
			if i%2 == 1 {
				entries = []*rlv3.RateLimitDescriptor_Entry{{Key: "generic_key", Value: "shared/per-key"}, {Key: "api_key", Value: key}}
			}
			resp, err := clients[i%3].ShouldRateLimit(ctxTimeout(t, 30*time.Second), &rlsv3.RateLimitRequest{
				Domain: "redline",
				Descriptors: []*rlv3.RateLimitDescriptor{
					{Entries: entries},
					{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "unrelated", Value: "x"}}},
				},
			})
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(resp.Statuses).To(HaveLen(2))
			g.Expect(resp.Statuses[1].Code).To(Equal(rlsv3.RateLimitResponse_OK), "descriptors of no rule pass")
			st := resp.Statuses[0]
			g.Expect(st.CurrentLimit.RequestsPerUnit).To(Equal(uint32(limit)))
			g.Expect(st.CurrentLimit.Unit).To(Equal(rlsv3.RateLimitResponse_RateLimit_MINUTE))
			g.Expect(st.DurationUntilReset.AsDuration()).To(BeNumerically(">", 0))
			hdr := map[string]string{}
			for _, h := range resp.ResponseHeadersToAdd {
				hdr[h.Key] = h.Value
			}
			g.Expect(hdr["RateLimit-Policy"]).To(Equal(`"shared/per-key";q=100;w=60`))
			switch resp.OverallCode {
			case rlsv3.RateLimitResponse_OK:
				ok.Add(1)
				g.Expect(hdr).NotTo(HaveKey("Retry-After"))
			case rlsv3.RateLimitResponse_OVER_LIMIT:
				over.Add(1)
				g.Expect(st.Code).To(Equal(rlsv3.RateLimitResponse_OVER_LIMIT))
				g.Expect(st.LimitRemaining).To(BeZero())
				g.Expect(hdr["Retry-After"]).To(MatchRegexp(retryAfterRE.String()))
			}
		})
		g.Expect(ok.Load()).To(Equal(int64(limit)))
		g.Expect(over.Load()).To(Equal(int64(300 - limit)))
	})

	t.Run("heartbeatsAndMetrics", func(t *testing.T) {
		g := NewWithT(t)
		c := redisclient.New(t, shared.URL(), redisconn.Options{ReadTimeout: 5 * time.Second})
		var hash string
		g.Eventually(func() map[string]string {
			m, _ := fleet.Members(context.Background(), c, e.namespace, "shared", 1500*time.Millisecond)
			for _, h := range m {
				hash = h
			}
			return m
		}).WithTimeout(10 * time.Second).WithPolling(100 * time.Millisecond).Should(HaveLen(3))
		g.Expect(hash).To(HaveLen(64))
		g.Expect(c.PTTL(context.Background(), fleet.GroupKey(e.namespace, "shared")).Val()).To(BeNumerically(">", 0))
		g.Eventually(func() float64 {
			return scs[0].metric(t, `redline_sidecar_policy_replicas{policy="shared"}`)
		}).WithTimeout(10 * time.Second).WithPolling(100 * time.Millisecond).Should(Equal(3.0))

		g.Expect(scs[0].metric(t, fmt.Sprintf(`redline_sidecar_config_info{hash=%q,namespace=%q}`, hash, e.namespace))).To(Equal(1.0))
		var allowed, refused float64
		for _, s := range scs {
			allowed += s.metric(t, `redline_sidecar_decisions_total{policy="shared",result="allowed",rule="per-key",source="redis"}`)
			refused += s.metric(t, `redline_sidecar_decisions_total{policy="shared",result="refused",rule="per-key",source="redis"}`) +
				max(s.metric(t, `redline_sidecar_decisions_total{policy="shared",result="refused",rule="per-key",source="precheck"}`), 0)
		}
		g.Expect(allowed).To(BeNumerically(">=", 3*limit))
		g.Expect(refused).To(BeNumerically(">=", 3*(300-limit)))
		g.Expect(scs[0].metric(t, "redline_sidecar_breaker_open")).To(Equal(0.0))
		g.Expect(scs[0].metric(t, "redline_sidecar_redis_latency_seconds_count")).To(BeNumerically(">", 0))
		g.Expect(scs[0].metric(t, "redline_sidecar_redis_round_trips_per_decision")).To(BeNumerically(">", 0))
	})
	g.Expect(scs).To(HaveLen(3))
}

// parallel runs fn(0..n-1) on workers goroutines.
func parallel(n, workers int, fn func(i int)) {
	var next atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				fn(i)
			}
		})
	}
	wg.Wait()
}
