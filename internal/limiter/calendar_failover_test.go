package limiter_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/redline-dev/redline/internal/calendar"
	"github.com/redline-dev/redline/internal/limiter"
)

// A calendar window takes no lease: a sidecar killed after a month's decisions strands nothing
// of the month's quota, where a day-long window's lease strands up to a thousandth of it
// (TestLongWindowLeasesStrandAtMostAThousandth). Every decision is Redis's.
func TestCalendarStrandsNothingOfTheMonth(t *testing.T) {
	g := NewWithT(t)
	s := startAt(t, "2028-02-15T12:00:00-05:00")
	c := newClient(t, s.URL())
	l, err := limiter.NewWith(c, limiter.TestOptions{LeaseHorizon: 2 * time.Second})
	g.Expect(err).NotTo(HaveOccurred())
	lim := calendarLimit(t, 1_000_000, calendar.Spec{Unit: calendar.Month, Zone: "America/New_York"})
	lim.Replicas = 1 // the replicas are known: a rule that leases would lease now
	key := uniqueKey(t)
	const n = 4500
	for i := range n {
		r, err := l.Allow(context.Background(), key, lim, 1)
		if err != nil || !r.Allowed || r.Source != limiter.SourceRedis {
			t.Fatalf("admit %d: %+v, %v; want admitted by Redis", i, r, err)
		}
	}
	l.Close() // the sidecar dies: nothing of its own is left to give back
	counted := lim.Requests - remaining(t, newLimiter(t, newClient(t, s.URL()), limiter.TestOptions{}), key, lim)
	g.Expect(counted).To(BeEquivalentTo(n), "the month counts exactly what was admitted")
}

// A calendar window keeps no shares: what survives a failover is what its durability waited
// for. With durability Replica, the replica promoted after its master was killed holds every
// acknowledged grant of a Berlin day, token budget holds included.
func TestCalendarFailoverKeepsWhatTheReplicaAcknowledged(t *testing.T) {
	g := NewWithT(t)
	at := "2028-10-29T12:00:00+01:00"
	master := startAt(t, at)
	replica := startAt(t, at, "--replicaof", "127.0.0.1", strconv.Itoa(master.Port))
	mc := master.Client("")
	defer mc.Close()
	g.Eventually(func() (int64, error) {
		if err := mc.Set(context.Background(), "rl:{probe}", "1", time.Minute).Err(); err != nil {
			return 0, err
		}
		return mc.Wait(context.Background(), 1, 100*time.Millisecond).Result()
	}).WithTimeout(30*time.Second).WithPolling(50*time.Millisecond).Should(BeNumerically(">=", 1), "the replica acknowledges writes")

	lim := calendarLimit(t, 1_000_000, calendar.Spec{Unit: calendar.Day, Zone: "Europe/Berlin"})
	lim.Durability = limiter.Durability{Mode: limiter.DurabilityReplica, Timeout: limiter.MaxDurabilityTimeout}
	key := uniqueKey(t)
	l := newLimiter(t, newClient(t, master.URL()), limiter.TestOptions{})
	ctx := context.Background()
	var admitted, acked int64 // units admitted, and those a replica acknowledged
	before := l.Stats().AckedGrants
	for i := range 200 {
		r, err := l.Allow(ctx, key, lim, 1)
		if err != nil || !r.Allowed {
			t.Fatalf("admit %d: %+v, %v", i, r, err)
		}
		admitted++
		if a := l.Stats().AckedGrants; a > before {
			acked, before = admitted, a // WAIT acknowledges every write before it on the master
		}
	}
	_, h, err := l.Reserve(ctx, key, lim, 1, 500, time.Hour)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(h.Units).To(BeEquivalentTo(500))
	admitted += 500
	if a := l.Stats().AckedGrants; a > before {
		acked = admitted
	}

	failover(t, master, replica)
	counted := lim.Requests - remaining(t, newLimiter(t, newClient(t, replica.URL()), limiter.TestOptions{}), key, lim)
	g.Expect(counted).To(BeNumerically(">=", acked), "the promoted replica holds every acknowledged grant")
	g.Expect(counted).To(BeNumerically("<=", admitted))
	t.Logf("Berlin day, WAIT 1, master killed, replica promoted: %d of %d units lost (%d acknowledged)", admitted-counted, admitted, acked)
}
