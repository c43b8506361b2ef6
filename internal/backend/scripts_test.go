package backend_test

import (
	"context"
	"testing"
	"time"

	"github.com/go-logr/logr"
	. "github.com/onsi/gomega"
	"github.com/redis/go-redis/v9"

	"github.com/redline-dev/redline/internal/backend"
	"github.com/redline-dev/redline/internal/redisacl"
	"github.com/redline-dev/redline/internal/redisconn"
	"github.com/redline-dev/redline/internal/testutil/redistest"
)

// A Sentinel group's replica holds every script a sidecar runs before any failover, so that a
// promoted replica answers a namespace's user (which may not load scripts) at once; a replica
// that lost them (SCRIPT FLUSH, a restart) gets them back at the next check.
func TestScriptsOnEveryNode(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	group, err := redistest.StartSentinel()
	g.Expect(err).NotTo(HaveOccurred(), "the test needs redis-server with --sentinel")
	t.Cleanup(func() { _ = group.Close() })
	opts := redisconn.Options{DialTimeout: time.Second, ReadTimeout: time.Second, WriteTimeout: time.Second}
	c, err := redisconn.NewClient(group.URL(), opts)
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { _ = c.Close() })
	nodes, err := redisconn.NewNodes(group.URL(), opts, c)
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { _ = nodes.Close() })
	store := &backend.Scripts{Client: c, Nodes: nodes.Each, Log: logr.Discard()}

	var shas []string
	for _, s := range redisacl.SidecarScripts() {
		shas = append(shas, s.SHA)
	}
	replica := redis.NewClient(&redis.Options{Addr: group.Replica().Addr()})
	t.Cleanup(func() { _ = replica.Close() })
	for _, node := range []*redis.Client{replica, redis.NewClient(&redis.Options{Addr: group.Master().Addr()})} {
		g.Expect(node.ScriptExists(ctx, shas...).Result()).To(HaveEach(false), "%s starts empty", node.Options().Addr)
	}

	_, err = store.Ensure(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(replica.ScriptExists(ctx, shas...).Result()).To(HaveEach(true), "the replica holds every sidecar script")

	g.Expect(replica.ScriptFlush(ctx).Err()).To(Succeed())
	_, err = store.Ensure(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(replica.ScriptExists(ctx, shas...).Result()).To(HaveEach(true), "given back at the next check")
}
