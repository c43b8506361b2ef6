package sidecar_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
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

	"github.com/redline-dev/redline/internal/policydoc"
	"github.com/redline-dev/redline/internal/sidecar/checkapi"
	"github.com/redline-dev/redline/internal/sidecar/proxy"
	"github.com/redline-dev/redline/internal/testutil/redistest"
	"github.com/redline-dev/redline/internal/testutil/sidecartest"
)

// Three sidecars, a day's quota in Berlin, on the day its clocks go forward (23 hours): Redis's
// clock is moved there (redistest.StartAt), the sidecars' stay years away. Over every face,
// exactly the quota passes, and every face says the day is 82800 s long and ends at Berlin's
// midnight on Redis's clock: the reset and the retry-after lie between the time to that
// midnight read from Redis before the requests and after them.
func TestCalendarDayOverThreeSidecars(t *testing.T) {
	g := NewWithT(t)
	redisAt, _ := time.Parse(time.RFC3339, "2028-03-26T12:00:00+02:00")
	end, _ := time.Parse(time.RFC3339, "2028-03-27T00:00:00+02:00")
	rs, err := redistest.StartAt(redisAt)
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { _ = rs.Close() })
	const quota = 30
	e := newEnv(t, "checkout")
	e.write(t, sidecartest.DocumentRules(e.namespace, "quota", "checkout", policydoc.Rule{
		Name: "daily", Key: []policydoc.KeyPart{{Header: "x-api-key"}}, Algorithm: "FixedWindow",
		Requests: quota, WindowMS: 26 * 3600 * 1000, Mode: "Enforce",
		Calendar: &policydoc.Calendar{Unit: "Day", Zone: "Europe/Berlin"},
	}))
	up := newUpstream(t)
	var scs []*sidecar
	for i := range 3 {
		scs = append(scs, start(t, fmt.Sprint("pod-", i), e, rs.URL(), up.addr(), true))
	}
	rc := rs.Client("")
	t.Cleanup(func() { _ = rc.Close() })
	redisNow := func() time.Time {
		now, err := rc.Time(context.Background()).Result()
		g.Expect(err).NotTo(HaveOccurred())
		return now
	}
	// within checks seconds s said of the time to end against Redis's clock read before and
	// after: rounded up to whole seconds, as every face rounds.
	within := func(g Gomega, s int64, before, after time.Time) {
		lo, hi := int64(end.Sub(after).Seconds()), int64(math.Ceil(end.Sub(before).Seconds()))
		g.Expect(s).To(And(BeNumerically(">=", lo), BeNumerically("<=", hi)), "seconds to Berlin's midnight")
	}
	const policyField = `"quota/daily";q=30;w=82800`

	t.Run("proxy", func(t *testing.T) {
		g := NewWithT(t)
		key := fmt.Sprint("proxy-", time.Now().UnixNano())
		before := redisNow()
		var mu sync.Mutex
		statuses := map[int]int{}
		var resets, retries []int64
		parallel(3*quota, 9, func(i int) {
			req, _ := http.NewRequest(http.MethodGet, scs[i%3].proxy+"/api/orders", nil)
			req.Header.Set("X-API-Key", key)
			resp, err := httpClient.Do(req)
			g.Expect(err).NotTo(HaveOccurred())
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			g.Expect(resp.Header.Get("RateLimit-Policy")).To(Equal(policyField))
			var r, tt int64
			_, err = fmt.Sscanf(resp.Header.Get("RateLimit"), `"quota/daily";r=%d;t=%d`, &r, &tt)
			g.Expect(err).NotTo(HaveOccurred(), resp.Header.Get("RateLimit"))
			mu.Lock()
			defer mu.Unlock()
			statuses[resp.StatusCode]++
			resets = append(resets, tt)
			if resp.StatusCode == http.StatusTooManyRequests {
				ra, _ := strconv.ParseInt(resp.Header.Get("Retry-After"), 10, 64)
				var refusal proxy.Refusal
				g.Expect(json.Unmarshal(body, &refusal)).To(Succeed())
				g.Expect(refusal.RetryAfterSeconds).To(Equal(ra))
				retries = append(retries, ra)
			}
		})
		after := redisNow()
		g.Expect(statuses).To(Equal(map[int]int{200: quota, 429: 2 * quota}))
		g.Expect(up.hits.Load()).To(BeEquivalentTo(quota))
		for _, s := range append(resets, retries...) {
			within(g, s, before, after)
		}
	})

	t.Run("checkAPI", func(t *testing.T) {
		g := NewWithT(t)
		key := fmt.Sprint("check-", time.Now().UnixNano())
		before := redisNow()
		var allowed atomic.Int64
		var mu sync.Mutex
		var secs []int64
		parallel(3*quota, 9, func(i int) {
			body := fmt.Sprintf(`{"policy":"quota","rule":"daily","key":[%q]}`, key)
			resp, err := httpClient.Post(scs[i%3].check+checkapi.Path, "application/json", bytes.NewBufferString(body))
			g.Expect(err).NotTo(HaveOccurred())
			defer resp.Body.Close()
			var d checkapi.Response
			g.Expect(json.NewDecoder(resp.Body).Decode(&d)).To(Succeed())
			g.Expect(d.Results).To(HaveLen(1))
			g.Expect(d.Results[0].WindowSeconds).To(BeEquivalentTo(23 * 3600))
			mu.Lock()
			defer mu.Unlock()
			secs = append(secs, d.Results[0].ResetSeconds)
			if d.Allowed {
				allowed.Add(1)
			} else {
				secs = append(secs, d.RetryAfterSeconds)
			}
		})
		after := redisNow()
		g.Expect(allowed.Load()).To(BeEquivalentTo(quota))
		for _, s := range secs {
			within(g, s, before, after)
		}
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
		before := redisNow()
		var ok atomic.Int64
		var mu sync.Mutex
		var secs []int64
		parallel(3*quota, 9, func(i int) {
			resp, err := clients[i%3].ShouldRateLimit(ctxTimeout(t, 30*time.Second), &rlsv3.RateLimitRequest{
				Domain: "redline",
				Descriptors: []*rlv3.RateLimitDescriptor{{Entries: []*rlv3.RateLimitDescriptor_Entry{
					{Key: "policy", Value: "quota"}, {Key: "rule", Value: "daily"}, {Key: "api_key", Value: key}}}},
			})
			g.Expect(err).NotTo(HaveOccurred())
			st := resp.Statuses[0]
			g.Expect(st.CurrentLimit.Unit).To(Equal(rlsv3.RateLimitResponse_RateLimit_DAY))
			g.Expect(st.CurrentLimit.RequestsPerUnit).To(BeEquivalentTo(quota))
			mu.Lock()
			defer mu.Unlock()
			secs = append(secs, int64(math.Ceil(st.DurationUntilReset.AsDuration().Seconds())))
			if resp.OverallCode == rlsv3.RateLimitResponse_OK {
				ok.Add(1)
			}
		})
		after := redisNow()
		g.Expect(ok.Load()).To(BeEquivalentTo(quota))
		for _, s := range secs {
			within(g, s, before, after)
		}
	})
}
