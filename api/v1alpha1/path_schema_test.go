package v1alpha1_test

import (
	"context"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
)

var _ = Describe("match.path", func() {
	ctx := context.Background()

	DescribeTable("refuses what Gateway API's HTTPPathMatch refuses, saying what to write",
		func(match map[string]any, message string) {
			ns := newNamespace(ctx)
			err := k8s.Create(ctx, pathPolicy(ns, "p", match))
			Expect(apierrors.IsInvalid(err)).To(BeTrue(), "match %v: %v", match, err)
			Expect(err.Error()).To(ContainSubstring(message), "match %v", match)
		},
		Entry("relative", pathValue("", "api"), "match.path.value must be an absolute path starting with '/'"),
		Entry("empty", pathValue("", ""), "spec.rules[0].match.path.value"),
		Entry("too long", pathValue("", "/"+strings.Repeat("a", 1024)), "Too long: may not be more than 1024"),
		Entry("'//'", pathValue("", "/a//b"), "match.path.value must not contain '//'"),
		Entry("only '//'", pathValue("Exact", "//"), "match.path.value must not contain '//'"),
		Entry("'/./'", pathValue("", "/a/./b"), "must not contain a '.' segment"),
		Entry("leading '/./'", pathValue("", "/./a"), "must not contain a '.' segment"),
		Entry("trailing '/.'", pathValue("Exact", "/a/."), "must not contain a '.' segment"),
		Entry("'/../'", pathValue("", "/a/../b"), "must not contain a '..' segment"),
		Entry("trailing '/..'", pathValue("", "/a/.."), "must not contain a '..' segment"),
		Entry("'%2f'", pathValue("", "/a%2fb"), "must not contain an encoded slash"),
		Entry("'%2F'", pathValue("Exact", "/a%2Fb"), "must not contain an encoded slash"),
		Entry("'#'", pathValue("", "/a#b"), "match.path.value must not contain '#'"),
		Entry("a space", pathValue("", "/a b"), "write a space as %20"),
		Entry("a query", pathValue("", "/a?b=1"), "match.path.value may contain only"),
		Entry("a backslash", pathValue("", "/a\\b"), "match.path.value may contain only"),
		Entry("a bad escape", pathValue("", "/a%zz"), "percent-escapes of two hex digits"),
		Entry("non-ASCII", pathValue("", "/caf\u00e9"), "match.path.value may contain only"),
		Entry("an unknown type", pathValue("RegularExpression", "/a"), `supported values: "PathPrefix", "Exact"`),
		Entry("no value", map[string]any{"path": map[string]any{"type": "Exact"}}, "spec.rules[0].match.path.value: Required value"),
		Entry("path and pathPrefix", map[string]any{"path": map[string]any{"value": "/a"}, "pathPrefix": "/a"},
			"match.path and match.pathPrefix are mutually exclusive"),
		Entry("trailingSlash Ignore on a prefix", map[string]any{"path": map[string]any{"value": "/a", "trailingSlash": "Ignore"}},
			"match.path.trailingSlash: Ignore needs type: Exact"),
		Entry("an unknown trailingSlash", map[string]any{"path": map[string]any{"type": "Exact", "value": "/a", "trailingSlash": "Maybe"}},
			`supported values: "Strict", "Ignore"`),
	)
})
