package limiter_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/redline-dev/redline/internal/limiter"
	"github.com/redline-dev/redline/internal/testutil/redistest"
)

// What a redis-server killed with SIGKILL (or its master killed and its replica promoted)
// keeps of a day's counts, for each persistence configuration and durability choice. Each
// case admits a known number of requests of one key, kills Redis, and reads back what the
// restarted or promoted server counts: lost is admitted minus that. No shares (ReplicaID) and
// no leases, so that what survives is Redis's doing alone.

const durableAdmits = 200

var durableLimit = limiter.Limit{Algorithm: limiter.FixedWindow, Requests: 1_000_000, Window: 24 * time.Hour}

// admitDurable admits n requests of key under lim, one at a time, and returns the limiter's stats.
func admitDurable(t *testing.T, url, key string, lim limiter.Limit, n int) limiter.Stats {
	t.Helper()
	c := newClient(t, url)
	exactWindow(t, c, lim.Window, 30*time.Minute) // a day-long window: never the day's last half hour
	l := newLimiter(t, c, limiter.TestOptions{})
	for i := range n {
		r, err := l.Allow(context.Background(), key, lim, 1)
		if err != nil || !r.Allowed || r.Source != limiter.SourceRedis {
			t.Fatalf("admit %d: %+v, %v", i, r, err)
		}
	}
	return l.Stats()
}

// countedNow is what the server at url counts of key's window now: one more decision's remaining
// tells it (that decision's unit aside).
func countedNow(t *testing.T, url, key string) int64 {
	t.Helper()
	l := newLimiter(t, newClient(t, url), limiter.TestOptions{})
	r, err := l.Allow(context.Background(), key, durableLimit, 1)
	if err != nil || r.Source != limiter.SourceRedis {
		t.Fatalf("reading the count back: %+v, %v", r, err)
	}
	return durableLimit.Requests - 1 - r.Remaining
}

// restartServer kills s (SIGKILL: a crash) and starts it again on its files.
func restartServer(t *testing.T, s *redistest.Server) {
	t.Helper()
	if err := s.Stop(); err != nil {
		t.Fatalf("killing redis-server: %v", err)
	}
	if err := s.Start(); err != nil {
		t.Fatalf("restarting redis-server: %v", err)
	}
}

func startServer(t *testing.T, args ...string) *redistest.Server {
	t.Helper()
	s, err := redistest.Start(args...)
	if err != nil {
		t.Fatalf("starting redis-server: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func infoField(t *testing.T, s *redistest.Server, section, field string) string {
	t.Helper()
	c := s.Client("")
	defer c.Close()
	info, err := c.Info(context.Background(), section).Result()
	if err != nil {
		t.Fatalf("INFO %s: %v", section, err)
	}
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
			return v
		}
	}
	t.Fatalf("INFO %s has no %s", section, field)
	return ""
}

func TestRestartWithoutPersistenceLosesTheWindow(t *testing.T) {
	g := NewWithT(t)
	s := startServer(t) // save "" and appendonly no, as redistest starts every server
	key := uniqueKey(t)
	admitDurable(t, s.URL(), key, durableLimit, durableAdmits)
	restartServer(t, s)
	g.Expect(countedNow(t, s.URL(), key)).To(BeZero(), "a restarted Redis without persistence counts nothing of the window: all %d admitted are lost", durableAdmits)
}

func TestRestartWithAppendOnlyFileAlwaysLosesNothing(t *testing.T) {
	g := NewWithT(t)
	s := startServer(t, "--appendonly", "yes", "--appendfsync", "always")
	key := uniqueKey(t)
	admitDurable(t, s.URL(), key, durableLimit, durableAdmits)
	restartServer(t, s)
	g.Expect(countedNow(t, s.URL(), key)).To(BeEquivalentTo(durableAdmits), "appendfsync always: every reply follows its fsync")
}

// everysec writes the file before it replies, unless a background fsync is still running: then
// it keeps the writes in its buffer for up to 2s (and counts aof_delayed_fsync only past
// that). A SIGKILL keeps what was written (the kernel holds it), so what it loses is what sat in
// the buffer. A host crash loses what was not fsynced yet, about a second: this test cannot
// show it.
func TestRestartWithAppendOnlyFileEverysec(t *testing.T) {
	g := NewWithT(t)
	s := startServer(t, "--appendonly", "yes", "--appendfsync", "everysec")
	written, killed := uniqueKey(t), uniqueKey(t)
	admitDurable(t, s.URL(), written, durableLimit, durableAdmits)
	g.Eventually(func() string { return infoField(t, s, "persistence", "aof_buffer_length") }).
		WithTimeout(30*time.Second).WithPolling(20*time.Millisecond).Should(Equal("0"), "Redis wrote its buffer to the file")
	admitDurable(t, s.URL(), killed, durableLimit, durableAdmits) // and killed at once
	restartServer(t, s)
	g.Expect(countedNow(t, s.URL(), written)).To(BeEquivalentTo(durableAdmits), "once written, a SIGKILL loses nothing")
	got := countedNow(t, s.URL(), killed)
	g.Expect(got).To(BeNumerically("<=", durableAdmits))
	t.Logf("appendfsync everysec, SIGKILL right after the grants: %d of %d lost", durableAdmits-got, durableAdmits)
}

// startPair starts a master and a replica of it (no persistence) and waits until the replica is
// in sync.
func startPair(t *testing.T) (master, replica *redistest.Server) {
	t.Helper()
	master = startServer(t)
	replica = startServer(t, "--replicaof", "127.0.0.1", strconv.Itoa(master.Port))
	c := master.Client("")
	defer c.Close()
	NewWithT(t).Eventually(func() (int64, error) {
		if err := c.Set(context.Background(), "rl:{probe}", "1", time.Minute).Err(); err != nil {
			return 0, err
		}
		return c.Wait(context.Background(), 1, 100*time.Millisecond).Result()
	}).WithTimeout(30*time.Second).WithPolling(50*time.Millisecond).Should(BeNumerically(">=", 1), "the replica acknowledges writes")
	return master, replica
}

// failover kills master (SIGKILL) and promotes replica, as Sentinel would.
func failover(t *testing.T, master, replica *redistest.Server) {
	t.Helper()
	if err := master.Stop(); err != nil {
		t.Fatalf("killing the master: %v", err)
	}
	c := replica.Client("")
	defer c.Close()
	if err := c.Do(context.Background(), "replicaof", "no", "one").Err(); err != nil {
		t.Fatalf("promoting the replica: %v", err)
	}
}

func TestFailoverKeepsEveryGrantAReplicaAcknowledged(t *testing.T) {
	g := NewWithT(t)
	master, replica := startPair(t)
	key := uniqueKey(t)
	lim := durableLimit
	lim.Durability = limiter.Durability{Mode: limiter.DurabilityReplica, Timeout: limiter.MaxDurabilityTimeout}
	st := admitDurable(t, master.URL(), key, lim, durableAdmits)
	unacked := st.Unacked.Timeout + st.Unacked.Unsupported + st.Unacked.Error
	g.Expect(st.AckedGrants+unacked).To(BeEquivalentTo(durableAdmits), "every grant waited")
	failover(t, master, replica)
	got := countedNow(t, replica.URL(), key)
	g.Expect(got).To(BeNumerically(">=", st.AckedGrants), "the promoted replica holds every acknowledged grant")
	g.Expect(got).To(BeNumerically("<=", durableAdmits))
	t.Logf("WAIT 1, master killed, replica promoted: %d of %d admitted lost (%d acknowledged)", durableAdmits-got, durableAdmits, st.AckedGrants)
}

// With the replica stopped, each grant waits for its timeout and stands unacknowledged: the
// request is admitted and the stats say so.
func TestUnacknowledgedGrantsStandAndAreCounted(t *testing.T) {
	g := NewWithT(t)
	master, replica := startPair(t)
	if err := replica.Pause(); err != nil {
		t.Fatal(err)
	}
	key := uniqueKey(t)
	lim := durableLimit
	lim.Durability = limiter.Durability{Mode: limiter.DurabilityReplica, Timeout: 10 * time.Millisecond}
	const n = 20
	st := admitDurable(t, master.URL(), key, lim, n)
	g.Expect(st.AckedGrants).To(BeZero())
	g.Expect(st.Unacked.Timeout).To(BeEquivalentTo(n), "every grant timed out waiting for the stopped replica, and stood")
	if err := replica.Resume(); err != nil { // it resumes with its link to the master down
		t.Fatal(err)
	}
	failover(t, master, replica)
	// What the master had sent into the stopped replica's socket still reaches it on SIGCONT:
	// an unacknowledged grant may survive, nothing promises it does.
	got := countedNow(t, replica.URL(), key)
	g.Expect(got).To(BeNumerically("<=", n))
	t.Logf("WAIT 1 timed out on every grant, master killed, replica promoted: %d of %d admitted lost", n-got, n)
}

// Redis before 7.2 does not know WAITAOF: a rule asking for the append-only file is not given
// it in silence. Its grants stand and are counted unsupported; on 7.2 and later they are
// acknowledged. Either way a restart with appendfsync always loses nothing.
func TestAppendOnlyFileDurability(t *testing.T) {
	g := NewWithT(t)
	s := startServer(t, "--appendonly", "yes", "--appendfsync", "always")
	key := uniqueKey(t)
	lim := durableLimit
	lim.Durability = limiter.Durability{Mode: limiter.DurabilityAppendOnlyFile, Timeout: time.Second}
	st := admitDurable(t, s.URL(), key, lim, durableAdmits)
	version := infoField(t, s, "server", "redis_version")
	if waitAOFKnown(version) {
		g.Expect(st.AckedGrants).To(BeEquivalentTo(durableAdmits), "Redis %s acknowledges WAITAOF", version)
	} else {
		g.Expect(st.Unacked.Unsupported).To(BeEquivalentTo(durableAdmits), "Redis %s does not know WAITAOF: every grant stands, counted unsupported", version)
		g.Expect(st.AckedGrants).To(BeZero())
	}
	restartServer(t, s)
	g.Expect(countedNow(t, s.URL(), key)).To(BeEquivalentTo(durableAdmits))
}

// On a server that has WAITAOF (Valkey 8, as Redis 7.2+) with appendfsync everysec, every
// grant of a rule asking for the append-only file is acknowledged once fsynced, so a SIGKILL
// right after the last grant loses none of them; without the wait the same kill may lose what
// sat in the buffer (TestRestartWithAppendOnlyFileEverysec).
func TestWaitAOFKeepsEveryAcknowledgedGrant(t *testing.T) {
	g := NewWithT(t)
	const waitAOFAdmits = 40 // each waits for the next fsync: a tenth of a second or so
	s, err := redistest.StartValkey("--appendonly", "yes", "--appendfsync", "everysec")
	g.Expect(err).NotTo(HaveOccurred(), "the test needs valkey-server")
	t.Cleanup(func() { _ = s.Close() })
	key := uniqueKey(t)
	lim := durableLimit
	lim.Durability = limiter.Durability{Mode: limiter.DurabilityAppendOnlyFile, Timeout: 2 * time.Second}
	st := admitDurable(t, s.URL(), key, lim, waitAOFAdmits)
	g.Expect(st.AckedGrants).To(BeEquivalentTo(waitAOFAdmits), "Valkey %s acknowledges WAITAOF", infoField(t, s, "server", "valkey_version"))
	g.Expect(st.Unacked).To(BeZero())
	restartServer(t, s) // SIGKILL right after the last acknowledgement
	g.Expect(countedNow(t, s.URL(), key)).To(BeEquivalentTo(waitAOFAdmits), "every acknowledged grant survives")
}

// waitAOFKnown says whether Redis version v (INFO server's redis_version) has WAITAOF (7.2+).
func waitAOFKnown(v string) bool {
	f := strings.SplitN(v, ".", 3)
	if len(f) < 2 {
		return false
	}
	major, _ := strconv.Atoi(f[0])
	minor, _ := strconv.Atoi(f[1])
	return major > 7 || major == 7 && minor >= 2
}

// On a long window a lease holds at most a thousandth of the limit: a sidecar killed without
// giving it back strands no more than that until the window ends. So on a day and on a rolling
// window of 31 days.
func TestLongWindowLeasesStrandAtMostAThousandth(t *testing.T) {
	for _, lim := range []limiter.Limit{durableLimit, {Algorithm: limiter.SlidingWindowCounter, Requests: 1_000_000, Window: 744 * time.Hour}} {
		t.Run(fmt.Sprintf("%s/%s", lim.Algorithm, lim.Window), func(t *testing.T) {
			g := NewWithT(t)
			s := startServer(t)
			c := newClient(t, s.URL())
			exactWindow(t, c, lim.Window, 30*time.Minute)
			l, err := limiter.NewWith(c, limiter.TestOptions{LeaseHorizon: 2 * time.Second})
			g.Expect(err).NotTo(HaveOccurred())
			key := uniqueKey(t)
			lim.Replicas = 1
			const n = 4500 // not a multiple of a lease
			leased := 0
			for i := range n {
				r, err := l.Allow(context.Background(), key, lim, 1)
				if err != nil || !r.Allowed {
					t.Fatalf("admit %d: %+v, %v", i, r, err)
				}
				if r.Source == limiter.SourceLease {
					leased++
				}
			}
			g.Expect(leased).To(BeNumerically(">", 0), "the key leased")
			// The sidecar dies here: what Redis counted beyond what it admitted is stranded.
			stranded := lim.Requests - remaining(t, newLimiter(t, newClient(t, s.URL()), limiter.TestOptions{}), key, lim) - n
			l.Close()
			g.Expect(stranded).To(BeNumerically("<=", lim.Requests/1000), "at most a thousandth of the limit")
			g.Expect(stranded).To(BeNumerically(">=", 0))
			t.Logf("%s window, limit %d: %d admitted (%d from leases), %d stranded in the lease", lim.Window, lim.Requests, n, leased, stranded)
		})
	}
}
