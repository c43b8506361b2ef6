package sidecar_test

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/redline-dev/redline/internal/keyscheme"
	"github.com/redline-dev/redline/internal/policydoc"
	"github.com/redline-dev/redline/internal/redisconn"
	"github.com/redline-dev/redline/internal/testutil/redistest/redisclient"
)

// letFinish is the sample of the count of rule p/slots's slots lost whose request ran on.
const letFinish = `redline_sidecar_in_flight_slots_lost_let_finish_total{policy="p",rule="slots"}`

// A slot whose place another request took while Redis did not count it (a failover that lost
// it, then a request on the new master; here done in one step) is lost at the next renewal.
// With onSlotLost End (the default) its request is ended: the application sees it go and never
// serves it whole. With Finish it runs to its end, uncounted: the application serves it whole
// beside the request that took its place, the one instant over the limit the choice risks.
func TestInFlightLostSlot(t *testing.T) {
	for _, onLost := range []string{"End", "Finish"} {
		t.Run(onLost, func(t *testing.T) {
			g := NewWithT(t)
			e := newEnv(t, "web")
			doc := inFlightDocument(e.namespace, 1, 0)
			if onLost == "Finish" {
				doc = letFinishDocument(t, doc)
			}
			e.write(t, doc)
			up := newGauge(t)
			s := start(t, "pod-a", e, shared.URL(), up.Listener.Addr().String(), true, "--in-flight-expiry=2s")

			resp, err := get(ctxTimeout(t, time.Minute), s.proxy+"/hold", "k")
			g.Expect(err).NotTo(HaveOccurred())
			defer resp.Body.Close()
			g.Expect(resp.StatusCode).To(Equal(http.StatusOK))
			body := bufio.NewReader(resp.Body)
			_, err = body.ReadString('\n')
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(up.cur.Load()).To(Equal(int64(1)))

			c := redisclient.New(t, shared.URL(), redisconn.Options{ReadTimeout: 10 * time.Second})
			g.Expect(c.Eval(context.Background(), `local t = redis.call('TIME')
redis.call('DEL', KEYS[1])
redis.call('ZADD', KEYS[1], tonumber(t[1]) * 1000 + 60000, 'taker')
return redis.call('PEXPIRE', KEYS[1], 60000)`, []string{keyscheme.Key(e.namespace, "p", "slots", "k")}).Err()).To(Succeed())
			g.Eventually(func() float64 { return s.metric(t, "redline_sidecar_in_flight_slots_lost_total") }, time.Minute, 20*time.Millisecond).
				Should(BeNumerically("==", 1))

			if onLost == "End" {
				// The upstream still holds the response: only the sidecar ending the request ends it.
				g.Eventually(up.cur.Load, time.Minute, 20*time.Millisecond).Should(BeZero())
				g.Expect(s.metric(t, letFinish)).To(BeNumerically("==", -1), "no count of slots let finish for a rule that ends them")
				_, err = io.ReadAll(body)
				g.Expect(err).To(HaveOccurred(), "the response was cut, not ended as if whole")
				g.Expect(up.whole.Load()).To(BeZero())
				g.Expect(s.metric(t, "redline_sidecar_in_flight_slots")).To(BeZero())
				return
			}
			g.Eventually(func() float64 { return s.metric(t, letFinish) }, time.Minute, 20*time.Millisecond).Should(BeNumerically("==", 1))
			g.Expect(s.metric(t, "redline_sidecar_in_flight_slots")).To(BeZero(), "a slot let finish is no longer renewed")
			g.Expect(up.cur.Load()).To(Equal(int64(1)), "the request runs on")
			g.Expect(statusOf(s.proxy+"/")).To(Equal(http.StatusTooManyRequests), "the key is full in Redis: its place is another's")
			up.release()
			rest, err := io.ReadAll(body)
			g.Expect(err).NotTo(HaveOccurred(), "the response ran to its end")
			g.Expect(strings.Count(string(rest), "data: more")).To(Equal(4))
			g.Expect(up.whole.Load()).To(Equal(int64(1)))
			g.Expect(up.peak.Load()).To(Equal(int64(1)))
			g.Expect(statusOf(s.proxy+"/")).To(Equal(http.StatusTooManyRequests), "its end gave back nothing of the place another holds")
		})
	}
}

// letFinishDocument is doc, an in-flight document, with its rules' onSlotLost set to Finish.
func letFinishDocument(t *testing.T, doc []byte) []byte {
	t.Helper()
	d, err := policydoc.Parse(doc)
	if err != nil {
		t.Fatal(err)
	}
	for i := range d.Policies {
		for j := range d.Policies[i].Rules {
			if d.Policies[i].Rules[j].InFlight != 0 {
				d.Policies[i].Rules[j].OnSlotLost = policydoc.SlotLostFinish
			}
		}
	}
	_, data, err := policydoc.Build(d.Namespace, d.Policies, d.Scripts)
	if err != nil {
		t.Fatal(err)
	}
	return data
}
