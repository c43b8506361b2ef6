package checkapi_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/redline-dev/redline/internal/limiter"
	"github.com/redline-dev/redline/internal/sidecar/checkapi"
	"github.com/redline-dev/redline/internal/sidecar/decide"
	"github.com/redline-dev/redline/internal/sidecar/ruleset"
	"github.com/redline-dev/redline/internal/testutil/sidecartest"
)

type admitAll struct{}

func (admitAll) Allow(_ context.Context, _ string, l limiter.Limit, _ int64) (limiter.Result, error) {
	return limiter.Result{Allowed: true, Remaining: l.Requests - 1, ResetAfter: l.Window, Source: limiter.SourceRedis}, nil
}

func handler(t testing.TB) *checkapi.Handler {
	return &checkapi.Handler{Engine: &decide.Engine{Limiter: sidecartest.FakeLimiter{Decide: admitAll{}.Allow}}, Store: sidecartest.Store(t, 10, time.Minute)}
}

func do(h http.Handler, method, body string) *httptest.ResponseRecorder {
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(method, checkapi.Path, strings.NewReader(body)))
	return rec
}

func TestCheckRequests(t *testing.T) {
	g := NewWithT(t)
	h := handler(t)
	for _, c := range []struct {
		body   string
		status int
		want   string
	}{
		{`{"policy":"p","rule":"r","key":["a"]}`, 200, `"allowed":true`},
		{`{"hits":[{"policy":"p","rule":"r","key":["a"]}],"cost":3}`, 200, `"remaining":9`},
		{`{"method":"get","path":"/x?y","headers":{"X-KEY":"a"}}`, 200, `"rule":"r"`},
		{`{"method":"GET","path":"/x"}`, 200, `"results":[{`},
		{`{"policy":"p","rule":"nope"}`, 400, "not enforced"},
		{`{"policy":"p","rule":"r","method":"GET"}`, 400, "not both"},
		{`{"path":"/"}`, 400, "needs method and path"},
		{`{"bogus":1}`, 400, "unknown field"},
		{`{"policy":"p","rule":"r","cost":-1}`, 400, "cost -1: want 1-1000000000"},
		{`{"policy":"p","rule":"r","cost":1000000001}`, 400, "want 1-1000000000"},
		{`{"policy":"p","rule":"r","cost":9223372036854775808}`, 400, "decoding check request"},
		{`{"policy":"p","rule":"r","cost":1.5}`, 400, "decoding check request"},
		{`{"policy":"p","rule":"r"} {"policy":"p","rule":"r"}`, 400, "data after the JSON object"},
		{`{"policy":"p","rule":"r"}]`, 400, "data after the JSON object"},
		{`{"policy":"p","rule":"r"}` + "\n\t ", 200, `"allowed":true`},
		{`{"hits":[` + strings.Repeat(`{"policy":"p","rule":"r"},`, 32) + `{"policy":"p","rule":"r"}]}`, 400, "33 hits: at most 32"},
		{`{"policy":"p","rule":"r","hits":[` + strings.Repeat(`{"policy":"p","rule":"r"},`, 31) + `{"policy":"p","rule":"r"}]}`, 400, "at most 32"},
		{`{"hits":[` + strings.Repeat(`{"policy":"p","rule":"r"},`, 31) + `{"policy":"p","rule":"r"}]}`, 200, `"allowed":true`},
		{`{"policy":"p","rule":"r","key":[` + strings.Repeat(`"a",`, 16) + `"a"]}`, 400, "key has 17 parts"},
		{`{"policy":"p","rule":"r","key":"` + strings.Repeat("a", checkapi.MaxBodyBytes) + `"}`, 400, "over 65536 bytes"},
	} {
		rec := do(h, http.MethodPost, c.body)
		g.Expect(rec.Code).To(Equal(c.status), c.body)
		g.Expect(rec.Body.String()).To(ContainSubstring(c.want), c.body)
	}
	g.Expect(do(h, http.MethodGet, "").Code).To(Equal(http.StatusMethodNotAllowed))

	var resp checkapi.Response
	g.Expect(json.Unmarshal(do(h, http.MethodPost, `{"policy":"p","rule":"r","key":["a"]}`).Body.Bytes(), &resp)).To(Succeed())
	g.Expect(resp.Headers).To(Equal(map[string]string{"RateLimit-Policy": `"p/r";q=10;w=60`, "RateLimit": `"p/r";r=9;t=60`}))

	empty := &checkapi.Handler{Engine: h.Engine, Store: &ruleset.Store{}}
	g.Expect(do(empty, http.MethodPost, `{"policy":"p","rule":"r"}`).Code).To(Equal(http.StatusServiceUnavailable))
}

// BenchmarkCheckHandler is the API's own cost per decision, without HTTP transport or Redis.
func BenchmarkCheckHandler(b *testing.B) {
	h := handler(b)
	b.ReportAllocs()
	for b.Loop() {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, checkapi.Path, strings.NewReader(`{"policy":"p","rule":"r","key":["abc"]}`)))
	}
}

// FuzzDecode feeds the decoder arbitrary bodies (seeds under testdata/fuzz/FuzzDecode). What it
// accepts is one object within every bound, and it accepts the same object encoded again.
func FuzzDecode(f *testing.F) {
	for _, s := range []string{
		`{"policy":"p","rule":"r","key":["a"]}`,
		`{"hits":[{"policy":"p","rule":"r","key":["a","b"]}],"cost":3}`,
		`{"method":"GET","path":"/x?y","headers":{"X-Key":"a"},"remoteAddress":"10.0.0.1:5"}`,
		`{"policy":"p","rule":"r"} {}`,
		`{"cost":-1}`,
		`{"cost":1e3}`,
		`{"key":null,"hits":null}`,
		"\xef\xbb\xbf{}",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		req, err := checkapi.Decode(bytes.NewReader(body))
		if err != nil {
			return
		}
		if req.Cost < 0 || req.Cost > checkapi.MaxCost || len(req.Hits) > checkapi.MaxHits ||
			len(req.Key) > checkapi.MaxKeyParts || headerFields(req.Headers) > checkapi.MaxHeaders {
			t.Fatalf("accepted out of bounds: %+v", req)
		}
		for _, h := range req.Hits {
			if len(h.Key) > checkapi.MaxKeyParts {
				t.Fatalf("accepted a hit of %d key parts", len(h.Key))
			}
		}
		again, err := json.Marshal(req)
		if err != nil {
			t.Fatalf("encoding what was accepted: %v", err)
		}
		if _, err := checkapi.Decode(bytes.NewReader(again)); err != nil {
			t.Fatalf("refused its own encoding %s: %v", again, err)
		}
	})
}

// The decision API matches a described path in the normal form the proxy matches and forwards.
func TestCheckNormalisesThePath(t *testing.T) {
	g := NewWithT(t)
	h := &checkapi.Handler{Engine: &decide.Engine{Limiter: sidecartest.FakeLimiter{Decide: admitAll{}.Allow}},
		Store: sidecartest.StoreOf(t, sidecartest.DocumentPathPrefix("ns", "p", "r", "web", 10, time.Minute, "x-key", "/login"))}
	for _, c := range []struct {
		path    string
		status  int
		matches bool
	}{
		{"/login", 200, true},
		{"/./login", 200, true},
		{"//login", 200, true},
		{"/x/../login?a=b", 200, true},
		{"/%6Cogin", 200, true},
		{"/logout", 200, false},
		{"/login/x", 200, true},
		{"/login-help", 200, false},
		{"/LOGIN", 200, false},
		{"/x%2F../login", 400, false},
		{"/login;jsessionid=1", 400, false},
		{"/bad%zz", 400, false},
	} {
		rec := do(h, http.MethodPost, `{"method":"POST","path":"`+c.path+`"}`)
		g.Expect(rec.Code).To(Equal(c.status), c.path)
		if c.status != 200 {
			continue
		}
		var resp checkapi.Response
		g.Expect(json.Unmarshal(rec.Body.Bytes(), &resp)).To(Succeed())
		g.Expect(resp.Results).To(HaveLen(map[bool]int{true: 1, false: 0}[c.matches]), c.path)
	}
}

// headerFields is how many header fields h carries.
func headerFields(h checkapi.Headers) int {
	n := 0
	for _, v := range h {
		n += max(len(v), 1)
	}
	return n
}
