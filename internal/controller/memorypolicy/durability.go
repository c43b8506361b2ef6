package memorypolicy

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/redline-dev/redline/api/v1alpha1"
	"github.com/redline-dev/redline/internal/controller/loop"
)

// Why the manager checks Redis's persistence beside its memory policy.
//
// A day's or a month's count lives in the master's memory. A restart without an append-only
// file loses it (an RDB snapshot keeps what it held at its last save), and a replica of a
// master restarted empty resyncs to empty too. A rule can ask its grants to wait for a replica
// (WAIT) or the append-only file (WAITAOF, Redis 7.2+), but the sidecar cannot tell whether the
// Redis can give it: with no replica every WAIT runs to its timeout, with appendonly no or a
// Redis before 7.2 every WAITAOF fails, and grants then stand unacknowledged. So the same pass
// that reads every node's memory policy reads its persistence and replication, and a policy
// with a long-window rule (v1alpha1.LongWindow or longer) or a rule asking durability gets the
// RedisDurability condition, and an Event when it turns False or back to True.

// NodeDurability is what one Redis node reports of its persistence and replication.
type NodeDurability struct {
	Addr    string
	Version string // INFO server's redis_version
	Master  bool   // INFO replication's role
	// AOF is INFO persistence's aof_enabled; Replicas is connected_slaves of a master.
	AOF      bool
	Replicas int64
}

// WaitAOF says whether the node knows WAITAOF (Redis 7.2 or later).
func (n NodeDurability) WaitAOF() bool {
	f := strings.SplitN(n.Version, ".", 3)
	if len(f) < 2 {
		return false
	}
	major, _ := strconv.Atoi(f[0])
	minor, _ := strconv.Atoi(f[1])
	return major > 7 || major == 7 && minor >= 2
}

// ReadNodeDurability reads the node's version, append-only file and replicas from INFO, which
// managed Redis services answer where they refuse CONFIG GET.
func ReadNodeDurability(ctx context.Context, c *redis.Client) (NodeDurability, error) {
	n := NodeDurability{Addr: c.Options().Addr}
	info, err := c.Info(ctx, "server", "persistence", "replication").Result()
	if err != nil {
		return n, fmt.Errorf("reading INFO persistence on %s: %w", n.Addr, err)
	}
	fields := map[string]string{}
	for line := range strings.Lines(info) {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok {
			fields[k] = v
		}
	}
	n.Version, n.Master, n.AOF = fields["redis_version"], fields["role"] == "master", fields["aof_enabled"] == "1"
	n.Replicas, _ = strconv.ParseInt(fields["connected_slaves"], 10, 64)
	if n.Version == "" || fields["role"] == "" || fields["aof_enabled"] == "" {
		return n, fmt.Errorf("reading INFO persistence on %s: redis_version, role or aof_enabled missing", n.Addr)
	}
	return n, nil
}

// concernsDurability says whether a policy carries the RedisDurability condition: it has a
// rule whose window is long or that asks for durability.
func concernsDurability(rules []v1alpha1.Rule) bool {
	return slices.ContainsFunc(rules, func(r v1alpha1.Rule) bool { return longWindow(r) || durabilityMode(r) != v1alpha1.DurabilityNone })
}

// longWindow says whether a rule counts over a long window: one of an hour or more, or a
// calendar's day, week or month.
func longWindow(r v1alpha1.Rule) bool {
	return r.Limit.Calendar != nil || r.Limit.Window.Duration >= v1alpha1.LongWindow
}

func durabilityMode(r v1alpha1.Rule) v1alpha1.DurabilityMode {
	if r.Durability == nil || r.Durability.Mode == "" {
		return v1alpha1.DurabilityNone
	}
	return r.Durability.Mode
}

// durabilityCondition is the RedisDurability condition of a policy with rules, from what
// every node of its Redis reported: pure, so that its messages are tested without a Redis.
func durabilityCondition(rules []v1alpha1.Rule, nodes []NodeDurability, err error) (metav1.ConditionStatus, string, string) {
	if err != nil {
		return metav1.ConditionUnknown, v1alpha1.ReasonMemoryUnknown, "cannot read Redis's persistence (INFO persistence): " + err.Error()
	}
	var masters []NodeDurability
	for _, n := range nodes {
		if n.Master {
			masters = append(masters, n)
		}
	}
	slices.SortFunc(masters, func(a, b NodeDurability) int { return strings.Compare(a.Addr, b.Addr) })
	for _, r := range rules {
		for _, m := range masters {
			switch mode := durabilityMode(r); {
			case mode == v1alpha1.DurabilityAppendOnlyFile && !m.WaitAOF():
				return metav1.ConditionFalse, v1alpha1.ReasonDurabilityUnsupported, fmt.Sprintf("rule %s asks durability AppendOnlyFile, but %s runs Redis %s, which has no WAITAOF (7.2 or later): its grants are answered without the acknowledgement (redline_sidecar_durability_unacknowledged_total{reason=\"unsupported\"}); upgrade Redis, or ask Replica", r.Name, m.Addr, m.Version)
			case mode == v1alpha1.DurabilityAppendOnlyFile && !m.AOF:
				return metav1.ConditionFalse, v1alpha1.ReasonCountsLostOnRestart, fmt.Sprintf("rule %s asks durability AppendOnlyFile, but %s runs with appendonly no: WAITAOF fails and its grants are answered without the acknowledgement; set appendonly yes", r.Name, m.Addr)
			case mode == v1alpha1.DurabilityReplica && m.Replicas < 1:
				return metav1.ConditionFalse, v1alpha1.ReasonNoReplica, fmt.Sprintf("rule %s asks durability Replica, but the master %s has no replica connected: every grant waits its whole timeout and is answered without the acknowledgement; add a replica, or ask AppendOnlyFile", r.Name, m.Addr)
			case longWindow(r) && !m.AOF:
				return metav1.ConditionFalse, v1alpha1.ReasonCountsLostOnRestart, fmt.Sprintf("rule %s counts a %s window in %s's memory, which runs with appendonly no: a restart loses the window's counts (a replica of it resyncs to the empty master; an RDB snapshot keeps only what it held at its last save); set appendonly yes with appendfsync everysec or always", r.Name, r.Limit.Window.Duration, m.Addr)
			}
		}
	}
	return metav1.ConditionTrue, v1alpha1.ReasonDurable, fmt.Sprintf("the durability of every long-window rule and every rule asking it holds on all %d Redis masters (append-only file, replicas, WAITAOF as needed)", len(masters))
}

// setDurabilityCondition writes p's RedisDurability condition from what its Redis's nodes
// said, with an Event where it turns False (or changes reason) or back to True, and removes it
// from a policy it no longer concerns.
func (r *Reconciler) setDurabilityCondition(ctx context.Context, p *v1alpha1.RateLimitPolicy, res memoryResult) error {
	if !concernsDurability(p.Spec.Rules) {
		return loop.RemovePolicyCondition(ctx, r.Client, p, v1alpha1.ConditionRedisDurability)
	}
	status, reason, msg := durabilityCondition(p.Spec.Rules, res.durable, res.err)
	msg = loop.Message(msg)
	prev, written, err := loop.SetPolicyCondition(ctx, r.Client, p, metav1.Condition{
		Type: v1alpha1.ConditionRedisDurability, Status: status, Reason: reason, Message: msg,
	})
	if err != nil || !written || r.Recorder == nil {
		return err
	}
	switch {
	case status == metav1.ConditionFalse && (prev == nil || prev.Reason != reason):
		r.Recorder.Eventf(p, nil, corev1.EventTypeWarning, reason, "RedisDurability", "%s", msg)
	case status == metav1.ConditionTrue && prev != nil && prev.Status == metav1.ConditionFalse:
		r.Recorder.Eventf(p, nil, corev1.EventTypeNormal, reason, "RedisDurability", "%s", msg)
	}
	return nil
}
