package decide_test

import (
	"errors"
	"testing"

	. "github.com/onsi/gomega"

	"github.com/redline-dev/redline/internal/policydoc"
	"github.com/redline-dev/redline/internal/sidecar/decide"
	"github.com/redline-dev/redline/internal/sidecar/reqpath"
	"github.com/redline-dev/redline/internal/sidecar/ruleset"
)

// pathVerdict is what becomes of a request for one path rule.
type pathVerdict string

const (
	counted pathVerdict = "counted"     // the rule matches
	passes  pathVerdict = "not counted" // the rule does not match
	refused pathVerdict = "refused 400" // the sidecar refuses the path before any rule
)

// pathSet is the rule set of one rule with this path match, as the sidecar loads it.
func pathSet(t *testing.T, m *policydoc.Match) *ruleset.Set {
	t.Helper()
	doc, _, err := policydoc.Build("ns", []policydoc.Policy{{Name: "p", FailureMode: "Open", Rules: []policydoc.Rule{{
		Name: "r", Match: m, Key: []policydoc.KeyPart{{Constant: "all"}}, Algorithm: "FixedWindow",
		Requests: 1, WindowMS: 60000, Mode: "Enforce",
	}}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	set, err := ruleset.NewBuilder("").Build(doc, nil)
	if err != nil {
		t.Fatal(err)
	}
	return set
}

// TestPathMatchesAsGatewayAPI: Gateway API's HTTPPathMatch cases (PathPrefix by path element,
// a trailing slash ignored in the value, Exact on the whole path, both case-sensitive), on the
// path as the proxy and the decision API see it: the raw request path normalised by reqpath,
// so that dot segments, merged slashes and escapes cannot take a request in or out of a rule.
func TestPathMatchesAsGatewayAPI(t *testing.T) {
	prefix := func(v string) *policydoc.Match { return &policydoc.Match{PathPrefix: v} }
	exact := func(v string) *policydoc.Match { return &policydoc.Match{ExactPath: v} }
	for _, tc := range []struct {
		match *policydoc.Match
		path  string // as sent on the wire
		want  pathVerdict
	}{
		// PathPrefix matches by element.
		{prefix("/abc"), "/abc", counted},
		{prefix("/abc"), "/abc/", counted},
		{prefix("/abc"), "/abc/def", counted},
		{prefix("/abc"), "/abcd", passes},
		{prefix("/abc"), "/abc-help", passes},
		{prefix("/abc"), "/ab", passes},
		{prefix("/abc"), "/", passes},
		{prefix("/abc/def"), "/abc/def/ghi", counted},
		{prefix("/abc/def"), "/abc/defg", passes},
		{prefix("/abc/def"), "/abc", passes},
		// A trailing slash in the value is ignored.
		{prefix("/abc/"), "/abc", counted},
		{prefix("/abc/"), "/abc/", counted},
		{prefix("/abc/"), "/abc/def", counted},
		{prefix("/abc/"), "/abcd", passes},
		// Several (a pathPrefix stored before the schema refused them).
		{prefix("/abc//"), "/abc", counted},
		// / matches every path.
		{prefix("/"), "/", counted},
		{prefix("/"), "/anything/at/all", counted},
		// Case-sensitive.
		{prefix("/login"), "/LOGIN", passes},
		{prefix("/login"), "/Login/x", passes},
		// Exact matches the whole path: a trailing slash makes another path.
		{exact("/abc"), "/abc", counted},
		{exact("/abc"), "/abc/", passes},
		{exact("/abc"), "/abc/def", passes},
		{exact("/abc"), "/abcd", passes},
		{exact("/abc"), "/Abc", passes},
		{exact("/abc/"), "/abc/", counted},
		{exact("/abc/"), "/abc", passes},
		{exact("/"), "/", counted},
		{exact("/"), "/a", passes},
		// Dot segments are removed before matching: neither into nor out of a rule.
		{prefix("/login"), "/login/../admin", passes},
		{prefix("/admin"), "/login/../admin", counted},
		{prefix("/admin"), "/./admin", counted},
		{prefix("/admin"), "/x/%2e%2e/admin/users", counted},
		{exact("/admin"), "/admin/.", passes}, // normalised to /admin/, another path for Exact
		{exact("/admin"), "/x/../admin", counted},
		{prefix("/admin"), "/../../admin", counted},
		// Merged slashes and decoded unreserved escapes.
		{prefix("/admin"), "//admin", counted},
		{exact("/admin/users"), "/admin//users", counted},
		{prefix("/login"), "/%6Cogin", counted},
		{prefix("/login"), "/%6cogin/x", counted},
		// Other escapes are compared decoded: the value is decoded by the compiler too.
		{exact("/a b"), "/a%20b", counted},
		{prefix("/caf\u00e9"), "/caf%C3%A9/menu", counted},
		// An encoded slash or a backslash is refused before any rule, so that no rule can be
		// dodged (or wrongly hit) by an application that decodes it into a separator.
		{prefix("/login"), "/login%2F..", refused},
		{prefix("/login"), "/login%2f..%2fadmin", refused},
		{prefix("/admin"), "/login%2F..%2Fadmin", refused},
		{prefix("/admin"), "/login/..%5Cadmin", refused},
		{prefix("/admin"), "/login\\..\\admin", refused},
	} {
		kind, value := "PathPrefix", tc.match.PathPrefix
		if tc.match.ExactPath != "" {
			kind, value = "Exact", tc.match.ExactPath
		}
		t.Run(kind+" "+value+" "+tc.path, func(t *testing.T) {
			g := NewWithT(t)
			set := pathSet(t, tc.match)
			got := passes
			_, decoded, err := reqpath.Normalize(tc.path)
			switch {
			case err != nil:
				g.Expect(errors.Is(err, reqpath.ErrAmbiguous)).To(BeTrue(), "%v", err)
				got = refused
			case (&decide.Engine{}).Explain(set, req("GET", decoded, "10.0.0.1:1"))[0].Matches:
				got = counted
			}
			g.Expect(got).To(Equal(tc.want), "%s %q, request %q (normalised %q)", kind, value, tc.path, decoded)
		})
	}
}
