package checkapi_test

import (
	"fmt"
	"net/http"
	"strconv"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/redline-dev/redline/internal/policydoc"
	"github.com/redline-dev/redline/internal/sidecar/checkapi"
	"github.com/redline-dev/redline/internal/sidecar/decide"
	"github.com/redline-dev/redline/internal/testutil/sidecartest"
)

// bulkHandler serves the decision API with a real limiter on a real Redis, for a token budget
// "tokens" of 1000 an hour per key (holding 1 when unsized, minOutput 10, holds waiting
// timeout), and a hold registry of 64 with shares of 8.
func bulkHandler(t *testing.T, timeout time.Duration) *checkapi.Handler {
	t.Helper()
	rule := sidecartest.BudgetRule("tokens", "x-key", "FixedWindow", 1_000, 1, 10, policydoc.OnErrorUsed)
	rule.Cost.TimeoutMS = timeout.Milliseconds()
	// An hour's window: the test's counts do not start again at a minute's turn.
	rule.WindowMS = time.Hour.Milliseconds()
	doc := sidecartest.DocumentRules("ns", "p", "web", rule)
	return &checkapi.Handler{Engine: &decide.Engine{Limiter: sidecartest.Limiter(t)}, Store: sidecartest.StoreOf(t, doc),
		Holds: &decide.Registry{Max: 64, Share: 8}}
}

func reserveOnce(h http.Handler, key string) (int, http.Header) {
	rec := do(h, http.MethodPost, `{"policy":"p","rule":"tokens","key":["`+key+`"],"reserve":{}}`)
	return rec.Code, rec.Header()
}

// A key that reserves and never settles fills its share, not the registry: it is refused 429
// with a Retry-After while every other key still reserves, until the whole registry is full
// (503, with a Retry-After too).
func TestOneKeyCannotFillTheRegistryForOthers(t *testing.T) {
	g := NewWithT(t)
	h := bulkHandler(t, time.Minute)
	n := 0
	for ; ; n++ {
		code, hdr := reserveOnce(h, "hog")
		if code == http.StatusOK {
			continue
		}
		g.Expect(code).To(Equal(http.StatusTooManyRequests))
		secs, err := strconv.Atoi(hdr.Get("Retry-After"))
		g.Expect(err).NotTo(HaveOccurred())
		// The oldest of the key's holds ends a minute after it was taken, which may have
		// been a second or more ago on a busy machine.
		g.Expect(secs).To(BeNumerically("<=", 60), "the rule's holds wait a minute")
		g.Expect(secs).To(BeNumerically(">", 0), "the key may try again once its oldest hold ends")
		break
	}
	g.Expect(n).To(Equal(32), "one key alone takes half of the registry")
	rec := do(h, http.MethodPost, `{"policy":"p","rule":"tokens","key":["hog"],"reserve":{}}`)
	g.Expect(rec.Body.String()).To(ContainSubstring("this key has its share of open holds"))

	for i := range 4 {
		for j := range 8 {
			code, _ := reserveOnce(h, fmt.Sprintf("other-%d", i))
			g.Expect(code).To(Equal(http.StatusOK), "key other-%d, reserve %d", i, j)
		}
	}
	// 32 + 4*8: full, for every key.
	code, hdr := reserveOnce(h, "late-comer")
	g.Expect(code).To(Equal(http.StatusServiceUnavailable))
	g.Expect(hdr.Get("Retry-After")).NotTo(BeEmpty())
}

// Holds past their deadline count toward no bound of the registry, stay spent in the budget,
// and a late settle still charges what was used.
func TestExpiredHoldsLeaveRoomAndSettleLate(t *testing.T) {
	g := NewWithT(t)
	h := bulkHandler(t, time.Second)
	var ids []string
	for range 32 {
		r := answer(g, h, `{"policy":"p","rule":"tokens","key":["a"],"reserve":{}}`, http.StatusOK)
		ids = append(ids, r.Hold.ID)
	}
	code, _ := reserveOnce(h, "a")
	g.Expect(code).To(Equal(http.StatusTooManyRequests))
	// Wait for the holds' deadline (the rule's second): then the key has room again.
	g.Eventually(h.Holds.Open).WithTimeout(10 * time.Second).Should(BeZero())
	code, _ = reserveOnce(h, "a")
	g.Expect(code).To(Equal(http.StatusOK), "holds past their deadline still count")

	// A late settle of 500 charges the hold what it used, and the other 31 holds, never
	// settled, stay spent: 1000 less 500, 31 and the one open hold of 1 leaves 468. A request
	// needing 468 (458 and the minimum output of 10) fits, one needing 469 does not.
	r := answer(g, h, `{"settle":{"hold":"`+ids[0]+`","used":500}}`, http.StatusOK)
	g.Expect(r.Settled.Expired).To(BeTrue())
	r = answer(g, h, `{"policy":"p","rule":"tokens","key":["a"],"reserve":{"prompt":459}}`, http.StatusOK)
	g.Expect(r.Allowed).To(BeFalse(), "the late settle or the unsettled holds did not charge")
	r = answer(g, h, `{"policy":"p","rule":"tokens","key":["a"],"reserve":{"prompt":458}}`, http.StatusOK)
	g.Expect(r.Allowed).To(BeTrue())
}
