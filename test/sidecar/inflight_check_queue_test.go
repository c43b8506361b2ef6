package sidecar_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/redline-dev/redline/internal/sidecar/checkapi"
)

// checkInBackground posts body to s's decision API under ctx and sends its answer, or an
// error, on the channel returned: a check of a full key with a queue waits for its turn.
func checkInBackground(ctx context.Context, s *sidecar, body string) <-chan string {
	out := make(chan string, 1)
	go func() {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.check+checkapi.Path, bytes.NewBufferString(body))
		if err != nil {
			out <- err.Error()
			return
		}
		resp, err := noTimeout.Do(req)
		if err != nil {
			out <- "error: " + err.Error()
			return
		}
		defer resp.Body.Close()
		var d checkapi.Response
		if err := json.NewDecoder(resp.Body).Decode(&d); err != nil {
			out <- "decoding: " + err.Error()
			return
		}
		if d.Allowed && d.Slot != nil {
			out <- "slot " + d.Slot.ID
			return
		}
		out <- fmt.Sprintf("%d allowed=%v", resp.StatusCode, d.Allowed)
	}()
	return out
}

// /v1/check of a rule with a queue waits for a slot of its full key in the sidecar's one
// queue, in the same line as the proxy's requests: N=1, queue of 4, --max-check-conns 4 (so
// at most 2 checks wait). A check past the face's share is refused at once while a proxied
// request still waits; a check whose client goes away leaves the queue; each release lets the
// next in line in, check or proxied request, in the order they came. Every step waits on the
// sidecar's gauge and the upstream's channels; one sleep lets the face's read timeout pass.
func TestInFlightQueueThroughCheck(t *testing.T) {
	g := NewWithT(t)
	e := newEnv(t, "web")
	e.write(t, queueDocument(e.namespace, 1, 4, 10*time.Minute))
	up := newGate(t)
	a := start(t, "pod-a", e, shared.URL(), up.Listener.Addr().String(), true, "--max-check-conns", "4", "--read-header-timeout", "1s")
	ctx := ctxTimeout(t, 5*time.Minute)
	const gauge = `redline_sidecar_in_flight_queued{policy="p",rule="slots"}`
	waitQueued := func(n float64) {
		g.Eventually(func() float64 { return a.metric(t, gauge) }, time.Minute, 5*time.Millisecond).Should(Equal(n), "queued")
	}
	const hit = `{"policy":"p","rule":"slots","key":["tenant"]}`
	release := func(answer string) {
		id, ok := bytes.CutPrefix([]byte(answer), []byte("slot "))
		g.Expect(ok).To(BeTrue(), "an answer holding a slot: %s", answer)
		r, code, err := checkSlot(a, `{"release":{"slot":"`+string(id)+`"}}`)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(code).To(Equal(http.StatusOK))
		g.Expect(r.Released.Slots).To(Equal(1))
	}

	first := <-checkInBackground(ctx, a, hit)
	g.Expect(first).To(HavePrefix("slot "), "the first check takes the key's one slot at once")

	second := checkInBackground(ctx, a, hit)
	waitQueued(1)
	// The check face reads a request within --read-header-timeout (1s here: its ReadTimeout);
	// a check that waits past it still waits (net/http lifts the deadline once the body is
	// read). The sleep lets that time pass; it synchronizes nothing.
	time.Sleep(2 * time.Second)
	g.Expect(a.metric(t, gauge)).To(Equal(1.0), "a check waiting past the face's read timeout")
	g.Expect(second).NotTo(Receive(), "a check waiting past the face's read timeout")
	proxied := queued(ctx, a.proxy, "p1")
	waitQueued(2)
	goneCtx, gone := context.WithCancel(ctx)
	third := checkInBackground(goneCtx, a, hit)
	waitQueued(3)

	// Two checks wait: the face's share (half of 4 connections) is full, not the key's queue.
	d, code, err := checkSlot(a, hit)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(code).To(Equal(http.StatusOK))
	g.Expect(d.Allowed).To(BeFalse(), "a check past the face's share is refused at once")
	g.Expect(d.RetryAfterSeconds).To(Equal(int64(1)))
	g.Expect(d.Headers["RateLimit-Policy"]).To(Equal(`"p/slots";q=1;qu="concurrent-requests"`))

	// The third check's client goes away: it leaves the queue.
	gone()
	g.Eventually(third, time.Minute).Should(Receive(HavePrefix("error:")))
	waitQueued(2)

	// Each release lets the next in line in: the second check, then the proxied request.
	release(first)
	var answer string
	g.Eventually(second, time.Minute).Should(Receive(&answer))
	g.Expect(answer).To(HavePrefix("slot "), "the check that came first gets the slot")
	waitQueued(1)
	g.Consistently(up.arrived).ShouldNot(Receive(), "the proxied request still waits while the check holds the slot")
	release(answer)
	g.Eventually(up.arrived, time.Minute).Should(Receive(Equal("p1")))
	up.finish("p1")
	g.Eventually(proxied, time.Minute).Should(Receive(Equal("200 p1")))
	waitQueued(0)
	g.Eventually(func() float64 { return a.metric(t, "redline_sidecar_in_flight_slots") }, time.Minute, 5*time.Millisecond).Should(BeZero())
}
