package decide_test

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/redline-dev/redline/internal/limiter"
	"github.com/redline-dev/redline/internal/limiter/scripts"
	"github.com/redline-dev/redline/internal/policydoc"
	"github.com/redline-dev/redline/internal/redisconn"
	"github.com/redline-dev/redline/internal/sidecar/decide"
	"github.com/redline-dev/redline/internal/sidecar/ruleset"
	"github.com/redline-dev/redline/internal/testutil/redistest"
)

// stackedSet is one policy whose rules all match every request: "user" keyed on X-User and
// "org" keyed on X-Org, each rule as given.
func stackedSet(t *testing.T, rules ...policydoc.Rule) *ruleset.Set {
	t.Helper()
	return buildSet(t, "ns", []policydoc.Policy{{Name: "p", Generation: 1, FailureMode: "Closed", Rules: rules}})
}

func stackedRule(name, header, alg string, requests int64) policydoc.Rule {
	return policydoc.Rule{Name: name, Key: []policydoc.KeyPart{{Header: header}}, Algorithm: alg, Requests: requests,
		WindowMS: giveBackWindow.Milliseconds(), Mode: "Enforce"}
}

// giveBackWindow is the rules' window: a day, so that the tests' few seconds cross no window's
// end (a give-back after its window ended gives nothing back), given awayFromWindowEnd.
const giveBackWindow = 24 * time.Hour

// awayFromWindowEnd waits for the next window when the current one (on this machine's clock,
// which is Redis's on loopback) ends within a few minutes.
func awayFromWindowEnd(t *testing.T) {
	t.Helper()
	const margin = 3 * time.Minute
	now := time.Now()
	if left := now.Truncate(giveBackWindow).Add(giveBackWindow).Sub(now); left < margin {
		t.Logf("waiting %s for the next window", left.Round(time.Second))
		time.Sleep(left + time.Second)
	}
}

func stackedReq(user, org string) *decide.Request {
	return &decide.Request{Method: "GET", Path: "/", Header: http.Header{"X-User": {user}, "X-Org": {org}}, RemoteAddr: "10.0.0.1:1"}
}

// giveBackEngine is an engine over a fresh Redis.
func giveBackEngine(t *testing.T) *decide.Engine {
	t.Helper()
	awayFromWindowEnd(t)
	srv, err := redistest.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	c, err := redisconn.NewClient(srv.URL(), redisconn.Options{ReadTimeout: 5 * time.Second, WriteTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	// Loaded as the manager loads every script a sidecar runs: a give-back then makes one round
	// trip, not a second one after NOSCRIPT.
	for _, s := range []scripts.Script{scripts.HoldSettle(), scripts.TokenReturn(), scripts.LogReturn()} {
		if err := c.ScriptLoad(context.Background(), s.Source).Err(); err != nil {
			t.Fatal(err)
		}
	}
	lim, err := limiter.New(c, limiter.Options{LeaseHorizon: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(lim.Close)
	return &decide.Engine{Limiter: lim}
}

// admitted sends n requests and counts those admitted, waiting for candidates' decisions.
func admitted(e *decide.Engine, set *ruleset.Set, rq *decide.Request, n int) (int, []decide.Outcome) {
	got := 0
	var last []decide.Outcome
	for range n {
		d := decideReq(context.Background(), e, set, rq)
		last = d.WaitCandidates()
		if d.Allowed {
			got++
		}
	}
	return got, last
}

// TestRefusedCountedKeepsRefusalsOnlyWhereARuleSaysSo: a user over its own limit spends
// nothing of its organisation's, unless the organisation's rule says refused: Counted.
func TestRefusedCountedKeepsRefusalsOnlyWhereARuleSaysSo(t *testing.T) {
	e := giveBackEngine(t)
	for _, alg := range limiter.Algorithms {
		t.Run(string(alg), func(t *testing.T) {
			for _, countRefused := range []bool{false, true} {
				g := NewWithT(t)
				org := stackedRule("org", "x-org", string(alg), 10)
				org.CountRefused = countRefused
				set := stackedSet(t, stackedRule("user", "x-user", string(alg), 2), org)
				run := fmt.Sprint(alg, countRefused, time.Now().UnixNano())
				first, _ := admitted(e, set, stackedReq("u1"+run, run), 6)
				g.Expect(first).To(Equal(2))
				// Others of the organisation: 8 left when the 4 refusals went back, 4 when the
				// organisation's rule counted them.
				rest := 0
				for u := range 10 {
					n, _ := admitted(e, set, stackedReq(fmt.Sprint("o", u, run), run), 2)
					rest += n
				}
				if countRefused {
					g.Expect(rest).To(Equal(4))
				} else {
					g.Expect(rest).To(Equal(8))
				}
			}
		})
	}
}

// TestCandidateKeepsOnlyWhatItsRuleAloneRefused: a candidate counts a request as enforcing it
// in its rule's place would: a request its rule alone refused counts in it (the candidate
// would have admitted it), one another rule refused counts in none.
func TestCandidateKeepsOnlyWhatItsRuleAloneRefused(t *testing.T) {
	e := giveBackEngine(t)
	for _, alg := range limiter.Algorithms {
		for _, c := range []struct {
			name                string
			user, org, admitted int64
			counted             int64 // by the candidate, of u1's 5
		}{
			{"the rule refuses", 100, 2, 2, 5},
			{"another rule refuses", 2, 10, 2, 2},
		} {
			t.Run(string(alg)+"/"+c.name, func(t *testing.T) {
				g := NewWithT(t)
				run := fmt.Sprint(alg, time.Now().UnixNano())
				org := stackedRule("org", "x-org", string(alg), c.org)
				org.Candidate = &policydoc.Candidate{Algorithm: string(alg), Requests: 20, WindowMS: giveBackWindow.Milliseconds()}
				set := stackedSet(t, stackedRule("user", "x-user", string(alg), c.user), org)
				n, _ := admitted(e, set, stackedReq("u1"+run, run), 5)
				g.Expect(n).To(BeEquivalentTo(c.admitted))
				// The next request of the organisation finds what the candidate counted.
				_, cands := admitted(e, set, stackedReq("u2"+run, run), 1)
				g.Expect(cands).To(HaveLen(1))
				g.Expect(cands[0].Result.Remaining).To(Equal(20 - c.counted - 1))
			})
		}
	}
}

// TestAFaceRefusalGivesBackEveryRule: a face that refuses a request its rules admitted (no
// memory to read its body, a full registry of holds) gives back what every rule counted, in
// one round trip.
func TestAFaceRefusalGivesBackEveryRule(t *testing.T) {
	e := giveBackEngine(t)
	for _, alg := range limiter.Algorithms {
		t.Run(string(alg), func(t *testing.T) {
			g := NewWithT(t)
			run := fmt.Sprint(alg, time.Now().UnixNano())
			set := stackedSet(t, stackedRule("user", "x-user", string(alg), 3), stackedRule("org", "x-org", string(alg), 3))
			lim := e.Limiter.(*limiter.Limiter)
			for range 5 {
				d := decideReq(context.Background(), e, set, stackedReq("u"+run, run))
				g.Expect(d.Allowed).To(BeTrue())
				before := lim.Stats()
				d.GiveBack(context.Background())
				d.GiveBack(context.Background()) // once only
				after := lim.Stats()
				g.Expect(after.Pipelines-before.Pipelines).To(BeEquivalentTo(1), "both rules' give-backs in one round trip")
				g.Expect(after.GivenBackUnits - before.GivenBackUnits).To(BeEquivalentTo(2))
			}
			n, _ := admitted(e, set, stackedReq("u"+run, run), 5)
			g.Expect(n).To(Equal(3), "nothing stayed counted")
		})
	}
}

// TestGiveBackAfterAReload: a decision gives back under the keys and limits it was decided
// under, whatever rule set is in force by then (here one whose limits changed and that lost a
// rule).
func TestGiveBackAfterAReload(t *testing.T) {
	e := giveBackEngine(t)
	for _, alg := range limiter.Algorithms {
		t.Run(string(alg), func(t *testing.T) {
			g := NewWithT(t)
			run := fmt.Sprint(alg, time.Now().UnixNano())
			before := stackedSet(t, stackedRule("user", "x-user", string(alg), 3), stackedRule("org", "x-org", string(alg), 3))
			var ds []decide.Decision
			for range 3 {
				d := decideReq(context.Background(), e, before, stackedReq("u"+run, run))
				g.Expect(d.Allowed).To(BeTrue())
				ds = append(ds, d)
			}
			after := stackedSet(t, stackedRule("user", "x-user", string(alg), 4))
			for i := range ds {
				ds[i].GiveBack(context.Background())
			}
			n, _ := admitted(e, after, stackedReq("u"+run, run), 6)
			g.Expect(n).To(Equal(4), "the user's 3 went back: its new limit of 4 is whole")
			n, _ = admitted(e, before, stackedReq("v"+run, run), 6)
			g.Expect(n).To(Equal(3), "the organisation's 3 went back too")
		})
	}
}
