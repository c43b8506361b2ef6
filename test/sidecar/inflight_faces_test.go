package sidecar_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	. "github.com/onsi/gomega"

	"github.com/redline-dev/redline/internal/keyscheme"
	"github.com/redline-dev/redline/internal/redisconn"
	"github.com/redline-dev/redline/internal/sidecar/checkapi"
	"github.com/redline-dev/redline/internal/testutil/redistest/redisclient"
)

// checkSlot posts body to s's decision API and decodes a 200 answer; other statuses are
// returned with a nil answer.
func checkSlot(s *sidecar, body string) (*checkapi.Response, int, error) {
	resp, err := httpClient.Post(s.check+checkapi.Path, "application/json", bytes.NewBufferString(body))
	if err != nil {
		return nil, 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, resp.Body)
		return nil, resp.StatusCode, nil
	}
	var d checkapi.Response
	return &d, resp.StatusCode, json.NewDecoder(resp.Body).Decode(&d)
}

// serving counts the requests of the key being served at every instant, and the most at once.
type serving struct{ cur, peak atomic.Int64 }

func (s *serving) begin() {
	c := s.cur.Add(1)
	for p := s.peak.Load(); c > p && !s.peak.CompareAndSwap(p, c); p = s.peak.Load() {
	}
}

// Two sidecars, one key of 8 slots, reached at once through the decision API (acquire, renew
// while served, release) and through Envoy's rate limit service (a descriptor at the start,
// negative hits at stream done): 2 x 24 clients of each face. The requests served at once reach
// 8 and never exceed it; when they end every client gets its turn and no slot is left.
func TestInFlightThroughTheDecisionFaces(t *testing.T) {
	g := NewWithT(t)
	e := newEnv(t, "web")
	const n = 8
	e.write(t, inFlightDocument(e.namespace, n, 0))
	up := newGauge(t)
	scs := []*sidecar{
		start(t, "pod-a", e, shared.URL(), up.Listener.Addr().String(), true),
		start(t, "pod-b", e, shared.URL(), up.Listener.Addr().String(), true),
	}
	rlsClients := []rlsv3.RateLimitServiceClient{rlsClient(t, scs[0].grpc), rlsClient(t, scs[1].grpc)}
	for _, s := range scs {
		g.Expect(inFlight(t, s)).To(BeZero(), "%s's gauge before any request", s.name)
	}
	var on serving
	gate := make(chan struct{})
	var done, refused atomic.Int64
	var wrong atomic.Value
	var wg sync.WaitGroup
	// viaCheck serves one request through s's decision API.
	viaCheck := func(s *sidecar) {
		for {
			d, code, err := checkSlot(s, `{"policy":"p","rule":"slots","key":["tenant"]}`)
			if err != nil || code != http.StatusOK {
				wrong.Store(fmt.Sprintf("check: %d %v", code, err))
				return
			}
			if !d.Allowed {
				refused.Add(1)
				if d.Headers["Retry-After"] != "1" || d.Headers["RateLimit-Policy"] != `"p/slots";q=8;qu="concurrent-requests"` {
					wrong.Store(fmt.Sprintf("refusal fields: %v", d.Headers))
				}
				time.Sleep(20 * time.Millisecond)
				continue
			}
			on.begin()
			renew := time.NewTicker(time.Second)
			for waiting := true; waiting; {
				select {
				case <-gate:
					waiting = false
				case <-renew.C:
					if _, code, err := checkSlot(s, `{"renew":{"slot":"`+d.Slot.ID+`"}}`); err != nil || code != http.StatusOK {
						wrong.Store(fmt.Sprintf("renew: %d %v", code, err))
					}
				}
			}
			renew.Stop()
			on.cur.Add(-1)
			if r, code, err := checkSlot(s, `{"release":{"slot":"`+d.Slot.ID+`"}}`); err != nil || code != http.StatusOK || r.Released.Slots != 1 {
				wrong.Store(fmt.Sprintf("release: %d %v", code, err))
			}
			done.Add(1)
			return
		}
	}
	// viaEnvoy serves one request as Envoy does through c: a stream-done call with negative
	// hits ends every request, a refused one's too.
	viaEnvoy := func(c rlsv3.RateLimitServiceClient) {
		d := &rlv3.RateLimitDescriptor{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "policy", Value: "p"}, {Key: "rule", Value: "slots"}, {Key: "x-key", Value: "tenant"}}}
		streamDone := func() {
			doneDesc := &rlv3.RateLimitDescriptor{Entries: d.Entries, IsNegativeHits: true}
			if _, err := c.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*rlv3.RateLimitDescriptor{doneDesc}}); err != nil {
				wrong.Store(err.Error())
			}
		}
		for {
			resp, err := c.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*rlv3.RateLimitDescriptor{d}})
			if err != nil {
				wrong.Store(err.Error())
				return
			}
			if resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT {
				refused.Add(1)
				streamDone()
				time.Sleep(20 * time.Millisecond)
				continue
			}
			on.begin()
			<-gate
			on.cur.Add(-1)
			streamDone()
			done.Add(1)
			return
		}
	}
	for i := range 2 * 24 {
		wg.Go(func() { viaCheck(scs[i%2]) })
		wg.Go(func() { viaEnvoy(rlsClients[i%2]) })
	}
	g.Eventually(on.cur.Load, time.Minute, 10*time.Millisecond).Should(Equal(int64(n)))
	g.Eventually(refused.Load, time.Minute, 10*time.Millisecond).Should(BeNumerically(">", 4*24))
	g.Expect(on.cur.Load()).To(Equal(int64(n)))
	held := 0.0
	for _, s := range scs {
		held += inFlight(t, s)
	}
	g.Expect(held).To(BeNumerically("==", n), "the per-rule gauges sum to the requests in progress")
	close(gate)
	wg.Wait()
	g.Expect(wrong.Load()).To(BeNil())
	g.Expect(done.Load()).To(Equal(int64(4 * 24)))
	g.Expect(on.peak.Load()).To(Equal(int64(n)), "the most requests of the key served at once")
	t.Logf("max served at once %d (limit %d) through /v1/check and Envoy's face; %d refusals while full", on.peak.Load(), n, refused.Load())
	c := redisclient.New(t, shared.URL(), redisconn.Options{ReadTimeout: 10 * time.Second})
	g.Expect(c.ZCard(context.Background(), keyscheme.Key(e.namespace, "p", "slots", "tenant")).Val()).To(BeZero(), "every slot went back")
	for _, s := range scs {
		g.Expect(s.metric(t, "redline_sidecar_in_flight_slots")).To(BeZero())
		g.Expect(s.metric(t, `redline_sidecar_in_flight_kept_slots{face="check"}`)).To(BeZero())
		g.Expect(inFlight(t, s)).To(BeZero())
	}
}

// A decision API client that neither renews nor releases loses its slot after its lease (the
// in-flight expiry); the sidecar counts it as expired.
func TestInFlightCheckClientThatNeverComesBack(t *testing.T) {
	g := NewWithT(t)
	e := newEnv(t, "web")
	e.write(t, inFlightDocument(e.namespace, 1, 0))
	up := newGauge(t)
	s := start(t, "pod-a", e, shared.URL(), up.Listener.Addr().String(), true, "--in-flight-expiry=2s")
	d, _, err := checkSlot(s, `{"policy":"p","rule":"slots","key":["k"]}`)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(d.Slot).NotTo(BeNil())
	taken := time.Now()
	d2, _, err := checkSlot(s, `{"policy":"p","rule":"slots","key":["k"]}`)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(d2.Allowed).To(BeFalse())
	g.Eventually(func() bool {
		d, _, err := checkSlot(s, `{"policy":"p","rule":"slots","key":["k"]}`)
		return err == nil && d.Allowed
	}, time.Minute, 100*time.Millisecond).Should(BeTrue())
	g.Expect(time.Since(taken)).To(BeNumerically(">=", 2*time.Second), "released only after its lease")
	_, code, err := checkSlot(s, `{"renew":{"slot":"`+d.Slot.ID+`"}}`)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(code).To(Equal(http.StatusNotFound))
	g.Expect(s.metric(t, `redline_sidecar_in_flight_leases_expired_total{face="check"}`)).To(BeNumerically("==", 1))
}

// inFlight is s's gauge of the requests of rule p/slots in progress through it. It shows, at 0,
// from the rule's load on: a sidecar that holds no slot when the key is full (all of them may
// run through the other) counts 0 in the sum, and an absent series (metric's -1) fails it.
func inFlight(t testing.TB, s *sidecar) float64 {
	return s.metric(t, `redline_sidecar_in_flight{policy="p",rule="slots"}`)
}
