package limiter

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// A group is the set of replicas that enforce one policy. Each replica announces itself in the
// group's sorted set, with the configuration hash it applies in a companion hash, so that
// LocalFallback can divide a policy's limit by the replicas that enforce that policy (see
// Limit.Replicas), and so that an operator can see which replicas apply which configuration.
// Both keys expire with the heartbeat TTL, set by the script that writes them.

var groupHeartbeatScript = func() *redis.Script {
	src, err := luaFS.ReadFile("lua/group_heartbeat.lua")
	if err != nil {
		panic(fmt.Sprintf("embedded group heartbeat script missing: %v", err))
	}
	return redis.NewScript(string(src))
}()

// GroupKey is the sorted set of the live replicas that enforce a policy, scored by the Redis
// time of their last heartbeat: rl:{hb/<namespace>/<policy>}. The braces are a hash tag, so
// GroupConfigKey lives in the same cluster slot.
func GroupKey(namespace, policy string) string {
	var b strings.Builder
	b.WriteString("rl:{hb/")
	writeEscaped(&b, namespace)
	b.WriteByte('/')
	writeEscaped(&b, policy)
	b.WriteByte('}')
	return b.String()
}

// GroupConfigKey is the hash of replica -> configuration hash of a policy's group.
func GroupConfigKey(namespace, policy string) string {
	return GroupKey(namespace, policy) + ":cfg"
}

// Announce records instance as live in the group of each of policies of namespace, applying the
// configuration configHash, for ttl. It returns the live replica count of each group, in the
// order of policies. All groups go in one pipeline.
func Announce(ctx context.Context, client redis.UniversalClient, namespace, instance, configHash string, ttl time.Duration, policies []string) ([]int64, error) {
	if len(policies) == 0 {
		return nil, nil
	}
	run := func(eval func(redis.Pipeliner, string, string) *redis.Cmd) ([]*redis.Cmd, error) {
		pipe := client.Pipeline()
		cmds := make([]*redis.Cmd, len(policies))
		for i, p := range policies {
			cmds[i] = eval(pipe, GroupKey(namespace, p), GroupConfigKey(namespace, p))
		}
		_, err := pipe.Exec(ctx)
		return cmds, err
	}
	args := []any{instance, ttl.Milliseconds(), configHash}
	cmds, err := run(func(p redis.Pipeliner, k1, k2 string) *redis.Cmd {
		return groupHeartbeatScript.EvalSha(ctx, p, []string{k1, k2}, args...)
	})
	if err != nil && isNoScript(err) {
		// Redis restarted or flushed its scripts: EVAL sends the body and caches it again.
		cmds, err = run(func(p redis.Pipeliner, k1, k2 string) *redis.Cmd {
			return groupHeartbeatScript.Eval(ctx, p, []string{k1, k2}, args...)
		})
	}
	if err != nil {
		return nil, fmt.Errorf("announcing %s in %d policy groups of %s: %w", instance, len(policies), namespace, err)
	}
	out := make([]int64, len(cmds))
	for i, c := range cmds {
		if out[i], err = c.Int64(); err != nil {
			return nil, fmt.Errorf("reading live replicas of policy %s/%s: %w", namespace, policies[i], err)
		}
	}
	return out, nil
}

// GroupMembers returns the live replicas of a policy's group and the configuration hash each
// one applies. Replicas whose heartbeat is older than ttl are left out.
func GroupMembers(ctx context.Context, client redis.UniversalClient, namespace, policy string, ttl time.Duration) (map[string]string, error) {
	t, err := client.Time(ctx).Result()
	if err != nil {
		return nil, fmt.Errorf("reading redis time for policy group %s/%s: %w", namespace, policy, err)
	}
	live, err := client.ZRangeByScore(ctx, GroupKey(namespace, policy), &redis.ZRangeBy{
		Min: fmt.Sprint(t.Add(-ttl).UnixMilli()), Max: "+inf",
	}).Result()
	if err != nil {
		return nil, fmt.Errorf("reading policy group %s/%s: %w", namespace, policy, err)
	}
	out := make(map[string]string, len(live))
	if len(live) == 0 {
		return out, nil
	}
	hashes, err := client.HMGet(ctx, GroupConfigKey(namespace, policy), live...).Result()
	if err != nil {
		return nil, fmt.Errorf("reading configuration hashes of policy group %s/%s: %w", namespace, policy, err)
	}
	for i, m := range live {
		s, _ := hashes[i].(string)
		out[m] = s
	}
	return out, nil
}
