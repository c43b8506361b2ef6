package limiter_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"github.com/redis/go-redis/v9"

	"github.com/redline-dev/redline/internal/keyscheme"
	"github.com/redline-dev/redline/internal/limiter"
	"github.com/redline-dev/redline/internal/testutil/redistest"
)

// giveBackModes are the limiter set-ups a give-back must work under: leases on and off, with
// and without shares.
var giveBackModes = []struct {
	name string
	opts limiter.TestOptions
}{
	{"leases=false", limiter.TestOptions{LeaseHorizon: -1, PrecheckSize: -1}},
	{"leases=true", limiter.TestOptions{LeaseHorizon: 2 * time.Second, PrecheckSize: -1}},
	{"leases=true,shares", limiter.TestOptions{LeaseHorizon: 2 * time.Second, PrecheckSize: -1, ReplicaID: "r1"}},
}

// admitAll decides key until the limit refuses, and returns every admitted result.
func admitAll(t *testing.T, l *limiter.Limiter, key string, lim limiter.Limit, cost int64, most int) []limiter.Result {
	t.Helper()
	var out []limiter.Result
	for range most {
		r, err := l.Allow(context.Background(), key, lim, cost)
		if err != nil {
			t.Fatalf("Allow: %v", err)
		}
		if !r.Allowed {
			return out
		}
		if r.Counted() != cost {
			t.Fatalf("an admission from %s counted %d, want %d", r.Source, r.Counted(), cost)
		}
		out = append(out, r)
	}
	t.Fatalf("still admitting after %d decisions", most)
	return nil
}

// TestGiveBackUndoesEveryAdmission: a key is filled to its limit, every admission is given
// back, and the key admits exactly its limit again, no more: whether the units came from a
// script, a lease (given back to it) or both, for every algorithm, with leases on and off.
func TestGiveBackUndoesEveryAdmission(t *testing.T) {
	for _, m := range giveBackModes {
		t.Run(m.name, func(t *testing.T) {
			allAlgorithms(t, func(t *testing.T, alg limiter.Algorithm) {
				g := NewWithT(t)
				l := newLimiter(t, newClient(t, shared.URL()), m.opts)
				key := uniqueKey(t)
				// Replicas known, so that a warm key leases (up to 100/20 units at once).
				lim := limiter.Limit{Algorithm: alg, Requests: 100, Window: time.Hour, Replicas: 1}
				costs := []int64{1, 3}
				if m.opts.LeaseHorizon > 0 {
					// A lease's last units cannot pay for a cost of 3 when it has fewer: they
					// wait for the window's end, which under-admits, and is leases' business.
					costs = costs[:1]
				}
				var expect int64
				for _, cost := range costs {
					expect += 2 * 100 / cost * cost
					first := admitAll(t, l, key, lim, cost, 200)
					g.Expect(first).To(HaveLen(int(100 / cost)))
					refunds := make([]limiter.Refund, len(first))
					leased := 0
					for i, r := range first {
						refunds[i] = limiter.Refund{Key: key, Limit: lim, Result: r}
						if r.Source == limiter.SourceLease {
							leased++
						}
					}
					if m.opts.LeaseHorizon >= 0 && (alg == limiter.FixedWindow || alg == limiter.SlidingWindowCounter) {
						g.Expect(leased).To(BeNumerically(">", 0), "some admissions came from a lease")
					}
					back, err := l.GiveBack(context.Background(), refunds)
					g.Expect(err).NotTo(HaveOccurred())
					total := int64(len(first)) * cost
					if alg == limiter.TokenBucket {
						// Its last token may have dripped in partly meanwhile: that part
						// was the bucket's already.
						g.Expect(back).To(BeNumerically(">=", total-cost))
					} else {
						g.Expect(back).To(Equal(total))
					}
					again := admitAll(t, l, key, lim, cost, 200)
					g.Expect(again).To(HaveLen(len(first)), "the key admits its limit again, no more")
					// Leave it empty for the next cost.
					refunds = refunds[:0]
					for _, r := range again {
						refunds = append(refunds, limiter.Refund{Key: key, Limit: lim, Result: r})
					}
					_, err = l.GiveBack(context.Background(), refunds)
					g.Expect(err).NotTo(HaveOccurred())
				}
				g.Expect(l.Stats().GivenBackUnits).To(BeNumerically(">=", expect-2*3))
				g.Expect(l.Stats().GivenBackUnits).To(BeNumerically("<=", expect))
			})
		})
	}
}

// TestGiveBackOfALogMemberKeepsTheOthers: the members of a sliding window log admitted after
// the one given back keep their cost: the window counts exactly what stays.
func TestGiveBackOfALogMemberKeepsTheOthers(t *testing.T) {
	g := NewWithT(t)
	l := direct(t)
	key := uniqueKey(t)
	lim := limiter.Limit{Algorithm: limiter.SlidingWindowLog, Requests: 20, Window: time.Hour}
	var rs []limiter.Result
	for _, cost := range []int64{2, 3, 1, 4, 3} {
		r, err := l.Allow(context.Background(), key, lim, cost)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(r.Allowed).To(BeTrue())
		rs = append(rs, r)
	}
	// 13 counted; give back the 3 and the 1 in the middle.
	back, err := l.GiveBack(context.Background(), []limiter.Refund{{Key: key, Limit: lim, Result: rs[1]}, {Key: key, Limit: lim, Result: rs[2]}})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(back).To(Equal(int64(4)))
	r, err := l.Allow(context.Background(), key, lim, 11)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(r.Allowed).To(BeTrue(), "9 counted, 11 fit")
	r, err = l.Allow(context.Background(), key, lim, 1)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(r.Allowed).To(BeFalse(), "20 counted")
	// A refusal counted nothing, and gives nothing back.
	g.Expect(r.Counted()).To(BeZero())
}

// TestRulesDecidedAsOneNeverOverAdmit: concurrent requests, each matched by a shared rule and
// its client's own, on keys spread over a Redis Cluster's masters: a request either rule
// refuses gives back what the other counted. No rule admits past its limit at any moment,
// and once every give-back is done each counter holds exactly what was admitted: a probe
// admits exactly the rest of the limit.
func TestRulesDecidedAsOneNeverOverAdmit(t *testing.T) {
	cl, err := redistest.StartCluster(3)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cl.Close() })
	admin := newClient(t, cl.URL())
	for _, m := range giveBackModes {
		t.Run(m.name, func(t *testing.T) {
			// 40: the shared rule binds too; 400: only the users' do, and the shared one leases
			// (400 / 20 / 2 replicas: 10 units at once) and gets its units back into leases.
			for _, sharedLimit := range []int64{40, 400} {
				t.Run(fmt.Sprint("shared=", sharedLimit), func(t *testing.T) {
					allAlgorithms(t, func(t *testing.T, alg limiter.Algorithm) {
						rulesDecidedAsOne(t, cl.URL(), admin, m.opts, m.name, alg, sharedLimit)
					})
				})
			}
		})
	}
}

func rulesDecidedAsOne(t *testing.T, url string, admin redis.UniversalClient, opts limiter.TestOptions, mode string, alg limiter.Algorithm, sharedLimit int64) {
	g := NewWithT(t)
	ls := make([]*limiter.Limiter, 2)
	for i := range ls {
		o := opts
		if o.ReplicaID != "" {
			o.ReplicaID += fmt.Sprint("-", i)
		}
		ls[i] = newLimiter(t, newClient(t, url), o)
	}
	const userLimit, users, each = 6, 12, 10
	lim := func(n int64) limiter.Limit {
		return limiter.Limit{Algorithm: alg, Requests: n, Window: time.Hour, Replicas: 2}
	}
	sharedKey := keyscheme.Key("shop", "p", "org", fmt.Sprint(mode, alg, sharedLimit))
	userKey := func(u int) string { return keyscheme.Key("shop", "p", "user", fmt.Sprint(mode, alg, sharedLimit, u)) }
	keys := []string{sharedKey}
	for u := range users {
		keys = append(keys, userKey(u))
	}
	g.Expect(masters(t, admin, alg, keys...)).To(BeNumerically(">=", 2), "the rules' keys live on several masters")

	var admitted, fromLeases atomic.Int64
	perUser := make([]atomic.Int64, users)
	var wg sync.WaitGroup
	for u := range users {
		wg.Go(func() {
			l := ls[u%2]
			for range each {
				asks := []limiter.Ask{{Key: sharedKey, Limit: lim(sharedLimit), Cost: 1}, {Key: userKey(u), Limit: lim(userLimit), Cost: 1}}
				res, errs := l.AllowAll(context.Background(), asks, nil)
				if errs[0] != nil || errs[1] != nil {
					t.Errorf("deciding: %v %v", errs[0], errs[1])
					return
				}
				if res[0].Allowed && res[1].Allowed {
					admitted.Add(1)
					perUser[u].Add(1)
					continue
				}
				if res[0].Allowed && res[0].Source == limiter.SourceLease {
					fromLeases.Add(1)
				}
				var back []limiter.Refund
				for i, r := range res {
					back = append(back, limiter.Refund{Key: asks[i].Key, Limit: asks[i].Limit, Result: r})
				}
				if _, err := l.GiveBack(context.Background(), back); err != nil {
					t.Errorf("giving back: %v", err)
				}
			}
		})
	}
	wg.Wait()
	g.Expect(admitted.Load()).To(BeNumerically("<=", sharedLimit))
	if opts.LeaseHorizon > 0 && sharedLimit == 400 && (alg == limiter.FixedWindow || alg == limiter.SlidingWindowCounter) {
		g.Expect(fromLeases.Load()).To(BeNumerically(">", 0), "some give-backs went to a lease")
	}
	for u := range perUser {
		g.Expect(perUser[u].Load()).To(BeNumerically("<=", userLimit))
	}
	// Whatever the leases hold goes back to Redis on Close; then a probe sees exactly
	// what was admitted counted.
	for _, l := range ls {
		l.Close()
	}
	probe := newLimiter(t, newClient(t, url), limiter.TestOptions{LeaseHorizon: -1, PrecheckSize: -1})
	rest := admitAll(t, probe, sharedKey, lim(sharedLimit), 1, int(2*sharedLimit))
	g.Expect(int64(len(rest))).To(Equal(sharedLimit-admitted.Load()), "the shared counter holds exactly the admitted requests")
	for u := range users {
		rest := admitAll(t, probe, userKey(u), lim(userLimit), 1, 2*userLimit)
		g.Expect(int64(len(rest))).To(Equal(userLimit-perUser[u].Load()), "user %d's counter holds exactly its admitted requests", u)
	}
}

// masters counts the cluster masters the state keys of keys live on.
func masters(t *testing.T, c redis.UniversalClient, alg limiter.Algorithm, keys ...string) int {
	t.Helper()
	suffix := map[limiter.Algorithm]string{limiter.TokenBucket: ":tb", limiter.SlidingWindowLog: ":swl"}[alg]
	if suffix == "" {
		suffix = ":swc"
	}
	seen := map[string]bool{}
	for _, k := range keys {
		n, err := c.(*redis.ClusterClient).MasterForKey(context.Background(), k+suffix)
		if err != nil {
			t.Fatal(err)
		}
		seen[n.Options().Addr] = true
	}
	return len(seen)
}
