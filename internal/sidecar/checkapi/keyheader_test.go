package checkapi_test

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/redline-dev/redline/internal/sidecar/checkapi"
	"github.com/redline-dev/redline/internal/sidecar/decide"
	"github.com/redline-dev/redline/internal/testutil/sidecartest"
)

// A described request that carries its key header more than once, however the JSON says so
// (a list, two spellings of the name, the same name twice), is refused with 400 naming the
// header and counts nothing; a header no rule keys on may repeat.
func TestCheckRepeatedKeyHeader(t *testing.T) {
	g := NewWithT(t)
	doc := sidecartest.DocumentAlgorithm("ns", "p", "r", "web", 3, time.Minute, "x-api-key", "Open", "FixedWindow")
	h := &checkapi.Handler{Engine: &decide.Engine{Limiter: sidecartest.Limiter(t)}, Store: sidecartest.StoreOf(t, doc)}

	for _, headers := range []string{
		`{"X-API-Key":["mine","pad-1"]}`,
		`{"X-API-Key":"mine","x-api-key":"pad-2"}`,
		`{"X-API-Key":"mine","X-API-Key":"pad-3"}`,
		`{"X-API-Key":"mine","x-api-key":["pad-4"]}`,
	} {
		rec := do(h, http.MethodPost, `{"method":"GET","path":"/orders","headers":`+headers+`}`)
		g.Expect(rec.Code).To(Equal(http.StatusBadRequest), "%s: %s", headers, rec.Body.String())
		var body map[string]string
		g.Expect(json.Unmarshal(rec.Body.Bytes(), &body)).To(Succeed())
		g.Expect(body).To(Equal(map[string]string{"error": "repeated_key_header", "header": "X-Api-Key"}), headers)
	}

	// None of them was counted: the key has its whole limit of 3, a list of one included.
	admitted := 0
	for _, headers := range []string{`{"X-API-Key":"mine"}`, `{"x-api-key":["mine"]}`, `{"X-API-Key":"mine"}`, `{"X-API-Key":"mine"}`} {
		r := answer(g, h, `{"method":"GET","path":"/orders","headers":`+headers+`}`, http.StatusOK)
		if r.Allowed {
			admitted++
		}
	}
	g.Expect(admitted).To(Equal(3))

	r := answer(g, h, `{"method":"GET","path":"/orders","headers":{"X-API-Key":"other","Accept":["a","b"]}}`, http.StatusOK)
	g.Expect(r.Allowed).To(BeTrue(), "a repeated header no rule keys on")

	// Bad header values are the caller's mistake.
	for _, headers := range []string{`{"X-API-Key":1}`, `{"X-API-Key":[1]}`, `["X-API-Key"]`} {
		rec := do(h, http.MethodPost, `{"method":"GET","path":"/orders","headers":`+headers+`}`)
		g.Expect(rec.Code).To(Equal(http.StatusBadRequest), headers)
	}
}

// A reserve of a described request with a repeated key header takes no hold.
func TestReserveRepeatedKeyHeader(t *testing.T) {
	g := NewWithT(t)
	h := budgetHandler(t)
	rec := do(h, http.MethodPost, `{"method":"POST","path":"/v1/chat/completions","headers":{"X-Key":["a","b"]},"reserve":{"prompt":100}}`)
	g.Expect(rec.Code).To(Equal(http.StatusBadRequest), rec.Body.String())
	g.Expect(rec.Body.String()).To(ContainSubstring(`"header":"X-Key"`))
	g.Expect(h.Holds.Len()).To(Equal(0))
	// The budget is whole: a hold of all 1000 fits (990 and the rule's minOutput of 10).
	r := answer(g, h, `{"method":"POST","path":"/v1/chat/completions","headers":{"X-Key":"a"},"reserve":{"prompt":990}}`, http.StatusOK)
	g.Expect(r.Allowed).To(BeTrue())
	g.Expect(r.Hold.Units).To(Equal(int64(1000)))
}
