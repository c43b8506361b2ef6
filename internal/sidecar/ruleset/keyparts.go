package ruleset

import (
	"fmt"
	"net/http"
	"net/textproto"
	"slices"

	"github.com/redline-dev/redline/internal/policydoc"
)

// keyParts are a rule's key parts as the document gives them, read under its match m (nil:
// none): a path or method part folds as the match does.
func keyParts(parts []policydoc.KeyPart, m *Match) ([]KeyPart, error) {
	var key []KeyPart
	for _, k := range parts {
		switch {
		case k.Header != "":
			key = append(key, KeyPart{Header: textproto.CanonicalMIMEHeaderKey(k.Header)})
		case k.Attribute != "":
			switch k.Attribute {
			case AttrRemoteAddress, AttrForwardedFor, AttrPath, AttrMethod:
			default:
				return nil, fmt.Errorf("unknown key attribute %q", k.Attribute)
			}
			part := KeyPart{Attribute: k.Attribute}
			if m != nil && m.Path != nil && k.Attribute == AttrPath {
				part.foldCase, part.trimSlash = m.Path.IgnoreCase, m.Path.IgnoreTrailingSlash
			}
			if m != nil && k.Attribute == AttrMethod {
				part.headAsGet = slices.Contains(m.Methods, http.MethodGet) && !slices.Contains(m.Methods, http.MethodHead)
			}
			key = append(key, part)
		default:
			key = append(key, KeyPart{Constant: k.Constant})
		}
	}
	return key, nil
}
