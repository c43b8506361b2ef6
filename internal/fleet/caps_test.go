package fleet_test

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"github.com/redis/go-redis/v9"

	"github.com/redline-dev/redline/internal/fleet"
	"github.com/redline-dev/redline/internal/limiter/scripts"
	"github.com/redline-dev/redline/internal/redisconn"
	"github.com/redline-dev/redline/internal/testutil/redistest"
)

// The group read caps what it returns inside the script, at fleet.MaxMembers and
// fleet.MaxMemberBytes, whatever ARGV says: a tenant's user may run it too (see package
// redisacl), and ARGV can only lower the caps.
func TestGroupMembersCapsItsArguments(t *testing.T) {
	g := NewWithT(t)
	src, err := os.ReadFile("group_members.lua")
	g.Expect(err).NotTo(HaveOccurred())
	caps := regexp.MustCompile(`(?m)^local MOST, WIDTH = (\d+), (\d+)$`).FindStringSubmatch(string(src))
	g.Expect(caps).To(HaveLen(3), "group_members.lua states its caps")
	g.Expect(strconv.Atoi(caps[1])).To(Equal(fleet.MaxMembers))
	g.Expect(strconv.Atoi(caps[2])).To(Equal(fleet.MaxMemberBytes))

	srv, err := redistest.Start()
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { _ = srv.Close() })
	c, err := redisconn.NewClient(srv.URL(), redisconn.Options{ReadTimeout: 10 * time.Second, WriteTimeout: 10 * time.Second})
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { _ = c.Close() })
	ctx := context.Background()
	key, cfg := fleet.GroupKey("capped", "p"), fleet.GroupConfigKey("capped", "p")
	now, err := c.Time(ctx).Result()
	g.Expect(err).NotTo(HaveOccurred())
	long := string(make([]byte, 1000))
	for i := 0; i < fleet.MaxMembers+500; i += 1000 {
		zs := make([]redis.Z, 0, 1000)
		for j := i; j < min(i+1000, fleet.MaxMembers+500); j++ {
			zs = append(zs, redis.Z{Score: float64(now.UnixMilli() - 1000), Member: fmt.Sprint(j, long)})
		}
		g.Expect(c.ZAdd(ctx, key, zs...).Err()).To(Succeed())
	}
	g.Expect(c.HSet(ctx, cfg, fmt.Sprint(0, long), long).Err()).To(Succeed())

	read := scripts.New("GroupMembers", string(src))
	for _, args := range [][]any{
		{60000, "1e9", "1e9"}, {60000, -1, -1}, {60000, "nan", "nan"}, {60000, "inf", "-inf"}, {60000, "x", ""},
	} {
		cmd := scripts.EvalSha(ctx, read, []string{key, cfg}, args...)
		scripts.Exec(ctx, c, []redis.Cmder{cmd}, []scripts.Script{read})
		reply, err := cmd.Slice()
		g.Expect(err).NotTo(HaveOccurred(), "%v", args)
		g.Expect(reply[0]).To(BeEquivalentTo(fleet.MaxMembers+500), "%v: live counts them all", args)
		g.Expect(len(reply)-2).To(Equal(2*fleet.MaxMembers), "%v: at most MaxMembers returned", args)
		for _, v := range reply[2:] {
			g.Expect(len(v.(string))).To(BeNumerically("<=", fleet.MaxMemberBytes), "%v", args)
		}
	}
	// A lower ARGV lowers them.
	cmd := scripts.EvalSha(ctx, read, []string{key, cfg}, 60000, 3, 5)
	g.Expect(c.Process(ctx, cmd)).To(Succeed())
	reply, err := cmd.Slice()
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(reply[2:]).To(HaveLen(6))
	g.Expect(reply[2]).To(HaveLen(5))
	// A TTL that is not a number is refused.
	cmd = scripts.EvalSha(ctx, read, []string{key, cfg}, "nan", 3, 5)
	_ = c.Process(ctx, cmd)
	g.Expect(cmd.Err()).To(MatchError(ContainSubstring("ttl is not a number")))
}
