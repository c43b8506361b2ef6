package sidecar_test

import (
	"bufio"
	"context"
	"net/http"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/redline-dev/redline/internal/fleet"
	"github.com/redline-dev/redline/internal/keyscheme"
	"github.com/redline-dev/redline/internal/redisconn"
	"github.com/redline-dev/redline/internal/testutil/redistest/redisclient"
	"github.com/redline-dev/redline/internal/topkeys"
)

// Two sidecars hold streams of an in-flight rule (alice 2 through a and 1 through b, bob 1
// through b): the summaries their heartbeats publish say, summed, 4 slots held, alice holding 3,
// which is what the manager reads into the policy's status; once the streams end they say none.
func TestInFlightUseIsPublishedWithTheHeartbeat(t *testing.T) {
	g := NewWithT(t)
	e := newEnv(t, "web")
	e.write(t, inFlightDocument(e.namespace, 4, 0))
	up := newGauge(t)
	const beat = 200 * time.Millisecond
	a := start(t, "pod-a", e, shared.URL(), up.Listener.Addr().String(), true, "--heartbeat-interval="+beat.String())
	b := start(t, "pod-b", e, shared.URL(), up.Listener.Addr().String(), true, "--heartbeat-interval="+beat.String())
	for _, take := range []struct {
		s   *sidecar
		key string
	}{{a, "alice"}, {a, "alice"}, {b, "alice"}, {b, "bob"}} {
		resp, err := get(context.Background(), take.s.proxy+"/hold", take.key)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(resp.StatusCode).To(Equal(http.StatusOK))
		_, err = bufio.NewReader(resp.Body).ReadString('\n') // the stream is under way
		g.Expect(err).NotTo(HaveOccurred())
		t.Cleanup(func() { _ = resp.Body.Close() })
	}
	c := redisclient.New(t, shared.URL(), redisconn.Options{ReadTimeout: 10 * time.Second})
	alice := keyscheme.Hash(keyscheme.Key(e.namespace, "p", "slots", "alice"))
	held := func(g Gomega) (uint64, topkeys.Snapshot) {
		got := fleet.ReadSummaries(context.Background(), c, e.namespace, []string{"p"}, nil, fleet.TTL(beat), 0)[0]
		g.Expect(got.Err).NotTo(HaveOccurred())
		g.Expect(got.Invalid).To(BeZero())
		var sum uint64
		var parts []topkeys.Snapshot
		for _, s := range got.Summaries {
			for _, r := range s.Rules {
				if r.Rule == "slots" && r.InFlight != nil {
					sum += r.InFlight.Held
					parts = append(parts, r.InFlight.Top.Snapshot())
				}
			}
		}
		return sum, topkeys.Merge(5, parts...)
	}
	g.Eventually(func(g Gomega) {
		sum, top := held(g)
		g.Expect(sum).To(BeEquivalentTo(4))
		g.Expect(top.Entries).NotTo(BeEmpty())
		g.Expect(top.Entries[0].Key).To(Equal(alice))
		g.Expect(top.Entries[0].Count).To(BeEquivalentTo(3))
	}, time.Minute, 50*time.Millisecond).Should(Succeed())

	up.release()
	g.Eventually(func(g Gomega) {
		sum, top := held(g)
		g.Expect(sum).To(BeZero())
		g.Expect(top.Entries).To(BeEmpty())
	}, time.Minute, 50*time.Millisecond).Should(Succeed())
}
