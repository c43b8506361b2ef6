package fleet_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"github.com/redis/go-redis/v9"

	"github.com/redline-dev/redline/internal/fleet"
	"github.com/redline-dev/redline/internal/limiter/scripts"
	"github.com/redline-dev/redline/internal/redisconn"
	"github.com/redline-dev/redline/internal/testutil/redistest/redisclient"
	"github.com/redline-dev/redline/internal/topkeys"
)

func hexKey(i int) string { return fmt.Sprintf("%032x", i) }

// fullSummary is the largest a sidecar can have: every rule of a policy, every list full, each
// key with a label of the most bytes kept.
func fullSummary() fleet.PolicySummary {
	s := fleet.PolicySummary{IntervalMS: 5000}
	for r := range fleet.MaxRules {
		sk, cand := topkeys.New(128), topkeys.New(128) // room for all: exact counts
		for i := range 100 {
			label := strings.Repeat("x", 70) + fmt.Sprint(i)
			sk.Add(hexKey(i), uint64(1000-i), label)
			cand.Add(hexKey(i+1000), uint64(500-i), label)
		}
		c := fleet.ListFromSnapshot(cand.Take())
		var slots topkeys.Holders
		var quota []topkeys.Entry
		for i := range 100 {
			label := strings.Repeat("x", 70) + fmt.Sprint(i)
			slots.Hold(hexKey(i+2000), label, int64(100-i))
			quota = append(quota, topkeys.Entry{Key: hexKey(i + 3000), Label: label, Count: uint64(1_000_000 - i)})
		}
		s.Rules = append(s.Rules, fleet.RuleSummary{
			Rule: fmt.Sprintf("rule-%02d-%s", r, strings.Repeat("r", 50)), Decisions: 1_000_000,
			Refused: fleet.ListFromSnapshot(sk.Take()), Candidate: &c,
			InFlight: fleet.InFlightFrom(slots.Take(128)), Quota: fleet.QuotaFrom(1_800_000_000_000, quota),
		})
	}
	return s
}

func TestEncodeSummaryFitsItsBound(t *testing.T) {
	g := NewWithT(t)
	full := fullSummary()
	b := fleet.EncodeSummary(full)
	g.Expect(b).NotTo(BeEmpty())
	g.Expect(len(b)).To(BeNumerically("<=", fleet.SummaryMaxBytes))
	got, err := fleet.DecodeSummary(b)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(got.Rules).To(HaveLen(fleet.MaxRules), "every rule is kept; its lists are cut to fit")
	g.Expect(got.Rules[0].Refused.Top[0].Key).To(Equal(hexKey(0)), "the heaviest key stays")
	g.Expect(got.Rules[0].InFlight.Top.Top[0].Key).To(Equal(hexKey(2000)), "the key holding the most slots stays")
	g.Expect(got.Rules[0].Quota.Top[0].Key).To(Equal(hexKey(3000)), "the heaviest user stays")
	t.Logf("a full summary (%d rules, lists of %d with %d-byte labels) encodes in %d bytes with %d entries per list",
		fleet.MaxRules, fleet.SummaryEntries, topkeys.MaxLabelBytes, len(b), len(got.Rules[0].Refused.Top))

	// A small one keeps everything.
	small := fleet.PolicySummary{IntervalMS: 5000, Rules: full.Rules[:1]}
	got, err = fleet.DecodeSummary(fleet.EncodeSummary(small))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(got.Rules[0].Refused.Top).To(HaveLen(fleet.SummaryEntries))
	g.Expect(got.Rules[0].InFlight.Top.Top).To(HaveLen(fleet.SummaryEntries))
	g.Expect(got.Rules[0].InFlight.Held).To(BeEquivalentTo(5050))
	g.Expect(got.Rules[0].Quota.Top).To(HaveLen(fleet.SummaryEntries))
	g.Expect(got.Rules[0].Quota.EndMS).To(BeEquivalentTo(1_800_000_000_000))
	g.Expect(got.Rules[0].Refused.Top[0].Label).To(Equal(strings.Repeat("x", topkeys.MaxLabelBytes)))
	g.Expect(got.Rules[0].Refused.Min).To(BeEquivalentTo(1000-fleet.SummaryEntries),
		"a key cut from the list may have been counted as often as the first one cut")

	// Nothing counted, nothing published; slots held or a quota used are said without a decision.
	g.Expect(fleet.EncodeSummary(fleet.PolicySummary{Rules: []fleet.RuleSummary{{Rule: "idle"}}})).To(BeNil())
	g.Expect(fleet.EncodeSummary(fleet.PolicySummary{Rules: []fleet.RuleSummary{{Rule: "idle", InFlight: &fleet.InFlightSummary{}}}})).To(BeNil())
	g.Expect(fleet.EncodeSummary(fleet.PolicySummary{Rules: []fleet.RuleSummary{{Rule: "streams", InFlight: &fleet.InFlightSummary{Held: 1}}}})).NotTo(BeNil())
	g.Expect(fleet.EncodeSummary(fleet.PolicySummary{Rules: []fleet.RuleSummary{{Rule: "month", Quota: fleet.QuotaFrom(1, []topkeys.Entry{{Key: hexKey(1), Count: 5}})}}})).NotTo(BeNil())
	g.Expect(fleet.QuotaFrom(1, []topkeys.Entry{{Key: "not-a-hash", Count: 5}})).To(BeNil(), "a key not of the limiter's form is left out")
}

func TestDecodeSummaryRefusesWhatIsNotOne(t *testing.T) {
	good := func(mut func(m map[string]any)) []byte {
		m := map[string]any{"v": 1, "i": 5000, "r": []any{map[string]any{"r": "a", "a": 3, "d": map[string]any{"n": 1, "t": []any{map[string]any{"k": hexKey(1), "n": 1}}}}}}
		mut(m)
		b, _ := json.Marshal(m)
		return b
	}
	rule := func(m map[string]any) map[string]any { return m["r"].([]any)[0].(map[string]any) }
	entry := func(m map[string]any) map[string]any {
		return rule(m)["d"].(map[string]any)["t"].([]any)[0].(map[string]any)
	}
	if _, err := fleet.DecodeSummary(good(func(map[string]any) {})); err != nil {
		t.Fatalf("the valid base case: %v", err)
	}
	cases := map[string][]byte{
		"not json":        []byte("{"),
		"trailing data":   append(good(func(map[string]any) {}), []byte(" {}")...),
		"another version": good(func(m map[string]any) { m["v"] = 2 }),
		"unknown field":   good(func(m map[string]any) { m["x"] = 1 }),
		"too many rules": good(func(m map[string]any) {
			rs := make([]any, fleet.MaxRules+1)
			for i := range rs {
				rs[i] = map[string]any{"r": "a", "a": 1, "d": map[string]any{"n": 0}}
			}
			m["r"] = rs
		}),
		"too many entries": good(func(m map[string]any) {
			es := make([]any, fleet.SummaryEntries+1)
			for i := range es {
				es[i] = map[string]any{"k": hexKey(i), "n": 1}
			}
			rule(m)["d"].(map[string]any)["t"] = es
		}),
		"key not a hash":  good(func(m map[string]any) { entry(m)["k"] = "alice" }),
		"upper-case hex":  good(func(m map[string]any) { entry(m)["k"] = strings.ToUpper(hexKey(10)) }),
		"negative count":  good(func(m map[string]any) { entry(m)["n"] = -1 }),
		"count too large": []byte(strings.Replace(string(good(func(map[string]any) {})), `"n":1,`, `"n":1e30,`, 1)),
		"err over count":  good(func(m map[string]any) { entry(m)["e"] = 2 }),
		"over the bound":  append(good(func(map[string]any) {}), make([]byte, fleet.SummaryMaxBytes)...),
		"slots: too many entries": good(func(m map[string]any) {
			es := make([]any, fleet.SummaryEntries+1)
			for i := range es {
				es[i] = map[string]any{"k": hexKey(i), "n": 1}
			}
			rule(m)["f"] = map[string]any{"h": 9, "t": map[string]any{"n": 9, "t": es}}
		}),
		"slots: key not a hash": good(func(m map[string]any) {
			rule(m)["f"] = map[string]any{"h": 1, "t": map[string]any{"n": 1, "t": []any{map[string]any{"k": "bob", "n": 1}}}}
		}),
		"slots: negative held": good(func(m map[string]any) { rule(m)["f"] = map[string]any{"h": -1, "t": map[string]any{"n": 0}} }),
		"quota: negative end":  good(func(m map[string]any) { rule(m)["q"] = map[string]any{"e": -5} }),
		"quota: too many users": good(func(m map[string]any) {
			es := make([]any, fleet.SummaryEntries+1)
			for i := range es {
				es[i] = map[string]any{"k": hexKey(i), "n": 1}
			}
			rule(m)["q"] = map[string]any{"e": 5, "t": es}
		}),
		"quota: unknown field": good(func(m map[string]any) { rule(m)["q"] = map[string]any{"e": 5, "z": 1} }),
	}
	for name, b := range cases {
		if _, err := fleet.DecodeSummary(b); !errors.Is(err, fleet.ErrInvalidSummary) {
			t.Errorf("%s: DecodeSummary = %v, want ErrInvalidSummary", name, err)
		}
	}
	s, err := fleet.DecodeSummary(good(func(m map[string]any) { entry(m)["l"] = "\x1b[31mred" }))
	if err != nil || s.Rules[0].Refused.Top[0].Label != "?[31mred" {
		t.Errorf("a label with an escape sequence decodes as %+v, %v: want it printable", s, err)
	}
}

func refusedSummary(rule string, keys ...int) []byte {
	sk := topkeys.New(16)
	for _, k := range keys {
		sk.Add(hexKey(k), uint64(10*(k+1)), "")
	}
	return fleet.EncodeSummary(fleet.PolicySummary{IntervalMS: 1000, Rules: []fleet.RuleSummary{{Rule: rule, Decisions: 100, Refused: fleet.ListFromSnapshot(sk.Take())}}})
}

// Replicas publish their summaries with their heartbeats; the manager reads the live ones.
func TestSummariesArePublishedWithTheHeartbeat(t *testing.T) {
	g := NewWithT(t)
	c := redisclient.Fresh(t, redisconn.Options{})
	ctx := context.Background()
	const ns, ttl = "shop", 3 * time.Second
	for i, pod := range []string{"pod-a", "pod-b", "pod-c"} {
		_, err := fleet.BeatWithSummaries(ctx, c, ns, pod, "h", ttl, []string{"p", "q"}, false, [][]byte{refusedSummary("r", i, 7), nil})
		g.Expect(err).NotTo(HaveOccurred())
	}
	key := fleet.SummaryKey(ns, "p", "pod-a")
	g.Expect(c.PTTL(ctx, key).Val()).To(BeNumerically(">", 0), "a summary expires with its heartbeat")
	g.Expect(c.Exists(ctx, fleet.SummaryKey(ns, "q", "pod-a")).Val()).To(BeZero(), "no summary, no key")

	read := fleet.ReadSummaries(ctx, c, ns, []string{"p", "q"}, []int64{3, 3}, ttl, 0)
	g.Expect(read[0].Err).NotTo(HaveOccurred())
	g.Expect(read[0].Live).To(BeEquivalentTo(3))
	g.Expect(read[0].Read).To(BeEquivalentTo(3))
	g.Expect(read[0].Invalid).To(BeZero())
	g.Expect(read[1].Read).To(BeZero())
	for _, s := range read[0].Summaries {
		g.Expect(s.Stamp).To(BeNumerically("~", time.Now().UnixMilli(), 60_000), "stamped with Redis's clock")
		g.Expect(s.Replica).To(BeElementOf("pod-a", "pod-b", "pod-c"))
	}
	// Without live counts every group is read; the script counts it.
	all := fleet.ReadSummaries(ctx, c, ns, []string{"p", "q"}, nil, ttl, 0)
	g.Expect(all[0].Read).To(BeEquivalentTo(3))
	g.Expect(all[0].Live).To(BeEquivalentTo(3))
	var parts []topkeys.Snapshot
	for _, s := range read[0].Summaries {
		parts = append(parts, s.Rules[0].Refused.Snapshot())
	}
	merged := topkeys.Merge(1, parts...)
	g.Expect(merged.Entries[0].Key).To(Equal(hexKey(7)), "key 7, refused by every replica, is the fleet's top")
	g.Expect(merged.Entries[0].Count).To(BeEquivalentTo(240))

	// A beat without a summary removes the replica's last one.
	_, err := fleet.BeatWithSummaries(ctx, c, ns, "pod-a", "h", ttl, []string{"p"}, false, [][]byte{nil})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(c.Exists(ctx, key).Val()).To(BeZero())
	// A summary over the bound is refused by the script, whoever runs it.
	_, err = fleet.BeatWithSummaries(ctx, c, ns, "pod-a", "h", ttl, []string{"p"}, false, [][]byte{make([]byte, fleet.SummaryMaxBytes+1)})
	g.Expect(err).To(MatchError(ContainSubstring("at most 16352 bytes")))
}

// A tenant writes its groups' keys with its own Redis user: what the manager reads of them is
// bounded in bytes whatever it wrote, and what is not a summary is counted, not trusted.
func TestReadSummariesIsBoundedWhateverTheTenantWrote(t *testing.T) {
	g := NewWithT(t)
	c := redisclient.Fresh(t, redisconn.Options{})
	ctx := context.Background()
	const ns, ttl = "evil", time.Hour
	_, err := fleet.BeatWithSummaries(ctx, c, ns, "real", "h", ttl, []string{"p"}, false, [][]byte{refusedSummary("r", 1)})
	g.Expect(err).NotTo(HaveOccurred())
	group := fleet.GroupKey(ns, "p")
	now := float64(time.Now().UnixMilli())
	// 3,000 forged live members, 200 of them with a summary of 64 KiB (3.2 MiB read at
	// SummaryMaxBytes each, over NamespaceSummaryBytes); one a hash, one a name of 1 MiB.
	big := strings.Repeat("z", 64<<10)
	pipe := c.Pipeline()
	for i := range 3000 {
		m := fmt.Sprintf("forged-%04d", i)
		pipe.ZAdd(ctx, group, redis.Z{Score: now, Member: m})
		if i < 200 {
			pipe.Set(ctx, fleet.SummaryKey(ns, "p", m), big, ttl)
		}
	}
	pipe.ZAdd(ctx, group, redis.Z{Score: now, Member: strings.Repeat("n", 1<<20)})
	pipe.HSet(ctx, fleet.SummaryKey(ns, "p", "forged-2999"), "a", "b")
	_, err = pipe.Exec(ctx)
	g.Expect(err).NotTo(HaveOccurred())

	for _, bound := range []int{0, 64 << 10} {
		want := bound
		if want == 0 {
			want = fleet.NamespaceSummaryBytes
		}
		read := fleet.ReadSummaries(ctx, c, ns, []string{"p"}, []int64{3002}, ttl, bound)
		g.Expect(read[0].Err).NotTo(HaveOccurred())
		g.Expect(read[0].OverBound).To(BeTrue(), "the bytes ran out before the members did")
		// Every forged summary read is cut to SummaryMaxBytes and fails to decode.
		g.Expect(read[0].Invalid).To(BeNumerically("<=", want/fleet.SummaryStoredBytes+1))
		g.Expect(read[0].InvalidErr).To(MatchError(fleet.ErrInvalidSummary))
		t.Logf("bound %d: %d live, %d read, %d invalid", want, read[0].Live, read[0].Read, read[0].Invalid)
	}

	// The script caps itself whatever its arguments: a tenant's user can run it too.
	cmd := scripts.EvalSha(ctx, scriptNamed(t, "GroupSummaries"), []string{group}, 3_600_000, "1e9", "1e12", "inf")
	scripts.Exec(ctx, c, []redis.Cmder{cmd}, fleet.ManagerScripts())
	reply, err := cmd.Slice()
	g.Expect(err).NotTo(HaveOccurred())
	var bytes, cut int
	for i := 3; i < len(reply); i += 2 {
		s, _ := reply[i].(string)
		bytes += len(s)
		if len(s) == fleet.SummaryStoredBytes {
			cut++
		}
	}
	g.Expect(bytes).To(BeNumerically("<=", fleet.SummaryReadBytes), "summaries returned in all")
	g.Expect(cut).To(Equal(200), "each 64 KiB summary is read as its first 16 KiB; the hash and the 1 MiB name are skipped")
}

func scriptNamed(t *testing.T, name string) scripts.Script {
	for _, s := range fleet.ManagerScripts() {
		if s.Name == name {
			return s
		}
	}
	t.Fatalf("no manager script %s", name)
	return scripts.Script{}
}
