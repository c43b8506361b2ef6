package checkapi_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"github.com/redis/go-redis/v9"

	"github.com/redline-dev/redline/internal/limiter"
	"github.com/redline-dev/redline/internal/policydoc"
	"github.com/redline-dev/redline/internal/redisconn"
	"github.com/redline-dev/redline/internal/sidecar/checkapi"
	"github.com/redline-dev/redline/internal/sidecar/decide"
	"github.com/redline-dev/redline/internal/testutil/redistest"
	"github.com/redline-dev/redline/internal/testutil/sidecartest"
)

// dryRunWindow is the rules' window: a day, which the tests' seconds do not cross (see
// awayFromDayEnd).
const dryRunWindow = 24 * time.Hour

// awayFromDayEnd waits for the next day-long window when this one ends within a few minutes
// (this machine's clock is Redis's on loopback).
func awayFromDayEnd(t *testing.T) {
	t.Helper()
	now := time.Now()
	if left := now.Truncate(dryRunWindow).Add(dryRunWindow).Sub(now); left < 3*time.Minute {
		t.Logf("waiting %s for the next window", left.Round(time.Second))
		time.Sleep(left + time.Second)
	}
}

// stackOfEvery is four rules stacked on one header, one per algorithm, each with its own limit.
func stackOfEvery(header string) []policydoc.Rule {
	rule := func(name, alg string, requests int64) policydoc.Rule {
		return policydoc.Rule{Name: name, Key: []policydoc.KeyPart{{Header: header}}, Algorithm: alg, Requests: requests,
			WindowMS: dryRunWindow.Milliseconds(), Mode: "Enforce"}
	}
	return []policydoc.Rule{
		rule("fixed", "FixedWindow", 6), rule("counter", "SlidingWindowCounter", 5),
		rule("log", "SlidingWindowLog", 4), rule("bucket", "TokenBucket", 3),
	}
}

// redisFor is a redis-server of the test's own, a client to read it and a limiter on it with
// the sidecar's defaults.
func redisFor(t *testing.T) (redis.UniversalClient, *limiter.Limiter) {
	t.Helper()
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
	lim, err := limiter.New(c, limiter.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(lim.Close)
	return c, lim
}

// everyKey is every key of Redis, dumped with its absolute expiry.
func everyKey(t *testing.T, c redis.UniversalClient) map[string]string {
	t.Helper()
	ctx := context.Background()
	keys, err := c.Keys(ctx, "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, k := range keys {
		dump, err := c.Dump(ctx, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		out[k] = fmt.Sprintf("%x@%d", dump, c.PExpireTime(ctx, k).Val())
	}
	return out
}

func checkOf(g Gomega, h http.Handler, body string) checkapi.Response {
	rec := do(h, http.MethodPost, body)
	g.Expect(rec.Code).To(Equal(http.StatusOK), rec.Body.String())
	var resp checkapi.Response
	g.Expect(json.Unmarshal(rec.Body.Bytes(), &resp)).To(Succeed())
	return resp
}

// At every point of the stacked rules' windows, a dry run answers what the next check gets:
// the verdict, the rule that refuses, and each rule's allowed and remaining. And any number of
// dry runs leave every key in Redis byte for byte as it was.
func TestDryRunIsTheNextCheck(t *testing.T) {
	awayFromDayEnd(t)
	c, lim := redisFor(t)
	h := &checkapi.Handler{Engine: &decide.Engine{Limiter: lim},
		Store: sidecartest.StoreOf(t, sidecartest.DocumentRules("shop", "api", "web", stackOfEvery("X-Key")...))}
	for _, described := range []bool{false, true} {
		t.Run(fmt.Sprintf("described request %v", described), func(t *testing.T) {
			g := NewWithT(t)
			key := fmt.Sprintf("k-%v", described)
			body := `{"method":"GET","path":"/","headers":{"X-Key":"` + key + `"}%s}`
			if !described {
				body = `{"hits":[{"policy":"api","rule":"fixed","key":["` + key + `"]},{"policy":"api","rule":"counter","key":["` + key + `"]},` +
					`{"policy":"api","rule":"log","key":["` + key + `"]},{"policy":"api","rule":"bucket","key":["` + key + `"]}]%s}`
			}
			for i := range 8 {
				before := everyKey(t, c)
				var dry checkapi.Response
				for range 5 {
					dry = checkOf(g, h, fmt.Sprintf(body, `,"dryRun":true`))
				}
				g.Expect(everyKey(t, c)).To(Equal(before), "request %d: dry runs changed Redis", i)
				g.Expect(dry.DryRun).To(BeTrue())
				got := checkOf(g, h, fmt.Sprintf(body, ""))
				g.Expect(got.DryRun).To(BeFalse())
				g.Expect(dry.Allowed).To(Equal(got.Allowed), "request %d", i)
				g.Expect(dry.Policy+"/"+dry.Rule).To(Equal(got.Policy+"/"+got.Rule), "request %d: the refusing rule", i)
				g.Expect(dry.Results).To(HaveLen(len(got.Results)))
				for j := range got.Results {
					d, r := dry.Results[j], got.Results[j]
					what := fmt.Sprintf("request %d, rule %s", i, r.Rule)
					g.Expect(d.Rule).To(Equal(r.Rule), what)
					g.Expect(d.Allowed).To(Equal(r.Allowed), what)
					g.Expect(d.Remaining).To(Equal(r.Remaining), what)
					g.Expect(d.RetryAfterSeconds).To(BeNumerically("~", r.RetryAfterSeconds, 1), what)
					g.Expect(d.ResetSeconds).To(BeNumerically("~", r.ResetSeconds, 1), what)
				}
			}
		})
	}
}

// A dry run reads only the keys the request itself would count under, in the sidecar's own
// namespace: another namespace's exhausted limit under the same policy, rule and key value is
// not seen, key parts shaped like key syntax or globs name nothing else, and nothing is written.
func TestDryRunReadsOnlyItsOwnKeys(t *testing.T) {
	awayFromDayEnd(t)
	g := NewWithT(t)
	c, lim := redisFor(t)
	rules := stackOfEvery("X-Key")
	victim := &checkapi.Handler{Engine: &decide.Engine{Limiter: lim}, Store: sidecartest.StoreOf(t, sidecartest.DocumentRules("victim", "api", "web", rules...))}
	attacker := &checkapi.Handler{Engine: &decide.Engine{Limiter: lim}, Store: sidecartest.StoreOf(t, sidecartest.DocumentRules("attacker", "api", "web", rules...))}
	for range 10 {
		checkOf(g, victim, `{"method":"GET","path":"/","headers":{"X-Key":"secret"}}`)
	}
	g.Expect(checkOf(g, victim, `{"method":"GET","path":"/","headers":{"X-Key":"secret"},"dryRun":true}`).Allowed).To(BeFalse(),
		"the victim's own dry run sees its exhausted key")
	before := everyKey(t, c)

	for _, key := range []string{"secret", "*", "secret}", "}:swc", "rl:{victim/api/fixed/", `\`, "victim/api"} {
		raw, _ := json.Marshal(key)
		resp := checkOf(g, attacker, `{"method":"GET","path":"/","headers":{"X-Key":`+string(raw)+`},"dryRun":true}`)
		g.Expect(resp.Allowed).To(BeTrue(), "key %q", key)
		for _, r := range resp.Results {
			g.Expect(r.Remaining).To(Equal(r.Limit-1), "key %q, rule %s: a fresh key of the attacker's own", key, r.Rule)
		}
		resp = checkOf(g, attacker, `{"policy":"api","rule":"log","key":[`+string(raw)+`],"dryRun":true}`)
		g.Expect(resp.Results[0].Remaining).To(Equal(int64(3)), "key %q", key)
	}
	g.Expect(everyKey(t, c)).To(Equal(before), "dry runs wrote to Redis")

	rec := do(attacker, http.MethodPost, `{"policy":"other","rule":"log","key":["secret"],"dryRun":true}`)
	g.Expect(rec.Code).To(Equal(http.StatusBadRequest), "a rule the sidecar does not enforce, as a check")
	rec = do(attacker, http.MethodPost, `{"method":"GET","path":"/","dryRun":true,"reserve":{"prompt":1}}`)
	g.Expect(rec.Code).To(Equal(http.StatusBadRequest), "not with a reserve")
}

// A limiter that cannot answer a dry run makes it 503, never a decision that counted.
func TestDryRunUnavailableIs503(t *testing.T) {
	g := NewWithT(t)
	h := &checkapi.Handler{Engine: &decide.Engine{Limiter: sidecartest.FakeLimiter{Decide: admitAll{}.Allow}}, Store: sidecartest.Store(t, 10, time.Minute)}
	rec := do(h, http.MethodPost, `{"method":"GET","path":"/","dryRun":true}`)
	g.Expect(rec.Code).To(Equal(http.StatusServiceUnavailable), rec.Body.String())
}
