package redisacl_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"github.com/redis/go-redis/v9"

	"github.com/redline-dev/redline/internal/keyscheme"
	"github.com/redline-dev/redline/internal/limiter"
	"github.com/redline-dev/redline/internal/redisacl"
	"github.com/redline-dev/redline/internal/testutil/redistest"
)

// A namespace's user, as the manager sets it on every node, may send the waits of a rule's
// durability: WAIT is acknowledged by the replica, and WAITAOF is acknowledged on a server that
// has it (Valkey 8, as Redis 7.2+) and unknown before (Debian 12's Redis 7.0: ACL SETUSER leaves
// it out there, and the sidecar counts it unsupported, never refused by the ACL).
func TestTenantUserCanWaitForDurability(t *testing.T) {
	for _, srv := range []struct {
		name  string
		start func(...string) (*redistest.Server, error)
	}{{"redis-server", redistest.Start}, {"valkey-server", redistest.StartValkey}} {
		t.Run(srv.name, func(t *testing.T) { tenantWaits(t, srv.start) })
	}
}

func tenantWaits(t *testing.T, start func(...string) (*redistest.Server, error)) {
	g := NewWithT(t)
	ctx := context.Background()
	master, err := start("--requirepass", adminPassword, "--appendonly", "yes")
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { _ = master.Close() })
	admin := client(t, master.URL(), "", adminPassword)
	replica, err := start("--requirepass", adminPassword, "--masterauth", adminPassword, "--replicaof", "127.0.0.1", strconv.Itoa(master.Port))
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { _ = replica.Close() })
	radmin := client(t, replica.URL(), "", adminPassword)
	loadSidecarScripts(t, ctx, admin)
	g.Expect(redisacl.Ensure(ctx, []redisacl.Node{admin, radmin}, "shop", []string{"pw"})).To(Succeed())
	g.Eventually(func() (int64, error) {
		return admin.Do(ctx, "wait", 1, 100).Int64()
	}).WithTimeout(30*time.Second).Should(BeNumerically(">=", 1), "the replica is in sync")

	tenant := client(t, master.URL(), redisacl.Username("shop"), "pw")
	l, err := limiter.New(tenant, limiter.Options{LeaseHorizon: -1})
	g.Expect(err).NotTo(HaveOccurred())
	defer l.Close()
	lim := fixedWindow
	lim.Requests = 1000
	for _, mode := range []limiter.DurabilityMode{limiter.DurabilityReplica, limiter.DurabilityAppendOnlyFile} {
		lim.Durability = limiter.Durability{Mode: mode, Timeout: 2 * time.Second}
		res, err := l.Allow(ctx, keyscheme.Key("shop", "p", "r", string(mode)), lim, 1)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(res.Source).To(Equal(limiter.SourceRedis), "decided in Redis: %v", res.Err)
		g.Expect(res.Allowed).To(BeTrue())
	}
	has := waitAOFKnown(t, admin)
	st := l.Stats()
	g.Expect(st.Unacked.Error).To(BeZero(), "no wait refused by the ACL")
	if has {
		g.Expect(st.AckedGrants).To(BeEquivalentTo(2), "WAIT and WAITAOF acknowledged")
	} else {
		g.Expect(st.AckedGrants).To(BeEquivalentTo(1), "WAIT acknowledged")
		g.Expect(st.Unacked.Unsupported).To(BeEquivalentTo(1), "WAITAOF unknown before 7.2")
	}
	// The user holds WAIT on every node, and WAITAOF only where the server knows it.
	list, err := radmin.Do(ctx, "acl", "list").StringSlice()
	g.Expect(err).NotTo(HaveOccurred())
	var line string
	for _, u := range list {
		if strings.HasPrefix(u, "user "+redisacl.Username("shop")+" ") {
			line = u
		}
	}
	g.Expect(line).To(ContainSubstring("+wait"))
	if has {
		g.Expect(line).To(ContainSubstring("+waitaof"))
	} else {
		g.Expect(line).NotTo(ContainSubstring("+waitaof"))
	}
}

// waitAOFKnown says whether the server has WAITAOF (COMMAND INFO answers nothing for a command
// it does not know).
func waitAOFKnown(t *testing.T, admin redis.UniversalClient) bool {
	t.Helper()
	info, err := admin.Do(context.Background(), "command", "info", "waitaof").Slice()
	if err != nil || len(info) != 1 {
		t.Fatalf("COMMAND INFO waitaof: %v %v", info, err)
	}
	return info[0] != nil
}
