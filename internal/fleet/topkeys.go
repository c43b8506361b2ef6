package fleet

import (
	"bytes"
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redline-dev/redline/internal/limiter/scripts"
	"github.com/redline-dev/redline/internal/topkeys"
)

// Top keys: each sidecar keeps, per rule, a sketch of the keys it refused (and, for a rule
// with a candidate limit, of those the candidate would have refused) over one heartbeat
// interval, and publishes it with its heartbeat, in a key of its own beside its group
// (SummaryKey) with the heartbeat's TTL. The manager reads the live members' summaries of a
// group (ReadSummaries) and merges them per rule into the policy's status.
//
// What a replica publishes and what the manager reads are bounded in bytes, not in entries
// alone: a tenant writes these keys with its own Redis user, any size it likes.
const (
	// SummaryMaxBytes is the most bytes of one replica's summary of one policy: the heartbeat
	// script refuses a longer one (group_heartbeat.lua), and stores it after its Redis time
	// stamp, in at most SummaryStoredBytes, which is what the manager reads of one
	// (group_summaries.lua). EncodeSummary fits what a sidecar publishes in it.
	SummaryMaxBytes    = SummaryStoredBytes - 32
	SummaryStoredBytes = 16 << 10
	// SummaryReadBytes is the most bytes of summaries one call of the read script returns,
	// whatever its arguments (group_summaries.lua).
	SummaryReadBytes = 4 << 20
	// SummaryEntries is the most entries of one list (refused, or a candidate's would-refuse)
	// of one rule a replica publishes, and the manager keeps per replica.
	SummaryEntries = 8
	// NamespaceSummaryBytes is the most bytes of summaries the manager reads of a namespace's
	// groups, in all, per reading (ReadSummaries): 2 MiB, 128 full summaries.
	NamespaceSummaryBytes = 2 << 20
	// summaryVersion is the format's version: a summary of another is skipped.
	summaryVersion = 1
	// keyHexBytes is how a key is named in a summary: the limiter's hash, 32 hex digits (the
	// last part of its Redis key), so an operator can find the key's state in Redis.
	keyHexBytes = 32
)

//go:embed group_summaries.lua
var summariesSource string

var summariesScript = scripts.New("GroupSummaries", summariesSource)

// ManagerScripts are the scripts the manager runs to read groups (not a sidecar's).
func ManagerScripts() []scripts.Script { return []scripts.Script{membersScript, summariesScript} }

// SummaryKey is the key of instance's summary of policy's top keys: the group's key and
// ":top:<instance>", in the group's slot and under the namespace's prefix.
func SummaryKey(namespace, policy, instance string) string {
	return GroupKey(namespace, policy) + ":top:" + instance
}

// TopEntry is one key of a published list.
type TopEntry struct {
	// Key is the key's hash (32 hex digits).
	Key string `json:"k"`
	// Label is the key's readable form, only where the policy opts in.
	Label string `json:"l,omitempty"`
	// Count over-estimates the key's count by at most Err (see topkeys.Entry).
	Count uint64 `json:"n"`
	Err   uint64 `json:"e,omitempty"`
}

// TopList is a published list: how many in all, and the heaviest keys.
type TopList struct {
	// Total counts every decision of the list's kind (refused, or would-refuse).
	Total uint64 `json:"n"`
	// Min is the sketch's Min (see topkeys.Snapshot).
	Min uint64     `json:"m,omitempty"`
	Top []TopEntry `json:"t,omitempty"`
}

// RuleSummary is what one replica counted of one rule over one interval.
type RuleSummary struct {
	Rule string `json:"r"`
	// Decisions counts the rule's decisions (admitted and refused).
	Decisions uint64 `json:"a"`
	// Refused lists the keys the rule refused.
	Refused TopList `json:"d"`
	// Candidate lists the keys the rule's candidate limit would have refused; nil for a rule
	// without one.
	Candidate *TopList `json:"c,omitempty"`
	// InFlight is what an in-flight rule's slots are doing in the replica; nil for another rule.
	InFlight *InFlightSummary `json:"f,omitempty"`
	// Quota lists the heaviest users of a long window's current period; nil for another rule.
	Quota *QuotaSummary `json:"q,omitempty"`
}

// InFlightSummary is what one replica holds of an in-flight rule's slots.
type InFlightSummary struct {
	// Held counts the slots the replica holds at the summary's time, Peak the most it held at
	// once over the interval, Queued the requests waiting in it for a slot.
	Held   uint64 `json:"h"`
	Peak   uint64 `json:"p,omitempty"`
	Queued uint64 `json:"w,omitempty"`
	// Top lists the keys holding the most slots at the summary's time (Total: Held).
	Top TopList `json:"t"`
}

// QuotaSummary is what one replica saw of a long window's heaviest users.
type QuotaSummary struct {
	// EndMS is when the calendar period the counts are of ends (ms since the epoch, derived
	// from Redis's answers); 0 for a rolling window.
	EndMS int64 `json:"e,omitempty"`
	// Top lists the keys that used the most of the period's quota, each with its latest count
	// as Redis answered the replica (Count; Err unused).
	Top []TopEntry `json:"t,omitempty"`
}

// PolicySummary is one replica's summary of one policy.
type PolicySummary struct {
	Version int `json:"v"`
	// IntervalMS is how long the summary counted (ms): the time since the previous one.
	IntervalMS int64         `json:"i"`
	Rules      []RuleSummary `json:"r"`
}

// ListFromSnapshot is what a replica publishes of a sketch's snapshot: the total, and the
// SummaryEntries heaviest keys. A key not of the limiter's 32 hex digits is left out.
func ListFromSnapshot(s topkeys.Snapshot) TopList {
	l := TopList{Total: s.Total, Min: s.Min}
	for _, e := range s.Entries {
		if len(l.Top) == SummaryEntries {
			// A key left out may have been counted up to this entry's count.
			l.Min = max(l.Min, e.Count)
			break
		}
		if !validKey(e.Key) {
			continue
		}
		l.Top = append(l.Top, TopEntry{Key: e.Key, Label: e.Label, Count: e.Count, Err: e.Err})
	}
	return l
}

// Snapshot is l as topkeys merges it.
func (l TopList) Snapshot() topkeys.Snapshot {
	s := topkeys.Snapshot{Total: l.Total, Min: l.Min, Entries: make([]topkeys.Entry, len(l.Top))}
	for i, e := range l.Top {
		s.Entries[i] = topkeys.Entry{Key: e.Key, Label: e.Label, Count: e.Count, Err: e.Err}
	}
	return s
}

// EncodeSummary encodes s in at most SummaryMaxBytes: when it does not fit, the lists are cut
// to fewer entries (halved until one), then labels go, then the last rules, so a summary is
// always published, smaller. It returns nil for a summary with no decision in it.
func EncodeSummary(s PolicySummary) []byte {
	s.Version = summaryVersion
	s.Rules = slices.DeleteFunc(slices.Clone(s.Rules), func(r RuleSummary) bool {
		return r.Decisions == 0 && r.Refused.Total == 0 && (r.Candidate == nil || r.Candidate.Total == 0) &&
			(r.InFlight == nil || r.InFlight.Held == 0 && r.InFlight.Peak == 0 && r.InFlight.Queued == 0) &&
			(r.Quota == nil || len(r.Quota.Top) == 0)
	})
	if len(s.Rules) == 0 {
		return nil
	}
	b, err := json.Marshal(s)
	for n := SummaryEntries / 2; err == nil && len(b) > SummaryMaxBytes && n >= 1; n /= 2 {
		s = cutLists(s, n, false)
		b, err = json.Marshal(s)
	}
	if err == nil && len(b) > SummaryMaxBytes {
		s = cutLists(s, 1, true)
		b, err = json.Marshal(s)
	}
	for err == nil && len(b) > SummaryMaxBytes && len(s.Rules) > 1 {
		s.Rules = s.Rules[:len(s.Rules)/2]
		b, err = json.Marshal(s)
	}
	if err != nil || len(b) > SummaryMaxBytes {
		return nil // rule names are at most 63 bytes: one rule always fits
	}
	return b
}

func cutLists(s PolicySummary, n int, noLabels bool) PolicySummary {
	rules := make([]RuleSummary, len(s.Rules))
	for i, r := range s.Rules {
		r.Refused = cutList(r.Refused, n, noLabels)
		if r.Candidate != nil {
			c := cutList(*r.Candidate, n, noLabels)
			r.Candidate = &c
		}
		if r.InFlight != nil {
			f := *r.InFlight
			f.Top = cutList(f.Top, n, noLabels)
			r.InFlight = &f
		}
		if r.Quota != nil {
			q := *r.Quota
			q.Top = cutList(TopList{Top: q.Top}, n, noLabels).Top
			r.Quota = &q
		}
		rules[i] = r
	}
	s.Rules = rules
	return s
}

func cutList(l TopList, n int, noLabels bool) TopList {
	if len(l.Top) > n {
		l.Min = max(l.Min, l.Top[n].Count)
		l.Top = l.Top[:n]
	}
	if noLabels {
		top := slices.Clone(l.Top)
		for i := range top {
			top[i].Label = ""
		}
		l.Top = top
	}
	return l
}

// decodeStored splits what the heartbeat stored into its stamp and its summary.
func decodeStored(v string) (int64, PolicySummary, error) {
	stamp, rest, ok := strings.Cut(v, " ")
	n, err := strconv.ParseInt(stamp, 10, 64)
	if !ok || err != nil || n < 0 {
		return 0, PolicySummary{}, fmt.Errorf("%w: no time stamp", ErrInvalidSummary)
	}
	s, err := DecodeSummary([]byte(rest))
	return n, s, err
}

// ErrInvalidSummary is wrapped by DecodeSummary's errors: what a tenant can write need not be
// a summary.
var ErrInvalidSummary = errors.New("invalid top-keys summary")

// DecodeSummary decodes a summary read from Redis, which its namespace's tenant can write: at
// most SummaryMaxBytes are decoded; unknown fields, another version, more than MaxRules rules,
// lists over SummaryEntries or keys not of 32 hex digits are refused; labels are made
// printable and cut (topkeys.Label). What it allocates is bounded by the input's size.
func DecodeSummary(b []byte) (PolicySummary, error) {
	var s PolicySummary
	if len(b) > SummaryMaxBytes {
		return s, fmt.Errorf("%w: %d bytes, over %d", ErrInvalidSummary, len(b), SummaryMaxBytes)
	}
	d := json.NewDecoder(bytes.NewReader(b))
	d.DisallowUnknownFields()
	if err := d.Decode(&s); err != nil {
		return PolicySummary{}, fmt.Errorf("%w: %v", ErrInvalidSummary, err)
	}
	if d.More() {
		return PolicySummary{}, fmt.Errorf("%w: data after the summary", ErrInvalidSummary)
	}
	if s.Version != summaryVersion {
		return PolicySummary{}, fmt.Errorf("%w: version %d", ErrInvalidSummary, s.Version)
	}
	if s.IntervalMS < 0 || len(s.Rules) > MaxRules {
		return PolicySummary{}, fmt.Errorf("%w: interval %d ms, %d rules", ErrInvalidSummary, s.IntervalMS, len(s.Rules))
	}
	for i := range s.Rules {
		r := &s.Rules[i]
		if err := cleanList(&r.Refused); err != nil {
			return PolicySummary{}, fmt.Errorf("%w: rule %q: %v", ErrInvalidSummary, topkeys.Label(r.Rule), err)
		}
		if r.Candidate != nil {
			if err := cleanList(r.Candidate); err != nil {
				return PolicySummary{}, fmt.Errorf("%w: rule %q candidate: %v", ErrInvalidSummary, topkeys.Label(r.Rule), err)
			}
		}
		if r.InFlight != nil {
			if err := cleanList(&r.InFlight.Top); err != nil {
				return PolicySummary{}, fmt.Errorf("%w: rule %q in flight: %v", ErrInvalidSummary, topkeys.Label(r.Rule), err)
			}
		}
		if r.Quota != nil {
			l := TopList{Top: r.Quota.Top}
			if err := cleanList(&l); err != nil || r.Quota.EndMS < 0 {
				return PolicySummary{}, fmt.Errorf("%w: rule %q quota: end %d, %v", ErrInvalidSummary, topkeys.Label(r.Rule), r.Quota.EndMS, err)
			}
		}
	}
	return s, nil
}

// MaxRules is the most rules a policy holds (the API's bound), and so a summary.
const MaxRules = 32

func cleanList(l *TopList) error {
	if len(l.Top) > SummaryEntries {
		return fmt.Errorf("%d entries, over %d", len(l.Top), SummaryEntries)
	}
	for i := range l.Top {
		e := &l.Top[i]
		if !validKey(e.Key) {
			return fmt.Errorf("key %q is not %d hex digits", topkeys.Label(e.Key), keyHexBytes)
		}
		if e.Err > e.Count {
			return fmt.Errorf("key %s: error %d over its count %d", e.Key, e.Err, e.Count)
		}
		e.Label = topkeys.Label(e.Label)
	}
	return nil
}

func validKey(k string) bool {
	if len(k) != keyHexBytes {
		return false
	}
	for i := 0; i < len(k); i++ {
		c := k[i]
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// BeatWithSummaries is Beat that also publishes this instance's summary of each policy:
// summaries[i] for policies[i] (nil or empty: none, and a previous one is removed), in the
// same script call as the heartbeat, with its TTL.
func BeatWithSummaries(ctx context.Context, client redis.UniversalClient, namespace, instance, configHash string, ttl time.Duration, policies []string, lost bool, summaries [][]byte) ([]Heartbeat, error) {
	if summaries != nil && len(summaries) != len(policies) {
		return nil, fmt.Errorf("%d summaries for %d policies", len(summaries), len(policies))
	}
	return beat(ctx, client, namespace, instance, configHash, ttl, policies, lost, summaries)
}

// GroupSummaries is what the manager read of one policy's group's summaries.
type GroupSummaries struct {
	// Err is why the group could not be read.
	Err error
	// Live counts the group's live replicas; Read those whose summary was read and decoded.
	Live, Read int64
	// Invalid counts the summaries read that did not decode (a tenant's write, or one cut by
	// the bound), with the first one's error in InvalidErr.
	Invalid    int64
	InvalidErr error
	// OverBound says some live replicas' summaries were not read: the namespace's bound
	// (NamespaceSummaryBytes) was spent on its other groups.
	OverBound bool
	// Summaries are the decoded summaries, one per replica read.
	Summaries []StampedSummary
}

// StampedSummary is one replica's summary as the manager read it.
type StampedSummary struct {
	// Replica is the replica's name, made printable and cut (it is the tenant's to write).
	Replica string
	// Stamp is Redis's clock (ms) when the heartbeat stored the summary.
	Stamp int64
	PolicySummary
}

// ReadSummaries reads the summaries the live replicas of each of policies published, reading
// at most bound bytes of the namespace's summaries in all (NamespaceSummaryBytes when bound
// <= 0), so that what one reading costs the manager does not depend on what the tenant wrote:
// the groups with live replicas share bound equally, each read by one call of the script, which
// stops at its share; when there are so many groups that a share would not hold one full
// summary, only the first bound/SummaryMaxBytes groups are read and the rest are OverBound.
// live gives each group's live count, as Summarize read it a moment before (a group with none
// is not read); with live nil, every group is read (the script counts it).
func ReadSummaries(ctx context.Context, client redis.UniversalClient, namespace string, policies []string, live []int64, ttl time.Duration, bound int) []GroupSummaries {
	if bound <= 0 {
		bound = NamespaceSummaryBytes
	}
	out := make([]GroupSummaries, len(policies))
	var groups []int
	for i := range policies {
		if live == nil {
			groups = append(groups, i)
			continue
		}
		if i < len(live) {
			out[i].Live = live[i]
		}
		if out[i].Live > 0 {
			groups = append(groups, i)
		}
	}
	most := func(live int64) int64 {
		if live <= 0 {
			return MaxMembers // not counted: the script counts, and reads at most this many
		}
		return min(live+GroupSlack, MaxMembers)
	}
	if len(groups) == 0 {
		return out
	}
	if most := max(bound/SummaryStoredBytes, 1); len(groups) > most {
		for _, i := range groups[most:] {
			out[i].OverBound = true
		}
		groups = groups[:most]
	}
	share := bound / len(groups)
	cmds := make([]redis.Cmder, len(groups))
	for k, i := range groups {
		cmds[k] = scripts.EvalSha(ctx, summariesScript, []string{GroupKey(namespace, policies[i])},
			ttl.Milliseconds(), most(out[i].Live), SummaryStoredBytes, share)
	}
	scripts.Exec(ctx, client, cmds, []scripts.Script{summariesScript})
	for k, c := range cmds {
		g := &out[groups[k]]
		reply, err := c.(*redis.Cmd).Slice()
		if err == nil && (len(reply) < 2 || len(reply)%2 != 0) {
			err = fmt.Errorf("unexpected reply of %d values", len(reply))
		}
		if err != nil {
			g.Err = fmt.Errorf("reading the top keys of policy %s/%s: %w", namespace, policies[groups[k]], err)
			continue
		}
		g.Live, _ = reply[0].(int64)
		stopped, _ := reply[1].(int64)
		g.OverBound = stopped == 1
		for j := 3; j < len(reply); j += 2 {
			v, _ := reply[j].(string)
			stamp, s, err := decodeStored(v)
			if err != nil {
				g.Invalid++
				if g.InvalidErr == nil {
					name, _ := reply[j-1].(string)
					g.InvalidErr = fmt.Errorf("replica %s: %w", topkeys.Label(name), err)
				}
				continue
			}
			g.Read++
			name, _ := reply[j-1].(string)
			g.Summaries = append(g.Summaries, StampedSummary{Replica: topkeys.Label(name), Stamp: stamp, PolicySummary: s})
		}
	}
	return out
}
