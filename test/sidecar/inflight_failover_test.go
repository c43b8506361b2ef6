package sidecar_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/redline-dev/redline/internal/keyscheme"
	"github.com/redline-dev/redline/internal/testutil/redistest"
)

// A Sentinel failover that loses the slots of n running streams (the replica was cut off before
// they were taken, then the master killed): the sidecars re-assert them on the promoted replica
// and their streams run on, while 12 clients on three sidecars keep asking for the same key
// (failure mode Closed). The upstream never serves more than n of the key at once, before,
// during or after the switch; once the streams end the clients are served again.
func TestInFlightThroughASentinelFailover(t *testing.T) {
	g := NewWithT(t)
	sg, err := redistest.StartSentinel()
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { _ = sg.Close() })
	e := newEnv(t, "web")
	const n = 4
	e.write(t, inFlightDocument(e.namespace, n, 0))
	up := newGauge(t)
	// A 20 s expiry: renewals every 5 s, and a slot is given up locally only after 12.5 s
	// without one, far longer than the switch takes.
	scs := make([]*sidecar, 3)
	for i, name := range []string{"pod-a", "pod-b", "pod-c"} {
		scs[i] = start(t, name, e, sg.URL(), up.Listener.Addr().String(), true, "--in-flight-expiry=20s")
	}
	ctx := ctxTimeout(t, 5*time.Minute)
	g.Expect(sg.CutReplica(ctx)).To(Succeed()) // from here on, writes reach the master only

	for i := range n {
		resp, err := get(ctx, scs[i%3].proxy+"/hold", "k")
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(resp.StatusCode).To(Equal(http.StatusOK))
		_, err = bufio.NewReader(resp.Body).ReadString('\n')
		g.Expect(err).NotTo(HaveOccurred())
		t.Cleanup(func() { resp.Body.Close() })
	}
	g.Expect(up.cur.Load()).To(Equal(int64(n)))

	cr := newCrowd(ctx, scs)
	g.Eventually(cr.refused.Load, time.Minute, 10*time.Millisecond).Should(BeNumerically(">", 12))

	g.Expect(sg.Master().Stop()).To(Succeed())
	switched := time.Now()
	g.Expect(sg.WaitMaster(ctx, sg.Replica())).To(Succeed())
	t.Logf("the replica was promoted %v after the master was killed", time.Since(switched).Round(time.Millisecond))
	reasserted := func() float64 {
		sum := 0.0
		for _, s := range scs {
			sum += s.metric(t, "redline_sidecar_in_flight_slots_reasserted_total")
		}
		return sum
	}
	g.Eventually(reasserted, 2*time.Minute, 100*time.Millisecond).Should(BeNumerically("==", n))
	nc := sg.Replica().Client("")
	defer nc.Close()
	key := keyscheme.Key(e.namespace, "p", "slots", "k")
	g.Expect(nc.ZCard(ctx, key).Val()).To(Equal(int64(n)), "the promoted replica counts the running streams")
	g.Expect(up.cur.Load()).To(Equal(int64(n)), "the streams ran on through the switch")
	g.Expect(cr.served.Load()).To(BeZero(), "no request took a running stream's place")

	up.release()
	g.Eventually(cr.served.Load, 2*time.Minute, 10*time.Millisecond).Should(BeNumerically(">", 0))
	cr.stop()
	g.Expect(cr.wrong.Load()).To(BeNil())
	g.Expect(up.peak.Load()).To(Equal(int64(n)), "the most requests of the key in progress at once")
	t.Logf("peak %d (limit %d); %d refused, %d served after the streams ended", up.peak.Load(), n, cr.refused.Load(), cr.served.Load())
	g.Eventually(func() int64 { return nc.ZCard(ctx, key).Val() }, time.Minute, 50*time.Millisecond).Should(BeZero(), "every slot went back")
}

// A sidecar stopped (SIGSTOP) past the expiry cannot end anything while stopped: its slot
// expires on Redis's clock and another sidecar's request takes the place, so the application
// serves two of a key limited to one for that time (as documented). Once it runs again its
// renewal finds the place taken: the slot is lost and its request ended, and one is served.
func TestInFlightStoppedSidecarEndsItsRequests(t *testing.T) {
	g := NewWithT(t)
	e := newEnv(t, "web")
	e.write(t, inFlightDocument(e.namespace, 1, 0))
	up := newGauge(t)
	a := start(t, "pod-a", e, shared.URL(), up.Listener.Addr().String(), true, "--in-flight-expiry=2s")
	b := start(t, "pod-b", e, shared.URL(), up.Listener.Addr().String(), true, "--in-flight-expiry=2s")
	ctx := ctxTimeout(t, 3*time.Minute)
	first, err := get(ctx, a.proxy+"/hold", "k")
	g.Expect(err).NotTo(HaveOccurred())
	defer first.Body.Close()
	g.Expect(first.StatusCode).To(Equal(http.StatusOK))
	firstBody := bufio.NewReader(first.Body)
	_, err = firstBody.ReadString('\n')
	g.Expect(err).NotTo(HaveOccurred())

	g.Expect(a.Signal(syscall.SIGSTOP)).To(Succeed())
	stopped := true
	defer func() {
		if stopped {
			_ = a.Signal(syscall.SIGCONT)
		}
	}()
	var second *http.Response
	g.Eventually(func() int {
		resp, err := get(ctx, b.proxy+"/hold", "k")
		if err != nil {
			return 0
		}
		if resp.StatusCode != http.StatusOK {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			return resp.StatusCode
		}
		second = resp
		return resp.StatusCode
	}, 2*time.Minute, 100*time.Millisecond).Should(Equal(http.StatusOK))
	defer second.Body.Close()
	_, err = bufio.NewReader(second.Body).ReadString('\n')
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(up.cur.Load()).To(Equal(int64(2)), "while a is stopped, its request runs beside b's")

	g.Expect(a.Signal(syscall.SIGCONT)).To(Succeed())
	stopped = false
	g.Eventually(up.cur.Load, time.Minute, 20*time.Millisecond).Should(Equal(int64(1)), "a ended its request")
	_, err = io.ReadAll(firstBody)
	g.Expect(err).To(HaveOccurred(), "a's response was cut, not ended as if whole")
	g.Expect(a.metric(t, "redline_sidecar_in_flight_slots_lost_total")).To(BeNumerically("==", 1))
	g.Expect(a.metric(t, "redline_sidecar_in_flight_slots_reasserted_total")).To(BeZero(), "its place was taken")
	g.Expect(b.metric(t, `redline_sidecar_in_flight{policy="p",rule="slots"}`)).To(BeNumerically("==", 1))
}

// crowd is 12 clients asking for key k through scs in turn, each again at once after a 200
// and 20ms after a 429, until stop; anything else is wrong.
type crowd struct {
	served, refused atomic.Int64
	wrong           atomic.Value
	quit            chan struct{}
	wg              sync.WaitGroup
}

func newCrowd(ctx context.Context, scs []*sidecar) *crowd {
	c := &crowd{quit: make(chan struct{})}
	for i := range 12 {
		s := scs[i%len(scs)]
		c.wg.Go(func() {
			for {
				select {
				case <-c.quit:
					return
				default:
				}
				resp, err := get(ctx, s.proxy+"/", "k")
				if err != nil {
					c.wrong.Store(err.Error())
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				switch resp.StatusCode {
				case http.StatusOK:
					c.served.Add(1)
				case http.StatusTooManyRequests:
					c.refused.Add(1)
					time.Sleep(20 * time.Millisecond)
				default:
					c.wrong.Store(fmt.Sprintf("status %d", resp.StatusCode))
					return
				}
			}
		})
	}
	return c
}

// stop ends the clients and waits for them.
func (c *crowd) stop() {
	close(c.quit)
	c.wg.Wait()
}
