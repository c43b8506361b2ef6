package decide

import (
	"net/http"
	"strconv"
	"time"
)

// Header field names (draft-ietf-httpapi-ratelimit-headers).
const (
	HeaderPolicy     = "RateLimit-Policy"
	HeaderRateLimit  = "RateLimit"
	HeaderRetryAfter = "Retry-After"
)

// Fields are the rate limit header fields of a decision, ready to send. Empty fields are not
// sent.
type Fields struct {
	// Policy lists every Enforce rule that matched: "<policy>/<rule>";q=<requests>;w=<seconds>.
	Policy string
	// RateLimit lists their state: "<policy>/<rule>";r=<remaining>;t=<seconds to reset>.
	RateLimit string
	// RetryAfter is whole seconds, rounded up, when the request was refused.
	RetryAfter string
}

// Fields renders the decision's header fields, in the current draft's structured-field syntax.
// Shadow rules are left out: they do not limit the client. So are, on an admitted request, the
// rules of policies that publish their limits on refusal only.
func (d *Decision) Fields() Fields {
	var f Fields
	var pol, rl []byte
	for i := range d.Outcomes {
		o := &d.Outcomes[i]
		if o.Rule.Shadow || d.Refused == nil && o.Rule.Policy.HeadersOnRefusal {
			continue
		}
		if len(pol) > 0 {
			pol = append(pol, ", "...)
			rl = append(rl, ", "...)
		}
		pol = appendSFString(pol, o.Rule.ID)
		pol = append(pol, ";q="...)
		pol = strconv.AppendInt(pol, o.Rule.Limit.Requests, 10)
		pol = append(pol, ";w="...)
		pol = strconv.AppendInt(pol, WindowSeconds(o), 10)

		rl = appendSFString(rl, o.Rule.ID)
		rl = append(rl, ";r="...)
		rl = strconv.AppendInt(rl, max(o.Result.Remaining, 0), 10)
		rl = append(rl, ";t="...)
		rl = strconv.AppendInt(rl, CeilSeconds(o.Result.ResetAfter), 10)
	}
	f.Policy, f.RateLimit = string(pol), string(rl)
	if d.Refused != nil && d.Refused.Result.RetryAfter >= 0 {
		f.RetryAfter = strconv.FormatInt(max(CeilSeconds(d.Refused.Result.RetryAfter), 1), 10)
	}
	return f
}

// Write sets the non-empty fields on h.
func (f Fields) Write(h http.Header) {
	if f.Policy != "" {
		h[HeaderPolicy] = []string{f.Policy}
		h[HeaderRateLimit] = []string{f.RateLimit}
	}
	if f.RetryAfter != "" {
		h[HeaderRetryAfter] = []string{f.RetryAfter}
	}
}

// RetryAfterSeconds is the refusal's retry-after in whole seconds rounded up (at least 1), or
// -1 when the cost can never be admitted, or 0 when the request was admitted.
func (d *Decision) RetryAfterSeconds() int64 {
	if d.Refused == nil {
		return 0
	}
	if d.Refused.Result.RetryAfter < 0 {
		return -1
	}
	return max(CeilSeconds(d.Refused.Result.RetryAfter), 1)
}

// CeilSeconds rounds a duration up to whole seconds; negative durations give 0.
func CeilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	s := int64(d / time.Second)
	if d%time.Second != 0 {
		s++
	}
	return s
}

// appendSFString appends s as a structured-field String (RFC 9651): quoted, with '"' and '\'
// escaped; bytes outside printable ASCII, which a String cannot hold, become '?'.
func appendSFString(b []byte, s string) []byte {
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			b = append(b, '\\', c)
		case c < 0x20 || c > 0x7e:
			b = append(b, '?')
		default:
			b = append(b, c)
		}
	}
	return append(b, '"')
}

// WindowSeconds is the window of o in whole seconds rounded up: its rule's, or the length of the
// calendar period it was decided in (a 23-hour day, a 29-day month) when the decision says.
func WindowSeconds(o *Outcome) int64 {
	if o.Result.Period > 0 {
		return CeilSeconds(o.Result.Period)
	}
	return o.Rule.WindowSeconds
}
