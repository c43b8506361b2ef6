package reqpath

import (
	"errors"
	"net/url"
	"strings"
	"testing"
)

func TestNormalize(t *testing.T) {
	for _, tc := range []struct {
		in, norm, decoded string
		err               error
	}{
		{in: "/", norm: "/", decoded: "/"},
		{in: "/login", norm: "/login", decoded: "/login"},
		{in: "/login/", norm: "/login/", decoded: "/login/"},
		{in: "/./login", norm: "/login", decoded: "/login"},
		{in: "//login", norm: "/login", decoded: "/login"},
		{in: "///api//v1///login", norm: "/api/v1/login", decoded: "/api/v1/login"},
		{in: "/api/../login", norm: "/login", decoded: "/login"},
		{in: "/../../login", norm: "/login", decoded: "/login"},
		{in: "/a/b/..", norm: "/a/", decoded: "/a/"},
		{in: "/a/b/.", norm: "/a/b/", decoded: "/a/b/"},
		{in: "/a/..", norm: "/", decoded: "/"},
		{in: "/..", norm: "/", decoded: "/"},
		{in: "/login//", norm: "/login/", decoded: "/login/"},
		{in: "/%6Cogin", norm: "/login", decoded: "/login"},
		{in: "/%6cogin", norm: "/login", decoded: "/login"},
		{in: "/%2e/login", norm: "/login", decoded: "/login"},
		{in: "/api/%2E%2E/login", norm: "/login", decoded: "/login"},
		{in: "/a.b/c..d/...", norm: "/a.b/c..d/...", decoded: "/a.b/c..d/..."},
		{in: "/%7euser", norm: "/~user", decoded: "/~user"},
		{in: "/a%20b", norm: "/a%20b", decoded: "/a b"},
		{in: "/a%3bb", norm: "/a%3Bb", decoded: "/a;b"},
		{in: "/caf%C3%A9", norm: "/caf%C3%A9", decoded: "/café"},
		{in: "*", norm: "*", decoded: "*"},
		{in: "/api%2Flogin", err: ErrAmbiguous},
		{in: "/api%2flogin", err: ErrAmbiguous},
		{in: "/api%5Clogin", err: ErrAmbiguous},
		{in: "/api\\login", err: ErrAmbiguous},
		{in: "/login;jsessionid=1", err: ErrPathParameter},
		{in: "/login;", err: ErrPathParameter},
		{in: "/api;v=1/orders", err: ErrPathParameter},
		{in: "/bad%zz", err: ErrMalformed},
		{in: "/bad%4", err: ErrMalformed},
	} {
		norm, decoded, err := Normalize(tc.in)
		if tc.err != nil {
			if !errors.Is(err, tc.err) {
				t.Errorf("Normalize(%q) error %v, want %v", tc.in, err, tc.err)
			}
			continue
		}
		if err != nil || norm != tc.norm || decoded != tc.decoded {
			t.Errorf("Normalize(%q) = %q, %q, %v; want %q, %q", tc.in, norm, decoded, err, tc.norm, tc.decoded)
		}
	}
}

// The normal form is a fixed point, and what net/url makes of it as a path is the decoded
// form: the proxy forwards norm and the application reads decoded.
func FuzzNormalize(f *testing.F) {
	for _, s := range []string{"/", "/./a", "//a//b/", "/a/../..", "/%6C%2e%2E/x", "/a%20b/%3b"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		norm, decoded, err := Normalize(in)
		if err != nil {
			return
		}
		n2, d2, err := Normalize(norm)
		if err != nil || n2 != norm || d2 != decoded {
			t.Fatalf("Normalize(%q) = %q, %q; again: %q, %q, %v", in, norm, decoded, n2, d2, err)
		}
		if !strings.HasPrefix(norm, "/") || strings.ContainsAny(norm, "?#") {
			return // not a path as the wire carries it (the decision API takes any string)
		}
		u, err := url.Parse("http://h" + norm)
		if err != nil {
			return // raw bytes a wire path never carries (the decision API takes any string)
		}
		if u.Path != decoded {
			t.Fatalf("Normalize(%q) decoded %q, net/url reads %q", in, decoded, u.Path)
		}
	})
}
