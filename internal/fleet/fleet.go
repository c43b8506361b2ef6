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

	"github.com/redline-dev/redline/internal/keyscheme"
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

//go:embed group_members.lua
var membersSource string

var (
	heartbeatScript = scripts.New("GroupHeartbeat", heartbeatSource)
	membersScript   = scripts.New("GroupMembers", membersSource)
)

// Scripts returns the scripts a sidecar runs here (the heartbeat), for whoever must load them
// into Redis or allow the commands they call.
func Scripts() []scripts.Script { return []scripts.Script{heartbeatScript} }

// MaxMembers is the most members Members returns of one group, and MaxMemberBytes the most
// bytes of a member's name or configuration hash it returns: a group's keys are writable by
// the tenant whose sidecars beat in them, and the manager reads them, so what it reads is
// bounded by the script that reads it (about 1 MiB per group at most), which caps both itself
// (group_members.lua, whose constants must equal these): a tenant's user may run it too.
// 2,000 rather than 10,000: a read of 10,000 held Redis 20 ms on a quiet machine and 40 to 60
// ms on a loaded one, for every tenant, and a tenant may run it back to back.
const (
	MaxMembers     = 2000
	MaxMemberBytes = 256
)

// KeyPrefix is the start of every group key of namespace: rl:hb:{<namespace>/. A namespace's
// Redis user may touch keys under it (see package redisacl). It differs from the limiter's
// rl:{<namespace>/ in the characters before the brace, so no namespace name (not even "hb")
// makes one namespace's prefix cover another's keys.
func KeyPrefix(namespace string) string { return "rl:hb:{" + keyscheme.Part(namespace) + "/" }

// GroupKey is the sorted set of the live replicas that enforce a policy, scored by the Redis
// time of their last heartbeat: rl:hb:{<namespace>/<policy>}. The braces are a hash tag, so
// GroupConfigKey lives in the same cluster slot.
func GroupKey(namespace, policy string) string {
	var b strings.Builder
	b.WriteString(KeyPrefix(namespace))
	b.WriteString(keyscheme.Part(policy))
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
	beats, err := Beat(ctx, client, namespace, instance, configHash, ttl, policies, false)
	if err != nil {
		return nil, err
	}
	out := make([]int64, len(beats))
	for i, b := range beats {
		out[i] = b.Live
	}
	return out, nil
}

// Heartbeat is what one group's heartbeat answered.
type Heartbeat struct {
	// Live is the group's live replica count.
	Live int64
	// Losses counts the heartbeats of the group that said Redis lost counts (lost true). When
	// it changes, every replica re-asserts its shares (see limiter.Limiter.Reassert).
	Losses int64
	// Previous is this instance's last heartbeat as Redis holds it (ms on Redis's clock, 0 for
	// none). Older than the last one this instance wrote, it says that Redis lost writes.
	Previous int64
	// Now is Redis's clock when the beat was recorded (ms).
	Now int64
}

// Beat is Announce with what a replica needs to notice that Redis lost counts: lost says
// this replica found Redis short of its shares since its last beat, which every replica of
// the group then learns from Heartbeat.Losses.
func Beat(ctx context.Context, client redis.UniversalClient, namespace, instance, configHash string, ttl time.Duration, policies []string, lost bool) ([]Heartbeat, error) {
	return beat(ctx, client, namespace, instance, configHash, ttl, policies, lost, nil)
}

func beat(ctx context.Context, client redis.UniversalClient, namespace, instance, configHash string, ttl time.Duration, policies []string, lost bool, summaries [][]byte) ([]Heartbeat, error) {
	if len(policies) == 0 {
		return nil, nil
	}
	flag := "0"
	if lost {
		flag = "1"
	}
	cmds := make([]redis.Cmder, len(policies))
	for i, p := range policies {
		if summaries == nil {
			cmds[i] = scripts.EvalSha(ctx, heartbeatScript, []string{GroupKey(namespace, p), GroupConfigKey(namespace, p)},
				instance, ttl.Milliseconds(), configHash, flag)
			continue
		}
		cmds[i] = scripts.EvalSha(ctx, heartbeatScript, []string{GroupKey(namespace, p), GroupConfigKey(namespace, p), SummaryKey(namespace, p, instance)},
			instance, ttl.Milliseconds(), configHash, flag, summaries[i])
	}
	scripts.Exec(ctx, client, cmds, []scripts.Script{heartbeatScript})
	out := make([]Heartbeat, len(cmds))
	for i, c := range cmds {
		n, err := c.(*redis.Cmd).Int64Slice()
		if err == nil && len(n) != 4 {
			err = fmt.Errorf("unexpected reply of %d values", len(n))
		}
		if err != nil {
			return nil, fmt.Errorf("announcing %s in the group of policy %s/%s: %w", instance, namespace, policies[i], err)
		}
		out[i] = Heartbeat{Live: n[0], Losses: n[1], Previous: n[2], Now: n[3]}
	}
	return out, nil
}

// Members returns the live replicas of a policy's group and the configuration hash each
// one applies: those whose last heartbeat is within ttl of Redis's now (a member scored after
// now is not live). At most MaxMembers are returned, names and hashes cut to MaxMemberBytes.
func Members(ctx context.Context, client redis.UniversalClient, namespace, policy string, ttl time.Duration) (map[string]string, error) {
	r, err := Read(ctx, client, namespace, policy, ttl)
	return r.Members, err
}

// Report is what the manager reads of a policy's group.
type Report struct {
	// Members maps each live replica to the configuration hash it applies (see Members).
	Members map[string]string
	// Losses counts the heartbeats that said Redis lost counts of the group (Heartbeat.Losses).
	Losses int64
}

// Read returns the group's Report. It reads one group whole, up to MaxMembers (about 5 MiB):
// for tests and tools that look at one group. The manager reads a namespace's groups with
// Summarize, which bounds what it reads of all of them together.
func Read(ctx context.Context, client redis.UniversalClient, namespace, policy string, ttl time.Duration) (Report, error) {
	cmd := scripts.EvalSha(ctx, membersScript, []string{GroupKey(namespace, policy), GroupConfigKey(namespace, policy)},
		ttl.Milliseconds(), MaxMembers, MaxMemberBytes)
	cmds := []redis.Cmder{cmd}
	scripts.Exec(ctx, client, cmds, []scripts.Script{membersScript})
	reply, err := cmds[0].(*redis.Cmd).Slice()
	if err != nil {
		return Report{}, fmt.Errorf("reading policy group %s/%s: %w", namespace, policy, err)
	}
	if len(reply) < 2 || len(reply)%2 != 0 {
		return Report{}, fmt.Errorf("reading policy group %s/%s: unexpected reply of %d values", namespace, policy, len(reply))
	}
	losses, _ := reply[1].(int64)
	out := Report{Members: make(map[string]string, len(reply)/2-1), Losses: losses}
	for i := 2; i+1 < len(reply); i += 2 {
		m, _ := reply[i].(string)
		h, _ := reply[i+1].(string)
		out.Members[m] = h
	}
	return out, nil
}
