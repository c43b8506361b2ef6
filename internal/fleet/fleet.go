// Package fleet keeps count of the replicas that enforce each policy, in Redis.
//
// A group is the set of replicas that enforce one policy. Each replica announces itself in the
// group's sorted set, with the configuration hash it applies in a companion hash, so that
// LocalFallback can divide a policy's limit by the replicas that enforce that policy (see
// limiter.Limit.Replicas), and so that an operator can see which replicas apply which
// configuration. Both keys expire with the liveness TTL, set by the script that writes them.
package fleet

import (
	"context"
	_ "embed"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redline-dev/redline/internal/limiter"
	"github.com/redline-dev/redline/internal/limiter/scripts"
)

// DefaultInterval is the time between a replica's heartbeats unless it is configured otherwise.
const DefaultInterval = 5 * time.Second

// TTL is how long a replica counts as live after its last heartbeat, for heartbeats every
// interval: three intervals, so that one or two lost heartbeats do not make a replica look gone.
// Sidecars announce with it and the manager reads groups with it; both must agree.
func TTL(interval time.Duration) time.Duration { return 3 * interval }

//go:embed group_heartbeat.lua
var heartbeatSource string

var heartbeatScript = scripts.New("GroupHeartbeat", heartbeatSource)

// GroupKey is the sorted set of the live replicas that enforce a policy, scored by the Redis
// time of their last heartbeat: rl:{hb/<namespace>/<policy>}. The braces are a hash tag, so
// GroupConfigKey lives in the same cluster slot.
func GroupKey(namespace, policy string) string {
	var b strings.Builder
	b.WriteString("rl:{hb/")
	b.WriteString(limiter.KeyPart(namespace))
	b.WriteByte('/')
	b.WriteString(limiter.KeyPart(policy))
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
	cmds := make([]redis.Cmder, len(policies))
	for i, p := range policies {
		cmds[i] = scripts.EvalSha(ctx, heartbeatScript, []string{GroupKey(namespace, p), GroupConfigKey(namespace, p)},
			instance, ttl.Milliseconds(), configHash)
	}
	scripts.Exec(ctx, client, cmds, []scripts.Script{heartbeatScript})
	out := make([]int64, len(cmds))
	for i, c := range cmds {
		n, err := c.(*redis.Cmd).Int64()
		if err != nil {
			return nil, fmt.Errorf("announcing %s in the group of policy %s/%s: %w", instance, namespace, policies[i], err)
		}
		out[i] = n
	}
	return out, nil
}

// Members returns the live replicas of a policy's group and the configuration hash each
// one applies. Replicas whose heartbeat is older than ttl are left out.
func Members(ctx context.Context, client redis.UniversalClient, namespace, policy string, ttl time.Duration) (map[string]string, error) {
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
