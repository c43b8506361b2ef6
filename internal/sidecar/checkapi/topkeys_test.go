package checkapi_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	. "github.com/onsi/gomega"

	"github.com/redline-dev/redline/internal/keyscheme"
	"github.com/redline-dev/redline/internal/limiter"
	"github.com/redline-dev/redline/internal/policydoc"
	"github.com/redline-dev/redline/internal/sidecar/checkapi"
	"github.com/redline-dev/redline/internal/sidecar/decide"
	"github.com/redline-dev/redline/internal/sidecar/ruleset"
	"github.com/redline-dev/redline/internal/testutil/sidecartest"
)

// refuseOverThree refuses a key's fourth decision and later, per key, as a limit of 3 would.
type refuseOverThree struct {
	mu   sync.Mutex
	seen map[string]int
}

func (r *refuseOverThree) Allow(_ context.Context, key string, l limiter.Limit, _ int64) (limiter.Result, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.seen[key]++
	over := r.seen[key] > 3 && !strings.Contains(key, "%7Ecandidate") || r.seen[key] > 1 && strings.Contains(key, "%7Ecandidate")
	return limiter.Result{Allowed: !over || l.Shadow, OverLimit: over, Source: limiter.SourceRedis}, nil
}

func candidateStore(t *testing.T, reportValues bool) *ruleset.Store {
	t.Helper()
	_, data, err := policydoc.Build("ns", []policydoc.Policy{{Name: "p", Generation: 1, FailureMode: "Open", Rules: []policydoc.Rule{{
		Name: "r", Key: []policydoc.KeyPart{{Header: "x-key"}}, Algorithm: "FixedWindow", Requests: 3, WindowMS: 60000, Mode: "Enforce",
		Candidate: &policydoc.Candidate{Algorithm: "FixedWindow", Requests: 1, WindowMS: 60000}, ReportValues: reportValues,
	}}}}, map[string]string{})
	if err != nil {
		t.Fatal(err)
	}
	doc, err := policydoc.Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	set, err := ruleset.NewBuilder("").Build(doc, nil)
	if err != nil {
		t.Fatal(err)
	}
	s := &ruleset.Store{}
	s.Swap(set)
	return s
}

// /v1/check answers with the candidate's decision beside the rule's; /v1/topkeys shows who one
// sidecar refused, by value only where the rule reports values.
func TestCandidatesAndTopKeysFaces(t *testing.T) {
	for _, values := range []bool{false, true} {
		g := NewWithT(t)
		store := candidateStore(t, values)
		engine := &decide.Engine{Limiter: sidecartest.FakeLimiter{Decide: (&refuseOverThree{seen: map[string]int{}}).Allow}}
		check := &checkapi.Handler{Engine: engine, Store: store}
		var last checkapi.Response
		for range 5 {
			rec := httptest.NewRecorder()
			check.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, checkapi.Path, strings.NewReader(`{"policy":"p","rule":"r","key":["alice-secret"]}`)))
			g.Expect(rec.Code).To(Equal(200), rec.Body.String())
			g.Expect(json.Unmarshal(rec.Body.Bytes(), &last)).To(Succeed())
		}
		g.Expect(last.Allowed).To(BeFalse())
		g.Expect(last.Results).To(HaveLen(1))
		g.Expect(last.Candidates).To(ConsistOf(And(HaveField("Mode", "Candidate"), HaveField("OverLimit", true), HaveField("Allowed", true), HaveField("Limit", BeEquivalentTo(1)))))

		top := &checkapi.TopKeysHandler{Store: store}
		rec := httptest.NewRecorder()
		top.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, checkapi.TopKeysPath, nil))
		g.Expect(rec.Code).To(Equal(200))
		t.Logf("GET %s (values %v): %s", checkapi.TopKeysPath, values, rec.Body.String())
		var rules []checkapi.TopKeysRule
		g.Expect(json.Unmarshal(rec.Body.Bytes(), &rules)).To(Succeed())
		g.Expect(rules).To(HaveLen(2))
		hash := keyscheme.Hash(keyscheme.Key("ns", "p", "r", "alice-secret"))
		g.Expect(rules[0]).To(And(HaveField("Rule", "r"), HaveField("Candidate", false), HaveField("Decisions", BeEquivalentTo(5))))
		g.Expect(rules[0].Refused.Keys).To(ConsistOf(HaveField("Key", hash)))
		g.Expect(rules[0].Refused.Total).To(BeEquivalentTo(2))
		g.Expect(rules[1].Candidate).To(BeTrue())
		g.Expect(rules[1].Refused.Total).To(BeEquivalentTo(4))
		if values {
			g.Expect(rules[0].Refused.Keys[0].Value).To(Equal("alice-secret"))
		} else {
			g.Expect(rec.Body.String()).NotTo(ContainSubstring("alice-secret"), "a value without the opt-in")
		}
		rec = httptest.NewRecorder()
		top.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, checkapi.TopKeysPath, nil))
		g.Expect(rec.Code).To(Equal(http.StatusMethodNotAllowed))
	}
}
