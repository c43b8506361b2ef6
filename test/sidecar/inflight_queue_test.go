package sidecar_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/redline-dev/redline/internal/policydoc"
)

// queueDocument is a policy of app=web with an in-flight rule "slots" of n per X-Key whose
// requests wait in a queue of size per sidecar, each up to timeout.
func queueDocument(namespace string, n, size int64, timeout time.Duration) []byte {
	p := policydoc.Policy{
		Name: "p", Generation: 1, FailureMode: "Closed",
		Selector: policydoc.Selector{MatchLabels: map[string]string{"app": "web"}},
		Rules: []policydoc.Rule{{Name: "slots", Key: []policydoc.KeyPart{{Header: "x-key"}}, InFlight: n, Mode: "Enforce",
			Queue: &policydoc.Queue{Size: size, TimeoutMS: timeout.Milliseconds()}}},
	}
	_, data, err := policydoc.Build(namespace, []policydoc.Policy{p}, map[string]string{})
	if err != nil {
		panic(err)
	}
	return data
}

// gate is an upstream whose every request, named by its X-Req header, is held until the test
// lets it go (finish); it counts the requests it serves at once, and the most, on its own.
type gate struct {
	cur, peak atomic.Int64
	arrived   chan string
	mu        sync.Mutex
	release   map[string]chan struct{}
	*httptest.Server
}

func newGate(t *testing.T) *gate {
	u := &gate{arrived: make(chan string, 64), release: map[string]chan struct{}{}}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c := u.cur.Add(1)
		for p := u.peak.Load(); c > p && !u.peak.CompareAndSwap(p, c); p = u.peak.Load() {
		}
		id := r.Header.Get("X-Req")
		u.arrived <- id
		select {
		case <-u.gateOf(id):
		case <-r.Context().Done():
		}
		// Counted out before the response ends, so before the sidecar gives the slot back.
		u.cur.Add(-1)
		_, _ = io.WriteString(w, id)
	}))
	t.Cleanup(u.Close)
	return u
}

func (u *gate) gateOf(id string) chan struct{} {
	u.mu.Lock()
	defer u.mu.Unlock()
	ch := u.release[id]
	if ch == nil {
		ch = make(chan struct{})
		u.release[id] = ch
	}
	return ch
}

func (u *gate) finish(id string) { close(u.gateOf(id)) }

// noTimeout is a client whose requests wait as long as the test lets them: a queued request
// waits on the test's channels, not a clock.
var noTimeout = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}

// queued sends request id of key k to a sidecar in the background; its status (or error) is
// sent on the channel returned.
func queued(ctx context.Context, url, id string) <-chan string {
	out := make(chan string, 1)
	go func() {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url+"/", nil)
		if err != nil {
			out <- err.Error()
			return
		}
		req.Header.Set("X-Key", "tenant")
		req.Header.Set("X-Req", id)
		resp, err := noTimeout.Do(req)
		if err != nil {
			out <- "error: " + err.Error()
			return
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		out <- fmt.Sprintf("%d %s", resp.StatusCode, body)
	}()
	return out
}

// N=2 with a queue of 4, over two sidecars: the upstream never serves more than 2 at once and
// does serve 2; the requests queued in one sidecar are served in the order they came; a request
// past a full queue is refused at once with the concurrent-requests fields; a waiter whose
// client goes away frees its place in the queue for another. Every step waits on the upstream's
// channels and the sidecars' gauges, never on a clock.
func TestInFlightQueueOverTwoSidecars(t *testing.T) {
	g := NewWithT(t)
	e := newEnv(t, "web")
	e.write(t, queueDocument(e.namespace, 2, 4, 10*time.Minute))
	up := newGate(t)
	a := start(t, "pod-a", e, shared.URL(), up.Listener.Addr().String(), true)
	b := start(t, "pod-b", e, shared.URL(), up.Listener.Addr().String(), true)
	ctx := ctxTimeout(t, 5*time.Minute)
	const gauge = `redline_sidecar_in_flight_queued{policy="p",rule="slots"}`
	waitQueued := func(s *sidecar, sample string, n float64) {
		g.Eventually(func() float64 { return s.metric(t, sample) }, time.Minute, 5*time.Millisecond).Should(Equal(n), s.name+" queued")
	}
	results := map[string]<-chan string{}

	// Two served at once fill the key.
	for _, id := range []string{"a1", "a2"} {
		results[id] = queued(ctx, a.proxy, id)
		g.Eventually(up.arrived, time.Minute).Should(Receive(Equal(id)))
	}
	// Four wait in a's queue, in this order; the second's client will go away.
	cancelCtx, cancel := context.WithCancel(ctx)
	for i, id := range []string{"qa1", "qa2", "qa3", "qa4"} {
		c := ctx
		if id == "qa2" {
			c = cancelCtx
		}
		results[id] = queued(c, a.proxy, id)
		waitQueued(a, gauge, float64(i+1))
	}
	// A fifth finds a's queue full: refused at once, as without a queue.
	resp, err := get(ctx, a.proxy+"/", "tenant")
	g.Expect(err).NotTo(HaveOccurred())
	resp.Body.Close()
	g.Expect(resp.StatusCode).To(Equal(http.StatusTooManyRequests))
	g.Expect(resp.Header.Get("Retry-After")).To(Equal("1"))
	g.Expect(resp.Header.Get("RateLimit-Policy")).To(Equal(`"p/slots";q=2;qu="concurrent-requests"`))
	g.Expect(resp.Header.Get("RateLimit")).To(Equal(`"p/slots";r=0;t=1`))
	// Two wait in b's queue.
	for i, id := range []string{"qb1", "qb2"} {
		results[id] = queued(ctx, b.proxy, id)
		waitQueued(b, gauge, float64(i+1))
	}
	// The client of qa2 goes away: it leaves the queue, and its place takes another.
	cancel()
	g.Eventually(results["qa2"], time.Minute).Should(Receive(HavePrefix("error:")))
	waitQueued(a, gauge, 3)
	results["qa5"] = queued(ctx, a.proxy, "qa5")
	waitQueued(a, gauge, 4)

	// Let the served requests end one at a time: each end lets one waiter in.
	serving := []string{"a1", "a2"}
	var order []string
	for len(order) < 6 {
		up.finish(serving[0])
		g.Eventually(results[serving[0]], time.Minute).Should(Receive(Equal("200 " + serving[0])))
		serving = serving[1:]
		var next string
		g.Eventually(up.arrived, time.Minute).Should(Receive(&next))
		order = append(order, next)
		serving = append(serving, next)
	}
	for _, id := range serving {
		up.finish(id)
		g.Eventually(results[id], time.Minute).Should(Receive(Equal("200 " + id)))
	}
	t.Logf("served after a1 and a2, in order: %v; most at once at the upstream: %d; Redis round trips for 8 served and 2 refused: %v (a), %v (b)",
		order, up.peak.Load(), a.metric(t, "redline_sidecar_redis_round_trips_total"), b.metric(t, "redline_sidecar_redis_round_trips_total"))

	g.Expect(up.peak.Load()).To(Equal(int64(2)), "the most requests of the key at the upstream at once")
	g.Expect(order).To(ConsistOf("qa1", "qa3", "qa4", "qa5", "qb1", "qb2"))
	g.Expect(only(order, "qa")).To(Equal([]string{"qa1", "qa3", "qa4", "qa5"}), "a's waiters in the order they came")
	g.Expect(only(order, "qb")).To(Equal([]string{"qb1", "qb2"}), "b's waiters in the order they came")
	waitQueued(a, gauge, 0)
	waitQueued(b, gauge, 0)
	for _, s := range []*sidecar{a, b} {
		g.Expect(s.metric(t, "redline_sidecar_in_flight_slots")).To(BeZero())
	}
	g.Expect(a.metric(t, `redline_sidecar_in_flight_decisions_total{policy="p",result="refused",rule="slots"}`)).To(BeNumerically(">=", 2),
		"the request past the full queue and the one whose client went away")
}

// A waiter whose timeout passes before a slot frees is refused as a request without a queue
// is, with the concurrent-requests fields, and leaves the queue.
func TestInFlightQueueTimeoutRefuses(t *testing.T) {
	g := NewWithT(t)
	e := newEnv(t, "web")
	e.write(t, queueDocument(e.namespace, 1, 4, 50*time.Millisecond))
	up := newGate(t)
	a := start(t, "pod-a", e, shared.URL(), up.Listener.Addr().String(), true)
	ctx := ctxTimeout(t, 5*time.Minute)
	held := queued(ctx, a.proxy, "held")
	g.Eventually(up.arrived, time.Minute).Should(Receive(Equal("held")))
	resp, err := get(ctx, a.proxy+"/", "tenant")
	g.Expect(err).NotTo(HaveOccurred())
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	g.Expect(resp.StatusCode).To(Equal(http.StatusTooManyRequests))
	g.Expect(string(body)).To(ContainSubstring(`"too_many_in_flight"`))
	g.Expect(resp.Header.Get("Retry-After")).To(Equal("1"))
	g.Expect(resp.Header.Get("RateLimit")).To(Equal(`"p/slots";r=0;t=1`))
	g.Expect(a.metric(t, `redline_sidecar_in_flight_queued{policy="p",rule="slots"}`)).To(BeZero())
	up.finish("held")
	g.Eventually(held, time.Minute).Should(Receive(Equal("200 held")))
}

// only is the ids of order that start with prefix, in order.
func only(order []string, prefix string) []string {
	var out []string
	for _, id := range order {
		if strings.HasPrefix(id, prefix) {
			out = append(out, id)
		}
	}
	return out
}
