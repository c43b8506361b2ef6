package sidecar_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/redline-dev/redline/internal/keyscheme"
	"github.com/redline-dev/redline/internal/policydoc"
	"github.com/redline-dev/redline/internal/redisconn"
	"github.com/redline-dev/redline/internal/testutil/redistest/redisclient"
)

// inFlightDocument is a policy of app=web with an in-flight rule "slots" of n per X-Key, and
// when window > 0 a rule "window" of window requests a minute per X-Key beside it.
func inFlightDocument(namespace string, n, window int64) []byte {
	p := policydoc.Policy{
		Name: "p", Generation: 1, FailureMode: "Closed",
		Selector: policydoc.Selector{MatchLabels: map[string]string{"app": "web"}},
		Rules:    []policydoc.Rule{{Name: "slots", Key: []policydoc.KeyPart{{Header: "x-key"}}, InFlight: n, Mode: "Enforce"}},
	}
	if window > 0 {
		p.Rules = append(p.Rules, policydoc.Rule{Name: "window", Key: []policydoc.KeyPart{{Header: "x-key"}},
			Algorithm: "SlidingWindowLog", Requests: window, WindowMS: 60_000, Mode: "Enforce"})
	}
	_, data, err := policydoc.Build(namespace, []policydoc.Policy{p}, map[string]string{})
	if err != nil {
		panic(err)
	}
	return data
}

// gauge is an upstream that counts the requests it serves at every instant and the most at
// once. /hold streams a first chunk and holds the response until hold is closed, then ends it;
// /stream streams a few chunks over a few milliseconds; /fail drops the connection. whole counts
// the /hold responses it wrote to their end with their request still wanted (not cut).
type gauge struct {
	cur, peak atomic.Int64
	whole     atomic.Int64
	hold      chan struct{}
	holdOnce  sync.Once
	*httptest.Server
}

func newGauge(t *testing.T) *gauge {
	u := &gauge{hold: make(chan struct{})}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c := u.cur.Add(1)
		defer u.cur.Add(-1)
		for p := u.peak.Load(); c > p && !u.peak.CompareAndSwap(p, c); p = u.peak.Load() {
		}
		switch r.URL.Path {
		case "/fail":
			conn, _, err := http.NewResponseController(w).Hijack()
			if err == nil {
				_ = conn.Close()
			}
			return
		case "/hold":
			w.Header().Set("Content-Type", "text/event-stream")
			_, _ = io.WriteString(w, "data: first\n\n")
			w.(http.Flusher).Flush()
			select {
			case <-u.hold:
			case <-r.Context().Done():
			}
		}
		for range 4 {
			_, _ = io.WriteString(w, "data: more\n\n")
			w.(http.Flusher).Flush()
			time.Sleep(2 * time.Millisecond)
		}
		if r.URL.Path == "/hold" && r.Context().Err() == nil {
			u.whole.Add(1)
		}
	}))
	t.Cleanup(u.Close)
	t.Cleanup(u.release)
	return u
}

func (u *gauge) release() { u.holdOnce.Do(func() { close(u.hold) }) }

func get(ctx context.Context, url, key string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("X-Key", key)
	return httpClient.Do(req)
}

// 3 sidecars x 64 clients on one key of 8 slots, each client streaming one long response: the
// upstream serves 8 at once and never more; the others are refused at once with 429,
// Retry-After 1 and the concurrent-requests fields; once the streams end every client gets
// its turn, and no slot is left behind.
func TestInFlightAcrossThreeSidecars(t *testing.T) {
	g := NewWithT(t)
	e := newEnv(t, "web")
	const n = 8
	e.write(t, inFlightDocument(e.namespace, n, 0))
	up := newGauge(t)
	scs := []*sidecar{
		start(t, "pod-a", e, shared.URL(), up.Listener.Addr().String(), true),
		start(t, "pod-b", e, shared.URL(), up.Listener.Addr().String(), true),
		start(t, "pod-c", e, shared.URL(), up.Listener.Addr().String(), true),
	}
	var done, refused atomic.Int64
	var wrong atomic.Value
	var wg sync.WaitGroup
	for i := range 3 * 64 {
		s := scs[i%3]
		wg.Go(func() {
			for {
				resp, err := get(context.Background(), s.proxy+"/hold", "tenant")
				if err != nil {
					wrong.Store(err.Error())
					return
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				switch resp.StatusCode {
				case http.StatusOK:
					done.Add(1)
					return
				case http.StatusTooManyRequests:
					refused.Add(1)
					if resp.Header.Get("Retry-After") != "1" || resp.Header.Get("RateLimit-Policy") != `"p/slots";q=8;qu="concurrent-requests"` {
						wrong.Store(fmt.Sprintf("refusal fields: %v", resp.Header))
					}
					time.Sleep(20 * time.Millisecond)
				default:
					wrong.Store(fmt.Sprintf("status %d: %s", resp.StatusCode, body))
					return
				}
			}
		})
	}
	// The upstream reaches n streams at once (no slot leaks), and the others wait refused.
	g.Eventually(up.cur.Load, time.Minute, 10*time.Millisecond).Should(Equal(int64(n)))
	g.Eventually(refused.Load, time.Minute, 10*time.Millisecond).Should(BeNumerically(">", 3*64))
	g.Expect(up.cur.Load()).To(Equal(int64(n)))
	up.release()
	wg.Wait()
	g.Expect(wrong.Load()).To(BeNil())
	g.Expect(done.Load()).To(Equal(int64(3 * 64)))
	g.Expect(up.peak.Load()).To(Equal(int64(n)), "the most requests of the key in progress at once")
	t.Logf("max concurrent at the upstream %d (limit %d); %d refusals while full", up.peak.Load(), n, refused.Load())
	var allowed, refusals float64
	for _, s := range scs {
		allowed += s.metric(t, `redline_sidecar_in_flight_decisions_total{policy="p",result="allowed",rule="slots"}`)
		refusals += s.metric(t, `redline_sidecar_in_flight_decisions_total{policy="p",result="refused",rule="slots"}`)
		g.Expect(s.metric(t, "redline_sidecar_in_flight_slots")).To(BeZero())
	}
	g.Expect(allowed).To(BeNumerically("==", 3*64))
	g.Expect(refusals).To(BeNumerically("==", refused.Load()))
	c := redisclient.New(t, shared.URL(), redisconn.Options{ReadTimeout: 10 * time.Second})
	g.Expect(c.ZCard(context.Background(), keyscheme.Key(e.namespace, "p", "slots", "tenant")).Val()).To(BeZero(), "every slot went back")
}

// A SIGKILLed sidecar's slots come back to the others after their expiry on Redis's clock, not
// before it: the others are refused until then.
func TestInFlightSlotsOfAKilledSidecarReturn(t *testing.T) {
	g := NewWithT(t)
	e := newEnv(t, "web")
	e.write(t, inFlightDocument(e.namespace, 2, 0))
	up := newGauge(t)
	expiry := 3 * time.Second
	a := start(t, "pod-a", e, shared.URL(), up.Listener.Addr().String(), true, "--in-flight-expiry="+expiry.String())
	b := start(t, "pod-b", e, shared.URL(), up.Listener.Addr().String(), true, "--in-flight-expiry="+expiry.String())
	ctx := ctxTimeout(t, 2*time.Minute)
	for range 2 {
		resp, err := get(ctx, a.proxy+"/hold", "k")
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(resp.StatusCode).To(Equal(http.StatusOK))
		line, err := bufio.NewReader(resp.Body).ReadString('\n')
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(line).To(Equal("data: first\n"))
		defer resp.Body.Close()
	}
	resp, err := get(ctx, b.proxy+"/", "k")
	g.Expect(err).NotTo(HaveOccurred())
	resp.Body.Close()
	g.Expect(resp.StatusCode).To(Equal(http.StatusTooManyRequests))

	c := redisclient.New(t, shared.URL(), redisconn.Options{ReadTimeout: 10 * time.Second})
	key := keyscheme.Key(e.namespace, "p", "slots", "k")
	g.Expect(a.Signal(syscall.SIGKILL)).To(Succeed())
	<-a.Done()
	killed := time.Now()
	// A dead process renews nothing: its slots' expiries are final now.
	slots, err := c.ZRangeWithScores(ctx, key, 0, -1).Result()
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(slots).To(HaveLen(2))
	firstExpiry := int64(slots[0].Score)
	for {
		resp, err := get(ctx, b.proxy+"/", "k")
		g.Expect(err).NotTo(HaveOccurred())
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		now, err := c.Time(ctx).Result()
		g.Expect(err).NotTo(HaveOccurred())
		if resp.StatusCode == http.StatusOK {
			g.Expect(now.UnixMilli()).To(BeNumerically(">=", firstExpiry), "a slot came back before its expiry")
			break
		}
		g.Expect(resp.StatusCode).To(Equal(http.StatusTooManyRequests))
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("a killed sidecar's slot returned %v after SIGKILL (expiry %v)", time.Since(killed).Round(10*time.Millisecond), expiry)
}

// A client that goes away, and an upstream that fails, give their slot back at once: with an
// expiry of ten minutes, the next request is admitted only if they did.
func TestInFlightReleasedOnAbortAndUpstreamError(t *testing.T) {
	g := NewWithT(t)
	e := newEnv(t, "web")
	e.write(t, inFlightDocument(e.namespace, 1, 0))
	up := newGauge(t)
	s := start(t, "pod-a", e, shared.URL(), up.Listener.Addr().String(), true, "--in-flight-expiry=10m")

	ctx, cancel := context.WithCancel(context.Background())
	resp, err := get(ctx, s.proxy+"/hold", "k")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(resp.StatusCode).To(Equal(http.StatusOK))
	_, err = bufio.NewReader(resp.Body).ReadString('\n')
	g.Expect(err).NotTo(HaveOccurred())
	busy, err := get(context.Background(), s.proxy+"/", "k")
	g.Expect(err).NotTo(HaveOccurred())
	busy.Body.Close()
	g.Expect(busy.StatusCode).To(Equal(http.StatusTooManyRequests))
	cancel() // the client goes away mid-stream
	resp.Body.Close()
	g.Eventually(func() int { return statusOf(s.proxy + "/") }, time.Minute, 20*time.Millisecond).Should(Equal(http.StatusOK))

	g.Expect(statusOf(s.proxy + "/fail")).To(Equal(http.StatusBadGateway))
	g.Expect(statusOf(s.proxy+"/")).To(Equal(http.StatusOK), "an upstream error gave its slot back")
}

// statusOf sends one GET with key k and returns its status, 0 on a transport error.
func statusOf(url string) int {
	resp, err := get(context.Background(), url, "k")
	if err != nil {
		return 0
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// A request refused by its slot counts in no limit per window of the same request: the window
// gives back what it counted.
func TestInFlightRefusalGivesBackTheWindow(t *testing.T) {
	g := NewWithT(t)
	e := newEnv(t, "web")
	e.write(t, inFlightDocument(e.namespace, 1, 3))
	up := newGauge(t)
	s := start(t, "pod-a", e, shared.URL(), up.Listener.Addr().String(), true)

	resp, err := get(ctxTimeout(t, time.Minute), s.proxy+"/hold", "k")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(resp.StatusCode).To(Equal(http.StatusOK))
	_, err = bufio.NewReader(resp.Body).ReadString('\n')
	g.Expect(err).NotTo(HaveOccurred())
	for range 5 {
		g.Expect(statusOf(s.proxy + "/")).To(Equal(http.StatusTooManyRequests))
	}
	up.release()
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	// The hold counted 1 of 3: two more pass, whatever the five refusals did.
	g.Eventually(func() int { return statusOf(s.proxy + "/") }, time.Minute, 20*time.Millisecond).Should(Equal(http.StatusOK))
	g.Expect(statusOf(s.proxy + "/")).To(Equal(http.StatusOK))
	r, err := get(context.Background(), s.proxy+"/", "k")
	g.Expect(err).NotTo(HaveOccurred())
	r.Body.Close()
	g.Expect(r.StatusCode).To(Equal(http.StatusTooManyRequests))
	g.Expect(r.Header.Get("RateLimit-Policy")).To(ContainSubstring(`"p/window";q=3;w=60`))
}
