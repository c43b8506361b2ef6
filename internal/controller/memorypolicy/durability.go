package memorypolicy

import (
	"context"
	"errors"
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
	// Save is the node's RDB snapshot rules (CONFIG GET save, "3600 1 300 100"; "" for none),
	// read only where AOF is off: INFO does not carry them. SaveKnown is false where CONFIG is
	// refused or renamed. BgsaveOK is INFO persistence's rdb_last_bgsave_status:ok.
	Save      string
	SaveKnown bool
	BgsaveOK  bool
}

// maxSaveRules bounds the save rules quoted in a message.
const maxSaveRules = 128

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

// ReadNodeDurability reads the node's version, append-only file, last snapshot's status and
// replicas from INFO, which managed Redis services answer where they refuse CONFIG GET. On a
// node without the append-only file it asks CONFIG GET save for the snapshot rules, which INFO
// does not report; a refusal (renamed command, ACL) leaves them unknown, not an error.
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
	n.BgsaveOK = fields["rdb_last_bgsave_status"] == "ok"
	if n.Version == "" || fields["role"] == "" || fields["aof_enabled"] == "" || fields["rdb_last_bgsave_status"] == "" {
		return n, fmt.Errorf("reading INFO persistence on %s: redis_version, role, aof_enabled or rdb_last_bgsave_status missing", n.Addr)
	}
	if n.AOF {
		return n, nil
	}
	save, err := c.ConfigGet(ctx, "save").Result()
	var refused redis.Error
	switch {
	case errors.As(err, &refused):
		return n, nil // CONFIG renamed or refused: the rules stay unknown
	case err != nil:
		return n, fmt.Errorf("reading CONFIG GET save on %s: %w", n.Addr, err)
	}
	n.Save, n.SaveKnown = save["save"]
	if len(n.Save) > maxSaveRules {
		n.Save = n.Save[:maxSaveRules] + "..."
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
	// A master that snapshots loses less than one that does not: it decides only if nothing
	// worse does.
	var sinceSnapshot string
	for _, r := range rules {
		for _, m := range masters {
			switch mode := durabilityMode(r); {
			case mode == v1alpha1.DurabilityAppendOnlyFile && !m.WaitAOF():
				return metav1.ConditionFalse, v1alpha1.ReasonDurabilityUnsupported, fmt.Sprintf("rule %s asks durability AppendOnlyFile, but %s runs Redis %s, which has no WAITAOF (7.2 or later): its grants are answered without the acknowledgement (redline_sidecar_durability_unacknowledged_total{reason=\"unsupported\"}); upgrade Redis, or ask Replica", r.Name, m.Addr, m.Version)
			case mode == v1alpha1.DurabilityAppendOnlyFile && !m.AOF:
				return metav1.ConditionFalse, v1alpha1.ReasonCountsLostOnRestart, fmt.Sprintf("rule %s asks durability AppendOnlyFile, but %s runs with appendonly no: WAITAOF fails and its grants are answered without the acknowledgement; set appendonly yes", r.Name, m.Addr)
			case mode == v1alpha1.DurabilityReplica && m.Replicas < 1:
				return metav1.ConditionFalse, v1alpha1.ReasonNoReplica, fmt.Sprintf("rule %s asks durability Replica, but the master %s has no replica connected: every grant waits its whole timeout and is answered without the acknowledgement; add a replica, or ask AppendOnlyFile", r.Name, m.Addr)
			case longWindow(r) && !m.AOF && m.SaveKnown && m.Save != "" && m.BgsaveOK:
				if sinceSnapshot == "" {
					sinceSnapshot = fmt.Sprintf("rule %s counts a %s window in %s's memory, which runs with appendonly no and RDB snapshots only (save %q: after so many seconds if so many keys changed): a restart loses what was counted since the last snapshot; set appendonly yes with appendfsync everysec or always", r.Name, window(r), m.Addr, m.Save)
				}
			case longWindow(r) && !m.AOF:
				return metav1.ConditionFalse, v1alpha1.ReasonCountsLostOnRestart, fmt.Sprintf("rule %s counts a %s window in %s's memory, which runs with appendonly no %s; set appendonly yes with appendfsync everysec or always", r.Name, window(r), m.Addr, withoutSnapshot(m))
			}
		}
	}
	if sinceSnapshot != "" {
		return metav1.ConditionFalse, v1alpha1.ReasonCountsLostSinceSnapshot, sinceSnapshot
	}
	return metav1.ConditionTrue, v1alpha1.ReasonDurable, fmt.Sprintf("the durability of every long-window rule and every rule asking it holds on all %d Redis masters (append-only file, replicas, WAITAOF as needed)", len(masters))
}

// withoutSnapshot says what a master without the append-only file keeps through a restart
// when no working snapshot bounds the loss.
func withoutSnapshot(m NodeDurability) string {
	switch {
	case m.SaveKnown && m.Save == "":
		return `and no RDB snapshots (save ""): a restart loses the window's counts (a replica of it resyncs to the empty master)`
	case !m.BgsaveOK:
		return "and its last RDB snapshot failed (rdb_last_bgsave_status:err, see its log): a restart loses every count since the last snapshot that succeeded, however old, and with stop-writes-on-bgsave-error yes it refuses writes meanwhile"
	default:
		return "and its RDB snapshot rules are unreadable (CONFIG GET save refused): a restart loses at least what was counted since the last snapshot, and the window's counts if it takes none"
	}
}

// window names a rule's window for a message: its duration, or its calendar unit.
func window(r v1alpha1.Rule) string {
	if r.Limit.Calendar != nil {
		return "calendar " + string(r.Limit.Calendar.Unit)
	}
	return r.Limit.Window.Duration.String()
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
