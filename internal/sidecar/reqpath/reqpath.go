// Package reqpath normalises a request path the way the sidecar matches and forwards it, so
// that a request can never be matched as one path and routed by the application as another:
// `/./login`, `//login`, `/api/../login` and `/%6Cogin` are all `/login`, for the rule matcher,
// for the `path` key part and for the application behind the proxy.
//
// The normalisation is Envoy's `normalize_path` (RFC 3986 section 6.2.2) with `merge_slashes`,
// which is Istio's MERGE_SLASHES:
//
//   - percent-encoded unreserved characters (ALPHA, DIGIT, "-", ".", "_", "~") are decoded, and
//     the hex digits of every other escape are upper-cased (RFC 3986 section 6.2.2.1-2);
//   - "." and ".." segments are removed (section 5.2.4), an encoded dot counting as a dot; ".."
//     never climbs above the root; a path that ended in a dot segment keeps its trailing slash;
//   - runs of slashes become one.
//
// An encoded slash (%2F) or backslash (%5C), or a raw backslash, is refused (Envoy's
// path_with_escaped_slashes_action REJECT_REQUEST): whether an application decodes them into
// separators is the application's choice, so no single normalisation can agree with every
// application about which segments such a path has.
//
// A raw ";" is refused too: Tomcat, Jetty, Spring, Undertow and others strip a segment's path
// parameters (`/login;jsessionid=1` is routed as `/login`), most other routers keep them as
// part of the segment, so no single normal form agrees with every application about which
// path such a request names. An encoded ";" (%3B) is data in every router and is kept.
package reqpath

import (
	"errors"
	"net/url"
	"strings"
)

// ErrAmbiguous is wrapped by the error for a path with an encoded slash or a backslash.
var ErrAmbiguous = errors.New("path has an encoded slash or a backslash, which applications route differently")

// ErrPathParameter is wrapped by the error for a path with a raw ";" (a path parameter).
var ErrPathParameter = errors.New("path has a ';' (a path parameter), which applications route differently")

// ErrMalformed is wrapped by the error for a path that is not a valid escaped path.
var ErrMalformed = errors.New("malformed path")

// Normalize returns the normal form of escaped, a request path as sent on the wire (Go's
// url.URL.EscapedPath), both escaped (to forward) and decoded (to match; it is what
// url.URL.Path of the forwarded request is). A path that does not start with "/" (the "*" of
// OPTIONS) is returned unchanged.
func Normalize(escaped string) (norm, decoded string, err error) {
	if !strings.HasPrefix(escaped, "/") {
		d, err := url.PathUnescape(escaped)
		if err != nil {
			return "", "", errors.Join(ErrMalformed, err)
		}
		return escaped, d, nil
	}
	segs := make([]string, 0, strings.Count(escaped, "/"))
	trailing := false
	var seg strings.Builder
	flush := func(last bool) {
		s := seg.String()
		seg.Reset()
		switch s {
		case "", ".":
			trailing = last
		case "..":
			if len(segs) > 0 {
				segs = segs[:len(segs)-1]
			}
			trailing = last
		default:
			segs = append(segs, s)
			trailing = false
		}
	}
	for i := 1; i < len(escaped); i++ {
		c := escaped[i]
		switch c {
		case '/':
			flush(false)
			trailing = true
		case '\\':
			return "", "", ErrAmbiguous
		case ';':
			return "", "", ErrPathParameter
		case '%':
			if i+2 >= len(escaped) || !isHex(escaped[i+1]) || !isHex(escaped[i+2]) {
				return "", "", errors.Join(ErrMalformed, errors.New("a % not followed by two hex digits"))
			}
			b := unhex(escaped[i+1])<<4 | unhex(escaped[i+2])
			i += 2
			switch {
			case b == '/' || b == '\\':
				return "", "", ErrAmbiguous
			case isUnreserved(b):
				seg.WriteByte(b)
			default:
				seg.WriteByte('%')
				seg.WriteByte(upperHex[b>>4])
				seg.WriteByte(upperHex[b&15])
			}
		default:
			seg.WriteByte(c)
		}
	}
	if seg.Len() > 0 || !trailing {
		flush(true)
	}
	norm = "/" + strings.Join(segs, "/")
	if trailing && len(segs) > 0 {
		norm += "/"
	}
	decoded, err = url.PathUnescape(norm)
	if err != nil { // cannot happen: every escape left is two hex digits
		return "", "", errors.Join(ErrMalformed, err)
	}
	return norm, decoded, nil
}

const upperHex = "0123456789ABCDEF"

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func unhex(c byte) byte {
	switch {
	case c <= '9':
		return c - '0'
	case c >= 'a':
		return c - 'a' + 10
	default:
		return c - 'A' + 10
	}
}

// isUnreserved is RFC 3986's unreserved set.
func isUnreserved(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '.' || c == '_' || c == '~'
}
