package fleet_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"github.com/redis/go-redis/v9"

	"github.com/redline-dev/redline/internal/fleet"
	"github.com/redline-dev/redline/internal/redisconn"
	"github.com/redline-dev/redline/internal/testutil/fleettest"
	"github.com/redline-dev/redline/internal/testutil/redistest/redisclient"
)

var current = strings.Repeat("c", 64)

// Each group is counted; those that fit in the namespace's bound are read whole, smallest
// first, and keep counts and the smallest stale names only; a group over what is left is
// counted and its losses read, not its members.
func TestSummarizeReadsWithinTheNamespaceBound(t *testing.T) {
	g := NewWithT(t)
	c := redisclient.Fresh(t, redisconn.Options{ReadTimeout: 30 * time.Second})
	ctx := context.Background()
	const ns, ttl = "summary", 30 * time.Second

	for i, pod := range []string{"pod-a", "pod-b", "pod-c"} {
		hash := current
		if i == 2 {
			hash = "older"
		}
		_, err := fleet.Beat(ctx, c, ns, pod, hash, ttl, []string{"small"}, i == 0)
		g.Expect(err).NotTo(HaveOccurred())
	}
	// A second group of 30, 8 of them stale, and one of 200 written by the tenant.
	for i := range 30 {
		hash := current
		if i%4 == 0 {
			hash = "older"
		}
		_, err := fleet.Beat(ctx, c, ns, fmt.Sprintf("web-%02d", 29-i), hash, ttl, []string{"medium"}, false)
		g.Expect(err).NotTo(HaveOccurred())
	}
	stuffed, err := fleettest.Stuff(ctx, c, ns, []string{"large"}, 200, 256, "forged")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(c.HSet(ctx, fleet.GroupConfigKey(ns, "large"), "!losses", 7).Err()).To(Succeed())

	// 100 members: large (200) does not fit, small (3+8) and medium (30+8) do.
	got := fleet.Summarize(ctx, c, ns, current, []string{"large", "none", "medium", "small"}, ttl, 100)
	g.Expect(got).To(HaveLen(4))
	for _, s := range got {
		g.Expect(s.Err).NotTo(HaveOccurred())
		g.Expect(s.Bound).To(Equal(100))
	}
	g.Expect(got[0]).To(Equal(fleet.Summary{Live: 200, Losses: 7, OverBound: true, Bound: 100}))
	g.Expect(got[1]).To(Equal(fleet.Summary{Bound: 100}), "no group")
	g.Expect(got[2]).To(Equal(fleet.Summary{Live: 30, Read: 30, Current: 22, Bound: 100,
		Stale: []string{"web-01", "web-05", "web-09", "web-13", "web-17"}}))
	g.Expect(got[3]).To(Equal(fleet.Summary{Live: 3, Losses: 1, Read: 3, Current: 2, Bound: 100, Stale: []string{"pod-c"}}))

	// With room for it, the large group is read too, names cut to fleet.SummaryBytes.
	got = fleet.Summarize(ctx, c, ns, current, []string{"large"}, ttl, 0)
	g.Expect(got[0].OverBound).To(BeFalse())
	g.Expect(got[0].Read).To(BeEquivalentTo(200))
	g.Expect(got[0].Current).To(BeZero())
	g.Expect(got[0].Stale).To(HaveLen(fleet.StaleNames))
	g.Expect(got[0].Stale[0]).To(HavePrefix("0000000-"))
	g.Expect(got[0].Stale[0]).To(HaveLen(fleet.SummaryBytes))
	g.Expect(stuffed.Delete(ctx)).To(Succeed())
}

// stuffedMembers is the size of each of the stuffed namespace's groups, as in issue 24.
const stuffedMembers = 10000

// stuffedNamespace is issue 24's namespace: 40 policies whose groups each hold 10,000 live
// members of 256-byte names and hashes, written by the tenant.
func stuffedNamespace(t testing.TB, c redis.UniversalClient) fleettest.Stuffed {
	t.Helper()
	policies := make([]string, 40)
	for i := range policies {
		policies[i] = fmt.Sprintf("p-%02d", i)
	}
	s, err := fleettest.Stuff(context.Background(), c, "stuffed", policies, stuffedMembers, 256, strings.Repeat("f", 256))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// Issue 24: reading every group whole (fleet.Read, what the manager did) allocates and holds
// about 6 MiB per stuffed group, 240 MiB for this namespace; Summarize allocates what
// fleet.NamespaceMembers of fleet.SummaryBytes cost, a few MiB, and holds a few KiB, whatever
// the tenant wrote.
func TestSummarizeBoundsWhatAStuffedNamespaceCosts(t *testing.T) {
	g := NewWithT(t)
	c := redisclient.Fresh(t, redisconn.Options{ReadTimeout: 30 * time.Second})
	ctx := context.Background()
	s := stuffedNamespace(t, c)

	readTotal, readHeld := fleettest.Allocation(func() any {
		var all []fleet.Report
		for _, p := range s.Policies {
			r, err := fleet.Read(ctx, c, s.Namespace, p, time.Minute)
			g.Expect(err).NotTo(HaveOccurred())
			all = append(all, r)
		}
		return all
	})
	var got []fleet.Summary
	sumTotal, sumHeld := fleettest.Allocation(func() any {
		got = fleet.Summarize(ctx, c, s.Namespace, current, s.Policies, time.Minute, 0)
		return got
	})
	t.Logf("40 groups of 10000 members, 256-byte names and hashes: fleet.Read of each allocates %.1f MiB and holds %.1f MiB; "+
		"fleet.Summarize allocates %.2f MiB and holds %.1f KiB",
		fleettest.MiB(readTotal), fleettest.MiB(readHeld), fleettest.MiB(sumTotal), float64(sumHeld)/(1<<10))

	over := 0
	for _, x := range got {
		g.Expect(x.Err).NotTo(HaveOccurred())
		g.Expect(x.Live).To(BeEquivalentTo(stuffedMembers))
		if x.OverBound {
			over++
		}
	}
	g.Expect(over).To(Equal(len(s.Policies)), "no group fits with its slack")
	// fleet.NamespaceMembers of two fleet.SummaryBytes strings is 1.2 MiB of payload; 16 MiB
	// leaves room for the client's buffers and for GC noise, and is a tenth of what Read took.
	g.Expect(sumTotal).To(BeNumerically("<", 16<<20))
	g.Expect(sumHeld).To(BeNumerically("<", 4<<20))

	// One group of the most one policy's read takes, just within the bound, is read whole,
	// within the same allocation.
	full, err := fleettest.Stuff(ctx, c, "full", []string{"q"}, fleet.MaxMembers, 256, strings.Repeat("f", 256))
	g.Expect(err).NotTo(HaveOccurred())
	sumTotal, _ = fleettest.Allocation(func() any {
		got = fleet.Summarize(ctx, c, full.Namespace, current, full.Policies, time.Minute, fleet.MaxMembers)
		return got
	})
	t.Logf("one group of %d members read whole: fleet.Summarize allocates %.2f MiB", fleet.MaxMembers, fleettest.MiB(sumTotal))
	g.Expect(got[0].Read).To(BeEquivalentTo(fleet.MaxMembers))
	g.Expect(got[0].Stale).To(HaveLen(fleet.StaleNames))
	g.Expect(sumTotal).To(BeNumerically("<", 16<<20))
}

// BenchmarkStuffedNamespace measures a reading of issue 24's namespace both ways (B/op).
func BenchmarkStuffedNamespace(b *testing.B) {
	c := redisclient.Fresh(b, redisconn.Options{ReadTimeout: 30 * time.Second})
	ctx := context.Background()
	s := stuffedNamespace(b, c)
	b.Run("Read", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			for _, p := range s.Policies {
				if _, err := fleet.Read(ctx, c, s.Namespace, p, time.Minute); err != nil {
					b.Fatal(err)
				}
			}
		}
	})
	b.Run("Summarize", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			fleet.Summarize(ctx, c, s.Namespace, current, s.Policies, time.Minute, 0)
		}
	})
}
