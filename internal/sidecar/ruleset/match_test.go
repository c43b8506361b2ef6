package ruleset_test

import (
	"net/http"
	"testing"

	"github.com/redline-dev/redline/internal/policydoc"
	"github.com/redline-dev/redline/internal/sidecar/ruleset"
)

// matchOf builds the rule of a document with match m and returns its compiled Match.
func matchOf(t *testing.T, m *policydoc.Match) *ruleset.Match {
	t.Helper()
	doc := &policydoc.Document{Namespace: "ns", Policies: []policydoc.Policy{{
		Name: "p", FailureMode: "Open",
		Rules: []policydoc.Rule{{
			Name: "r", Match: m, Key: []policydoc.KeyPart{{Constant: "k"}},
			Algorithm: "FixedWindow", Requests: 1, WindowMS: 60000, Mode: "Enforce",
		}},
	}}}
	s, err := ruleset.NewBuilder("").Build(doc, nil)
	if err != nil {
		t.Fatal(err)
	}
	return s.Rules[0].Match
}

func TestPathMatchOptions(t *testing.T) {
	for _, tc := range []struct {
		name  string
		match policydoc.Match
		yes   []string
		no    []string
	}{
		{"exact", policydoc.Match{ExactPath: "/login"},
			[]string{"/login"}, []string{"/login/", "/Login", "/LOGIN/", "/login/x", "/logins", "/"}},
		{"exact ignoring case", policydoc.Match{ExactPath: "/login", IgnoreCase: true},
			[]string{"/login", "/Login", "/LOGIN"}, []string{"/login/", "/LOGIN/", "/logins", "/log"}},
		{"exact ignoring a trailing slash", policydoc.Match{ExactPath: "/login", IgnoreTrailingSlash: true},
			[]string{"/login", "/login/"}, []string{"/Login", "/login//", "/login/x", "/logins"}},
		{"exact ignoring both", policydoc.Match{ExactPath: "/login", IgnoreCase: true, IgnoreTrailingSlash: true},
			[]string{"/login", "/LOGIN/", "/LoGiN"}, []string{"/login/x", "/logins", "/"}},
		{"exact root ignoring a trailing slash", policydoc.Match{ExactPath: "/", IgnoreTrailingSlash: true},
			[]string{"/"}, []string{"/x"}},
		{"prefix", policydoc.Match{PathPrefix: "/api/v1/orders"},
			[]string{"/api/v1/orders", "/api/v1/orders/", "/api/v1/orders/7"}, []string{"/API/v1/orders", "/api/v1/ordersx"}},
		{"prefix ignoring case", policydoc.Match{PathPrefix: "/api/v1/orders", IgnoreCase: true},
			[]string{"/API/V1/Orders", "/api/v1/ORDERS/7", "/api/v1/orders"}, []string{"/API/v1/ordersx", "/api/v2/orders"}},
		{"prefix ignoring case, beyond ASCII", policydoc.Match{PathPrefix: "/café", IgnoreCase: true},
			[]string{"/CAFÉ/x", "/Café"}, []string{"/cafe", "/caf"}},
		{"prefix ignoring case, a fold of another length", policydoc.Match{PathPrefix: "/k", IgnoreCase: true},
			[]string{"/\u212a/x", "/K"}, []string{"/\u212ax"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := matchOf(t, &tc.match)
			for _, p := range tc.yes {
				if !m.Matches(http.MethodGet, p, nil) {
					t.Errorf("%s does not match", p)
				}
			}
			for _, p := range tc.no {
				if m.Matches(http.MethodGet, p, nil) {
					t.Errorf("%s matches", p)
				}
			}
		})
	}
}

// A rule's GET counts HEAD, which routers serve with the GET handler, and methods compare
// case-insensitively, so that a lower-case method a server routes cannot pass uncounted.
func TestMethodMatch(t *testing.T) {
	get := matchOf(t, &policydoc.Match{Methods: []string{"GET"}})
	post := matchOf(t, &policydoc.Match{Methods: []string{"POST"}})
	head := matchOf(t, &policydoc.Match{Methods: []string{"HEAD"}})
	for _, tc := range []struct {
		m      *ruleset.Match
		method string
		want   bool
	}{
		{get, "GET", true}, {get, "HEAD", true}, {get, "get", true}, {get, "head", true}, {get, "Get", true},
		{get, "POST", false}, {get, "OPTIONS", false}, {get, "GETS", false},
		{post, "POST", true}, {post, "post", true}, {post, "GET", false}, {post, "HEAD", false},
		{head, "HEAD", true}, {head, "GET", false},
	} {
		if got := tc.m.Matches(tc.method, "/", nil); got != tc.want {
			t.Errorf("methods %v, request %s: matched %v, want %v", tc.m.Methods, tc.method, got, tc.want)
		}
	}
}

// A Path key part of a rule that ignores case or a trailing slash gives every path the rule
// matches as one spelling the same key value, and one a Method key part of a GET rule gives
// HEAD and GET.
func TestKeyAttributeValuesFollowTheMatch(t *testing.T) {
	build := func(m *policydoc.Match, attr string) ruleset.KeyPart {
		doc := &policydoc.Document{Namespace: "ns", Policies: []policydoc.Policy{{
			Name: "p", FailureMode: "Open",
			Rules: []policydoc.Rule{{
				Name: "r", Match: m, Key: []policydoc.KeyPart{{Attribute: attr}},
				Algorithm: "FixedWindow", Requests: 1, WindowMS: 60000, Mode: "Enforce",
			}},
		}}}
		s, err := ruleset.NewBuilder("").Build(doc, nil)
		if err != nil {
			t.Fatal(err)
		}
		return s.Rules[0].Key[0]
	}
	same := func(k ruleset.KeyPart, vals ...string) {
		t.Helper()
		for _, v := range vals {
			if k.AttributeValue(v) != k.AttributeValue(vals[0]) {
				t.Errorf("%q keyed %q, %q keyed %q", v, k.AttributeValue(v), vals[0], k.AttributeValue(vals[0]))
			}
		}
	}
	differ := func(k ruleset.KeyPart, a, b string) {
		t.Helper()
		if k.AttributeValue(a) == k.AttributeValue(b) {
			t.Errorf("%q and %q share a key", a, b)
		}
	}
	exact := build(&policydoc.Match{ExactPath: "/login", IgnoreCase: true, IgnoreTrailingSlash: true}, "Path")
	same(exact, "/login", "/LOGIN", "/Login/", "/login/")
	prefix := build(&policydoc.Match{PathPrefix: "/k", IgnoreCase: true}, "Path")
	same(prefix, "/k/a", "/K/A", "/\u212a/a") // KELVIN SIGN folds to k, as the match compares it
	differ(prefix, "/k/a", "/k/a/")
	strict := build(&policydoc.Match{ExactPath: "/login"}, "Path")
	differ(strict, "/login", "/LOGIN")
	get := build(&policydoc.Match{Methods: []string{"GET"}}, "Method")
	same(get, "GET", "HEAD")
	both := build(&policydoc.Match{Methods: []string{"GET", "HEAD"}}, "Method")
	differ(both, "GET", "HEAD")
}
