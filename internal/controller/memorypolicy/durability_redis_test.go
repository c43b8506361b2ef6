package memorypolicy

import (
	"context"
	"os"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/redline-dev/redline/api/v1alpha1"
	"github.com/redline-dev/redline/internal/testutil/redistest"
)

// What a real redis-server says of its snapshots, and what the condition makes of it: no
// snapshots, snapshots, snapshots that fail, and CONFIG renamed so that the rules are unknown.
func TestReadNodeDurabilitySnapshots(t *testing.T) {
	daily := []v1alpha1.Rule{{Name: "daily", Limit: v1alpha1.Limit{Requests: 1, Calendar: &v1alpha1.CalendarWindow{Unit: v1alpha1.CalendarDay}}}}
	read := func(t *testing.T, extra ...string) (*redistest.Server, NodeDurability) {
		t.Helper()
		g := NewWithT(t)
		srv, err := redistest.Start(extra...)
		g.Expect(err).NotTo(HaveOccurred())
		t.Cleanup(func() { _ = srv.Close() })
		c := srv.Client("")
		t.Cleanup(func() { _ = c.Close() })
		n, err := ReadNodeDurability(context.Background(), c)
		g.Expect(err).NotTo(HaveOccurred())
		return srv, n
	}
	condition := func(t *testing.T, n NodeDurability, reason, text string) {
		t.Helper()
		status, got, msg := durabilityCondition(daily, []NodeDurability{n}, nil)
		NewWithT(t).Expect([]string{string(status), got}).To(Equal([]string{string(metav1.ConditionFalse), reason}), msg)
		NewWithT(t).Expect(msg).To(ContainSubstring(text))
	}

	t.Run("no snapshots", func(t *testing.T) {
		_, n := read(t)
		NewWithT(t).Expect(n).To(And(HaveField("Save", ""), HaveField("SaveKnown", true), HaveField("BgsaveOK", true)))
		condition(t, n, v1alpha1.ReasonCountsLostOnRestart, `counts a calendar Day window in `+n.Addr+`'s memory, which runs with appendonly no and no RDB snapshots (save "")`)
	})
	t.Run("snapshots", func(t *testing.T) {
		_, n := read(t, "--save", "3600 1 300 100")
		NewWithT(t).Expect(n).To(And(HaveField("Save", "3600 1 300 100"), HaveField("SaveKnown", true), HaveField("BgsaveOK", true)))
		condition(t, n, v1alpha1.ReasonCountsLostSinceSnapshot, `RDB snapshots only (save "3600 1 300 100": after so many seconds if so many keys changed): a restart loses what was counted since the last snapshot`)
	})
	t.Run("CONFIG renamed", func(t *testing.T) {
		_, n := read(t, "--save", "3600 1", "--rename-command", "CONFIG", "")
		NewWithT(t).Expect(n).To(And(HaveField("SaveKnown", false), HaveField("BgsaveOK", true)))
		condition(t, n, v1alpha1.ReasonCountsLostOnRestart, "its RDB snapshot rules are unreadable (CONFIG GET save refused)")
	})
	t.Run("a failing snapshot", func(t *testing.T) {
		g := NewWithT(t)
		// A snapshot directory removed under the server: BGSAVE's child cannot create its file.
		gone := t.TempDir() + "/gone"
		g.Expect(os.Mkdir(gone, 0o700)).To(Succeed())
		srv, _ := read(t, "--save", "3600 1", "--dir", gone)
		g.Expect(os.Remove(gone)).To(Succeed())
		ctx := context.Background()
		c := srv.Client("")
		defer func() { _ = c.Close() }()
		g.Expect(c.BgSave(ctx).Err()).To(Succeed())
		var n NodeDurability
		g.Eventually(func(g Gomega) bool {
			var err error
			n, err = ReadNodeDurability(ctx, c)
			g.Expect(err).NotTo(HaveOccurred())
			return n.BgsaveOK
		}, time.Minute, 50*time.Millisecond).Should(BeFalse())
		g.Expect(n).To(And(HaveField("Save", "3600 1"), HaveField("SaveKnown", true)))
		condition(t, n, v1alpha1.ReasonCountsLostOnRestart, "its last RDB snapshot failed (rdb_last_bgsave_status:err")
	})
}

// What the check makes of a rule asking for the append-only file, on each server this machine's
// packages give: Redis 7.0 has no WAITAOF and is said so; Valkey 8 (as Redis 7.2+) has it and,
// with appendonly yes, is durable.
func TestAppendOnlyFileRuleOnEachServer(t *testing.T) {
	aof := []v1alpha1.Rule{{Name: "billed", Limit: v1alpha1.Limit{Requests: 1, Calendar: &v1alpha1.CalendarWindow{Unit: v1alpha1.CalendarMonth}},
		Durability: &v1alpha1.Durability{Mode: v1alpha1.DurabilityAppendOnlyFile}}}
	for _, tc := range []struct {
		name   string
		start  func(...string) (*redistest.Server, error)
		status metav1.ConditionStatus
		reason string
	}{
		{"redis-server 7.0", redistest.Start, metav1.ConditionFalse, v1alpha1.ReasonDurabilityUnsupported},
		{"valkey-server 8", redistest.StartValkey, metav1.ConditionTrue, v1alpha1.ReasonDurable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			srv, err := tc.start("--appendonly", "yes")
			g.Expect(err).NotTo(HaveOccurred())
			t.Cleanup(func() { _ = srv.Close() })
			c := srv.Client("")
			t.Cleanup(func() { _ = c.Close() })
			n, err := ReadNodeDurability(context.Background(), c)
			g.Expect(err).NotTo(HaveOccurred())
			status, reason, msg := durabilityCondition(aof, []NodeDurability{n}, nil)
			g.Expect([]string{string(status), reason}).To(Equal([]string{string(tc.status), tc.reason}), "%s (version %s): %s", tc.name, n.Version, msg)
		})
	}
}
