package fleet

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redline-dev/redline/internal/limiter/scripts"
)

// What the manager reads of a namespace's groups, in all, per reading (Summarize): a tenant
// writes its groups' keys with its own Redis user, as many and as large as it likes, and the
// manager reads every namespace's groups every resync, so what one reading costs must not
// depend on what the tenant wrote. Read whole, 20 groups of MaxMembers members with
// 256-byte names made one reconcile retain 122 MiB; about 40 took the manager over its 256Mi
// limit, and it crash-looped on the namespace at every start.
const (
	// NamespaceMembers is the most members read in all of a namespace's groups per
	// Summarize, 10,000: the connections of Redis's default maxclients (10,000) cap the
	// sidecars of all namespaces together far below that (each holds a pool of several), so it
	// only binds when a sidecar beats in many policies (40 policies over 250 pods) or when the
	// tenant writes heartbeats of its own. A group that does not fit is counted, not read.
	NamespaceMembers = 10000
	// SummaryBytes is the most bytes of a member's name or configuration hash read: a
	// configuration hash is 64 hex digits (SHA-256, policydoc), and the pod names Kubernetes
	// generates are at most 63 bytes. A longer name is cut, only for the condition's message.
	SummaryBytes = 64
	// GroupSlack is what each group's read allows over the live count it had a moment before,
	// for the replicas that start between the count and the read; it is taken from the
	// namespace's NamespaceMembers like the count, so the bound holds.
	GroupSlack = 8
	// StaleNames is how many names of the replicas still on another configuration a Summary
	// keeps: the smallest, for a message a person reads.
	StaleNames = 5
)

// Summary is what the manager keeps of one policy's group: counts and a few names, never the
// members, so that it is a few hundred bytes whatever the group holds.
type Summary struct {
	// Err is why the group could not be read; the other fields are then zero.
	Err error
	// Live counts the live replicas of the group (see Members), read or not.
	Live int64
	// Losses counts the heartbeats that said Redis lost counts of the group (Heartbeat.Losses).
	Losses int64
	// OverBound says the group was counted but not read: its live replicas did not fit in
	// what was left of Bound once the namespace's smaller groups were read.
	OverBound bool
	// Bound is the namespace's bound this reading applied (members of all its groups).
	Bound int
	// Read counts the members read, Current those of them that apply the hash asked about.
	Read, Current int64
	// Stale names the StaleNames smallest members read that apply another hash, sorted, each
	// cut to SummaryBytes.
	Stale []string
}

// Summarize reads the groups of policies of namespace and tells, of each, in the order of
// policies, how many replicas are live and how many apply configuration hash, reading at most
// bound members in all (NamespaceMembers when bound <= 0) and SummaryBytes of each.
//
// It counts every group first (one pipeline of the members script, asked for no member: each a
// ZCOUNT and an HGET in Redis), then reads whole, smallest first, the groups that fit in what
// is left of bound (a second pipeline, each group asked for no more than its count and
// GroupSlack): a namespace whose sidecars all beat in a few large groups has those read, and
// one large group does not stop the smaller ones being read. Each group is read by one call of
// the script, atomic in Redis, on Redis's clock. What it allocates is bounded by bound and
// SummaryBytes, and what it returns by StaleNames per group.
func Summarize(ctx context.Context, client redis.UniversalClient, namespace, hash string, policies []string, ttl time.Duration, bound int) []Summary {
	if bound <= 0 {
		bound = NamespaceMembers
	}
	out := make([]Summary, len(policies))
	if len(policies) == 0 {
		return out
	}
	counts := make([]redis.Cmder, len(policies))
	for i, p := range policies {
		counts[i] = membersCmd(ctx, namespace, p, ttl, 0)
	}
	scripts.Exec(ctx, client, counts, []scripts.Script{membersScript})
	for i, c := range counts {
		out[i].Bound = bound
		reply, err := c.(*redis.Cmd).Slice()
		if err == nil && len(reply) != 2 {
			err = fmt.Errorf("unexpected reply of %d values", len(reply))
		}
		if err != nil {
			out[i].Err = fmt.Errorf("counting the group of policy %s/%s: %w", namespace, policies[i], err)
			continue
		}
		out[i].Live, _ = reply[0].(int64)
		out[i].Losses, _ = reply[1].(int64)
	}

	order := make([]int, 0, len(policies))
	for i := range out {
		if out[i].Err == nil && out[i].Live > 0 {
			order = append(order, i)
		}
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(out[a].Live, out[b].Live) })
	left := int64(bound)
	var reads []redis.Cmder
	var readOf []int
	for _, i := range order {
		// One group is read by one call of the script, which reads at most MaxMembers: one
		// with more live replicas is counted, not read, whatever is left of bound.
		most := min(out[i].Live+GroupSlack, MaxMembers)
		if out[i].Live > MaxMembers || most > left {
			out[i].OverBound = true
			continue
		}
		left -= most
		reads = append(reads, membersCmd(ctx, namespace, policies[i], ttl, most))
		readOf = append(readOf, i)
	}
	if len(reads) == 0 {
		return out
	}
	scripts.Exec(ctx, client, reads, []scripts.Script{membersScript})
	for k, c := range reads {
		i := readOf[k]
		s, err := summarize(c.(*redis.Cmd), hash)
		if err != nil {
			out[i] = Summary{Err: fmt.Errorf("reading the group of policy %s/%s: %w", namespace, policies[i], err), Bound: bound}
			continue
		}
		s.Bound = bound
		out[i] = s
	}
	return out
}

func membersCmd(ctx context.Context, namespace, policy string, ttl time.Duration, most int64) *redis.Cmd {
	return scripts.EvalSha(ctx, membersScript, []string{GroupKey(namespace, policy), GroupConfigKey(namespace, policy)},
		ttl.Milliseconds(), most, SummaryBytes)
}

// summarize folds one reply of the members script into counts and the smallest stale names.
func summarize(cmd *redis.Cmd, hash string) (Summary, error) {
	reply, err := cmd.Slice()
	if err != nil {
		return Summary{}, err
	}
	if len(reply) < 2 || len(reply)%2 != 0 {
		return Summary{}, fmt.Errorf("unexpected reply of %d values", len(reply))
	}
	var s Summary
	s.Live, _ = reply[0].(int64)
	s.Losses, _ = reply[1].(int64)
	// The hash compared is cut as the script cuts what it returns.
	want := hash[:min(len(hash), SummaryBytes)]
	for i := 2; i+1 < len(reply); i += 2 {
		m, _ := reply[i].(string)
		h, _ := reply[i+1].(string)
		s.Read++
		if h == want {
			s.Current++
			continue
		}
		s.Stale = keepSmallest(s.Stale, m)
	}
	return s, nil
}

// keepSmallest inserts name into names, sorted, and keeps the StaleNames smallest. The name is
// copied: a slice of the reply would keep the reply's memory.
func keepSmallest(names []string, name string) []string {
	i, _ := slices.BinarySearch(names, name)
	if i >= StaleNames {
		return names
	}
	names = slices.Insert(names, i, strings.Clone(name))
	if len(names) > StaleNames {
		names = names[:StaleNames]
	}
	return names
}
