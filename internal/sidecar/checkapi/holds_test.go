package checkapi_test

import (
	"encoding/json"
	"net/http"
	"testing"

	. "github.com/onsi/gomega"

	"github.com/redline-dev/redline/internal/policydoc"
	"github.com/redline-dev/redline/internal/sidecar/checkapi"
	"github.com/redline-dev/redline/internal/sidecar/decide"
	"github.com/redline-dev/redline/internal/sidecar/ruleset"
	"github.com/redline-dev/redline/internal/testutil/sidecartest"
)

// budgetHandler serves the decision API with a real limiter on a real Redis, for one policy
// "p" with a token budget "tokens" of 1000 per minute keyed on X-Key (and on a hit's key part).
func budgetHandler(t *testing.T) *checkapi.Handler {
	t.Helper()
	doc := sidecartest.DocumentRules("ns", "p", "web", sidecartest.BudgetRule("tokens", "x-key", "FixedWindow", 1_000, 100, 10, policydoc.OnErrorUsed))
	return &checkapi.Handler{Engine: &decide.Engine{Limiter: sidecartest.Limiter(t)}, Store: sidecartest.StoreOf(t, doc), Holds: &decide.Registry{}}
}

func answer(g Gomega, h http.Handler, body string, status int) checkapi.Response {
	rec := do(h, http.MethodPost, body)
	g.Expect(rec.Code).To(Equal(status), "%s: %s", body, rec.Body.String())
	var resp checkapi.Response
	if status == http.StatusOK {
		g.Expect(json.Unmarshal(rec.Body.Bytes(), &resp)).To(Succeed())
	}
	return resp
}

func TestReserveAndSettle(t *testing.T) {
	g := NewWithT(t)
	h := budgetHandler(t)

	// A described request: it holds its prompt and cap, and the answer says what output fits.
	r := answer(g, h, `{"method":"POST","path":"/v1/chat/completions","headers":{"X-Key":"a"},"reserve":{"prompt":100,"maxOutput":300}}`, 200)
	g.Expect(r.Allowed).To(BeTrue())
	g.Expect(r.Hold).NotTo(BeNil())
	g.Expect(r.Hold.ID).To(HaveLen(22))
	g.Expect(r.Hold.Units).To(Equal(int64(400)))
	g.Expect(r.Hold.MaxOutput).To(Equal(int64(300)))
	// The rule's timeout is a minute, and a FixedWindow hold ends with its window.
	g.Expect(r.Hold.ExpiresSeconds).To(BeNumerically("<=", 60))
	first := r.Hold.ID

	// A second request without a cap gets what is left: 600, so its output fits in 500.
	r = answer(g, h, `{"policy":"p","rule":"tokens","key":["a"],"reserve":{"prompt":100}}`, 200)
	g.Expect(r.Hold.Units).To(Equal(int64(600)))
	g.Expect(r.Hold.MaxOutput).To(Equal(int64(500)))
	second := r.Hold.ID

	// Nothing is left: refused with a retry-after, and no hold.
	r = answer(g, h, `{"policy":"p","rule":"tokens","key":["a"],"reserve":{}}`, 200)
	g.Expect(r.Allowed).To(BeFalse())
	g.Expect(r.Hold).To(BeNil())
	g.Expect(r.RetryAfterSeconds).To(BeNumerically(">", 0))

	// Settles: the unused part goes back once; a second settle of the same hold is not found.
	r = answer(g, h, `{"settle":{"hold":"`+first+`","used":150}}`, 200)
	g.Expect(*r.Settled).To(Equal(checkapi.Settled{Returned: 250}))
	answer(g, h, `{"settle":{"hold":"`+first+`","used":150}}`, 404)
	r = answer(g, h, `{"settle":{"hold":"`+second+`","failed":true}}`, 200)
	g.Expect(*r.Settled).To(Equal(checkapi.Settled{}), "a failed request of unknown usage settles its whole hold (onError Used)")

	// 250 went back: an unsized request holds its default of 100.
	r = answer(g, h, `{"policy":"p","rule":"tokens","key":["a"],"reserve":{}}`, 200)
	g.Expect(r.Allowed).To(BeTrue())
	g.Expect(r.Hold.Units).To(Equal(int64(100)))
	g.Expect(r.Hold.MaxOutput).To(BeZero(), "an unsized request has no output to cap")
	r = answer(g, h, `{"settle":{"hold":"`+r.Hold.ID+`","used":300}}`, 200)
	g.Expect(*r.Settled).To(Equal(checkapi.Settled{Debt: 200}))
}

func TestReserveAndSettleRefusals(t *testing.T) {
	g := NewWithT(t)
	h := budgetHandler(t)
	for _, c := range []struct {
		body   string
		status int
	}{
		{`{"settle":{"hold":"nope","used":1}}`, 404},
		{`{"settle":{"hold":"","used":1}}`, 400},
		{`{"settle":{"hold":"x","used":-1}}`, 400},
		{`{"settle":{"hold":"x","used":1000000001}}`, 400},
		{`{"settle":{"hold":"x"},"policy":"p","rule":"tokens"}`, 400},
		{`{"settle":{"hold":"x"},"reserve":{}}`, 400},
		{`{"settle":{"hold":"` + string(make([]byte, 65)) + `"}}`, 400},
		{`{"policy":"p","rule":"tokens","reserve":{"prompt":-1}}`, 400},
		{`{"policy":"p","rule":"tokens","reserve":{"maxOutput":1e12}}`, 400},
		{`{"policy":"p","rule":"tokens","reserve":{"bogus":1}}`, 400},
	} {
		answer(g, h, c.body, c.status)
	}
	// A sidecar without a registry keeps no holds.
	none := &checkapi.Handler{Engine: h.Engine, Store: h.Store}
	answer(g, none, `{"policy":"p","rule":"tokens","key":["a"],"reserve":{}}`, 503)
	answer(g, none, `{"settle":{"hold":"x"}}`, 503)
	// A full registry refuses a reserve, and the hold it took goes back.
	full := &checkapi.Handler{Engine: h.Engine, Store: h.Store, Holds: &decide.Registry{Max: 1}}
	r := answer(g, full, `{"policy":"p","rule":"tokens","key":["b"],"reserve":{"prompt":1,"maxOutput":20}}`, 200)
	g.Expect(r.Hold.Units).To(Equal(int64(21)))
	answer(g, full, `{"policy":"p","rule":"tokens","key":["b"],"reserve":{"prompt":1,"maxOutput":20}}`, 503)
	// 979 are free only if it did: a request needing all of them (its prompt and a minimum
	// output of 10) fits.
	r = answer(g, h, `{"policy":"p","rule":"tokens","key":["b"],"reserve":{"prompt":969}}`, 200)
	g.Expect(r.Allowed).To(BeTrue(), "the refused reserve's hold did not go back")
	g.Expect(r.Hold.Units).To(Equal(int64(979)))
}

// TestReserveWithoutASizeUnderRefuse: a rule that refuses what it cannot size refuses a reserve
// that gives neither prompt nor maxOutput (400, naming the rule and the way out), by attributes
// or by hit, holds nothing, and counts it; a sized reserve goes on as before.
func TestReserveWithoutASizeUnderRefuse(t *testing.T) {
	g := NewWithT(t)
	rule := sidecartest.BudgetRule("tokens", "x-key", "FixedWindow", 1_000, 100, 10, policydoc.OnErrorUsed)
	rule.Cost.UnsizedBody = policydoc.UnsizedRefuse
	doc := sidecartest.DocumentRules("ns", "p", "web", rule)
	var reasons []string
	h := &checkapi.Handler{Engine: &decide.Engine{Limiter: sidecartest.Limiter(t)}, Store: sidecartest.StoreOf(t, doc), Holds: &decide.Registry{},
		OnUnsized: func(r *ruleset.Rule, reason string) { reasons = append(reasons, r.Name+" "+reason) }}

	for _, body := range []string{
		`{"method":"POST","path":"/v1/chat/completions","headers":{"X-Key":"a"},"reserve":{}}`,
		`{"policy":"p","rule":"tokens","key":["a"],"reserve":{}}`,
	} {
		rec := do(h, http.MethodPost, body)
		g.Expect(rec.Code).To(Equal(http.StatusBadRequest), body)
		g.Expect(rec.Body.String()).To(And(ContainSubstring("reserve without a size"), ContainSubstring("p/tokens"), ContainSubstring("unsizedBody: Hold")))
	}
	g.Expect(reasons).To(Equal([]string{"tokens reserve_without_size", "tokens reserve_without_size"}))
	// nothing was held: the whole budget is there for a sized reserve
	r := answer(g, h, `{"policy":"p","rule":"tokens","key":["a"],"reserve":{"prompt":100,"maxOutput":900}}`, 200)
	g.Expect(r.Allowed).To(BeTrue())
	g.Expect(r.Hold.Units).To(Equal(int64(1000)))
}
