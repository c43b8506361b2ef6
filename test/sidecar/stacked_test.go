package sidecar_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	. "github.com/onsi/gomega"
	"github.com/redis/go-redis/v9"

	"github.com/redline-dev/redline/internal/keyscheme"
	"github.com/redline-dev/redline/internal/limiter"
	"github.com/redline-dev/redline/internal/policydoc"
	"github.com/redline-dev/redline/internal/redisconn"
	"github.com/redline-dev/redline/internal/sidecar/checkapi"
	"github.com/redline-dev/redline/internal/testutil/redistest"
	"github.com/redline-dev/redline/internal/testutil/redistest/redisclient"
)

// The stacked rules of one request: per user 10, per organisation 25, per path 40 a day. A day,
// not a minute: a window ending during a run (FixedWindow's reset, SlidingWindowCounter's
// weighing) or a TokenBucket dripping a token back (one every 6 s of a minute's 10) would change
// what a run admits on a slow machine; a day's window is kept away from its end (awayFromDayEnd).
const userLimit, orgLimit, pathLimit = 10, 25, 40

const stackedWindow = unsizedWindow

// stackedPolicy is one policy of the three stacked rules, by alg, on the paths under prefix.
func stackedPolicy(name, app, alg, prefix string) policydoc.Policy {
	rule := func(n string, requests int64, key policydoc.KeyPart) policydoc.Rule {
		return policydoc.Rule{Name: n, Match: &policydoc.Match{PathPrefix: prefix}, Key: []policydoc.KeyPart{key},
			Algorithm: alg, Requests: requests, WindowMS: stackedWindow.Milliseconds(), Mode: "Enforce"}
	}
	return policydoc.Policy{Name: name, Generation: 1, Selector: policydoc.Selector{MatchLabels: map[string]string{"app": app}},
		FailureMode: "Closed", Rules: []policydoc.Rule{
			rule("per-user", userLimit, policydoc.KeyPart{Header: "x-user"}),
			rule("per-org", orgLimit, policydoc.KeyPart{Header: "x-org"}),
			rule("per-path", pathLimit, policydoc.KeyPart{Attribute: "Path"}),
		}}
}

// stackedAsk is one request of a client of the three rules on one face of a sidecar; it
// reports whether the request was admitted.
type stackedAsk func(t *testing.T, s *stackedSidecar, policy, path, user, org string) bool

// stackedSidecar is a sidecar and a client of its rate limit service.
type stackedSidecar struct {
	*sidecar
	rls rlsv3.RateLimitServiceClient
}

var stackedFaces = []struct {
	name string
	ask  stackedAsk
}{
	{"proxy", func(t *testing.T, s *stackedSidecar, _, path, user, org string) bool {
		req, _ := http.NewRequest(http.MethodGet, s.proxy+path, nil)
		req.Header.Set("X-User", user)
		req.Header.Set("X-Org", org)
		resp, err := httpClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusTooManyRequests {
			t.Fatalf("proxy answered %d", resp.StatusCode)
		}
		return resp.StatusCode == http.StatusOK
	}},
	{"checkAPI", func(t *testing.T, s *stackedSidecar, _, path, user, org string) bool {
		body := fmt.Sprintf(`{"method":"GET","path":%q,"headers":{"x-user":%q,"x-org":%q}}`, path, user, org)
		resp, err := httpClient.Post(s.check+checkapi.Path, "application/json", bytes.NewBufferString(body))
		if err != nil {
			t.Fatal(err)
		}
		var d checkapi.Response
		if err := decodeJSON(resp, &d); err != nil {
			t.Fatal(err)
		}
		if len(d.Results) != 3 {
			t.Fatalf("%d results, want one per rule: %+v", len(d.Results), d)
		}
		return d.Allowed
	}},
	{"envoyRLS", func(t *testing.T, s *stackedSidecar, policy, path, user, org string) bool {
		desc := func(rule, v string) *rlv3.RateLimitDescriptor {
			return &rlv3.RateLimitDescriptor{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "policy", Value: policy}, {Key: "rule", Value: rule}, {Key: "k", Value: v}}}
		}
		resp, err := s.rls.ShouldRateLimit(ctxTimeout(t, 30*time.Second), &rlsv3.RateLimitRequest{Domain: "redline",
			Descriptors: []*rlv3.RateLimitDescriptor{desc("per-user", user), desc("per-org", org), desc("per-path", path)}})
		if err != nil {
			t.Fatal(err)
		}
		return resp.OverallCode == rlsv3.RateLimitResponse_OK
	}},
}

var stackedAlgorithms = []struct{ alg, policy, prefix string }{
	{"FixedWindow", "stack-fw", "/fw"},
	{"SlidingWindowCounter", "stack-swc", "/swc"},
	{"TokenBucket", "stack-tb", "/tb"},
	{"SlidingWindowLog", "stack-swl", "/swl"},
}

// stackedPhases are who sends 30 requests each, in turn: one user of organisation A, then two
// more of A, then two of B. Every request costs its user, its organisation and the path one
// unit when admitted; a request any rule refuses counts in none.
var stackedPhases = [][]struct{ user, org string }{
	{{"a1", "A"}},
	{{"a2", "A"}},
	{{"a3", "A"}},
	{{"b1", "B"}, {"b2", "B"}},
}

// TestARefusedRequestCountsInNoRule: three sidecar processes, three rules on every request
// (per user 10, per organisation 25, per path 40 a day). One user of organisation A sends
// 30 requests: the user rule admits 10, and the 20 it refuses count neither in A's limit nor in
// the path's, so the other users of A get A's remaining 15 and the users of B the path's
// remaining 15: 10, 10, 5, 15 admitted by phase, and each rule counts exactly what was
// admitted (120 units for 40 requests). On every face, with leases on and off, every
// algorithm, on one Redis and on a Redis Cluster whose masters hold the rules' keys.
func TestARefusedRequestCountsInNoRule(t *testing.T) {
	cl, err := redistest.StartCluster(3)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cl.Close() })
	for _, backend := range []struct{ name, url string }{{"redis", shared.URL()}, {"cluster", cl.URL()}} {
		for _, leases := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/leases=%v", backend.name, leases), func(t *testing.T) {
				stackedRun(t, backend.url, leases)
			})
		}
	}
}

func stackedRun(t *testing.T, url string, leases bool) {
	e := newEnv(t, "stacked")
	var pols []policydoc.Policy
	for _, a := range stackedAlgorithms {
		pols = append(pols, stackedPolicy(a.policy, "stacked", a.alg, a.prefix))
	}
	_, doc, err := policydoc.Build(e.namespace, pols, map[string]string{})
	if err != nil {
		t.Fatal(err)
	}
	e.write(t, doc)
	up := newUpstream(t)
	flags := []string{"--lease-horizon=0"}
	if leases {
		flags = nil
	}
	var scs []*stackedSidecar
	for i := range 3 {
		s := start(t, fmt.Sprint("pod-", i), e, url, up.addr(), true, flags...)
		scs = append(scs, &stackedSidecar{sidecar: s, rls: rlsClient(t, s.grpc)})
	}
	rc := redisclient.New(t, url, redisconn.Options{})
	for _, f := range stackedFaces {
		for _, a := range stackedAlgorithms {
			t.Run(f.name+"/"+a.alg, func(t *testing.T) {
				g := NewWithT(t)
				awayFromDayEnd(t)
				run := strconv.FormatInt(time.Now().UnixNano(), 36)
				path := a.prefix + "/items-" + run
				var perPhase []int
				n := 0
				for _, phase := range stackedPhases {
					admitted := 0
					for _, c := range phase {
						for range 30 {
							if f.ask(t, scs[n%3], a.policy, path, c.user+run, c.org+run) {
								admitted++
							}
							n++
						}
					}
					perPhase = append(perPhase, admitted)
				}
				key := func(rule, part string) string { return keyscheme.Key(e.namespace, a.policy, rule, part) }
				units := map[string]int64{}
				for _, u := range []string{"a1", "a2", "a3", "b1", "b2"} {
					units["per-user"] += counted(t, rc, limiter.Algorithm(a.alg), key("per-user", u+run), userLimit)
				}
				for _, o := range []string{"A", "B"} {
					units["per-org"] += counted(t, rc, limiter.Algorithm(a.alg), key("per-org", o+run), orgLimit)
				}
				units["per-path"] = counted(t, rc, limiter.Algorithm(a.alg), key("per-path", path), pathLimit)
				t.Logf("%s: admitted per phase %v (%d requests); units counted: user %d, org %d, path %d (%d in all)",
					strings.TrimPrefix(t.Name(), "TestARefusedRequestCountsInNoRule/"), perPhase, n, units["per-user"], units["per-org"], units["per-path"], units["per-user"]+units["per-org"]+units["per-path"])
				g.Expect(perPhase).To(Equal([]int{10, 10, 5, 15}))
				g.Expect(units).To(Equal(map[string]int64{"per-user": 40, "per-org": 40, "per-path": 40}), "each rule counts the 40 admitted requests, no refused one")
			})
		}
	}
}

// counted reads what the state of key holds for alg, in units: the current window's count of a
// FixedWindow or SlidingWindowCounter, the tokens a TokenBucket lacks (rounded: they drip back
// at one every 2.4 h or more), the cost in a SlidingWindowLog's window.
func counted(t *testing.T, rc redis.UniversalClient, alg limiter.Algorithm, key string, requests int64) int64 {
	t.Helper()
	ctx := context.Background()
	switch alg {
	case limiter.TokenBucket:
		tat, err := rc.Get(ctx, key+":tb").Float64()
		if err == redis.Nil {
			return 0
		}
		if err != nil {
			t.Fatal(err)
		}
		tm, err := rc.Time(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		ahead := tat - float64(tm.UnixMicro())
		return int64(math.Round(max(ahead, 0) / (float64(stackedWindow.Microseconds()) / float64(requests))))
	case limiter.SlidingWindowLog:
		names, err := rc.ZRange(ctx, key+":swl", 0, -1).Result()
		if err != nil {
			t.Fatal(err)
		}
		if len(names) == 0 {
			return 0
		}
		n, err := strconv.ParseInt(strings.TrimLeft(names[len(names)-1], "0"), 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		return n // nothing has left the window: the newest running total is the window's count
	default:
		n, err := rc.HGet(ctx, key+":swc", "c").Int64()
		if err == redis.Nil {
			return 0
		}
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
}
